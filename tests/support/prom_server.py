"""A real Prometheus server for tests (Debian's ``prometheus`` package), scraping given targets.

Started with a throw-away TSDB directory on 127.0.0.1 and a free port; ready when ``/-/ready``
answers. Tests that need it fail with a clear message when the binary is missing — CI installs
it (``.ci/run``); it is never silently skipped.
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path
from types import TracebackType
from typing import Self

__all__ = ["PrometheusServer"]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class PrometheusServer:
    """``prometheus`` scraping ``targets`` (``host:port`` list) every ``scrape_interval``."""

    def __init__(self, workdir: Path, targets: list[str], *, scrape_interval: str = "1s") -> None:
        binary = shutil.which("prometheus")
        if binary is None:
            raise RuntimeError(
                "the prometheus binary is not installed: apt-get install -y prometheus"
            )
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = workdir / "prometheus.yml"
        config.write_text(
            "global:\n"
            f"  scrape_interval: {scrape_interval}\n"
            f"  evaluation_interval: {scrape_interval}\n"
            "scrape_configs:\n"
            "  - job_name: test\n"
            f"    static_configs: [{{targets: {targets!r}}}]\n"
        )
        self._log = open(workdir / "prometheus.log", "wb")  # noqa: SIM115 - closed in stop()
        self._process = subprocess.Popen(
            [
                binary,
                f"--config.file={config}",
                f"--storage.tsdb.path={workdir / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
            ],
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=1) as response:
                    if response.status == 200:
                        break
            except OSError:
                pass
            if self._process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"prometheus did not start; see {workdir / 'prometheus.log'}")
            time.sleep(0.1)

    def samples(self, selector: str, window: str = "1m") -> int:
        """How many samples of ``selector`` the server holds over the last ``window``."""
        query = urllib.parse.urlencode({"query": f"max(count_over_time({selector}[{window}]))"})
        with urllib.request.urlopen(f"{self.url}/api/v1/query?{query}", timeout=5) as response:
            result = json.load(response)["data"]["result"]
        return int(float(result[0]["value"][1])) if result else 0

    def stop(self) -> None:
        self._process.terminate()
        try:
            self._process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._process.kill()
        self._log.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
