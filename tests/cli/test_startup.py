"""Start-up stays cheap: the CLI loads without the Kubernetes client or the process wiring."""

from __future__ import annotations

import subprocess
import sys


def test_loading_the_cli_imports_no_kubernetes_client() -> None:
    """`ebbtide --version` and `policy validate` load controller.cli; kubernetes_asyncio (~860
    modules, half a second) and controller.process.app are imported only by the commands that use
    them."""
    probe = (
        "import sys; import controller.cli; "
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'kubernetes_asyncio'}), "
        "'controller.process.app' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60
    ).stdout
    assert out.strip() == "[] False"
