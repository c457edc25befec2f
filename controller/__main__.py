"""``python -m controller`` is ``ebbtide``."""

from controller.cli import main

main()
