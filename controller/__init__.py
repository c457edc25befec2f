"""The shell: the ``ebbtide`` CLI, process wiring, cluster adapters, actuation, observability."""
