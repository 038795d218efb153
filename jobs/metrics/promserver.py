"""A throwaway Prometheus server on loopback: start over a TSDB directory, wait until ready, stop.

Used by `evaluate_diagnosis` (and usable by tests: tests/prom_server.py holds the same class). Typical use::

    backfill(openmetrics_path, tsdb_dir)            # jobs.simulate: promtool writes blocks
    with PrometheusProcess(tsdb_dir) as prom:
        client = PrometheusClient(prom.url, timeout_s=5, retries=0, backoff_s=0)

Blocks written by promtool before start-up are loaded when Prometheus opens the directory; data older
than the retention window would be deleted at start, so retention is set to ten years.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import TracebackType

# No scrape jobs: the tests only read backfilled blocks, and a self-scrape would add series to the head.
_MINIMAL_CONFIG = "global:\n  scrape_interval: 15s\n  evaluation_interval: 15s\nscrape_configs: []\n"


def prometheus_binary() -> str | None:
    """Path of the prometheus binary on PATH (or $PROMETHEUS_BIN), None when not installed."""
    return os.environ.get("PROMETHEUS_BIN") or shutil.which("prometheus")


def free_port() -> int:
    """A TCP port that was free on 127.0.0.1 a moment ago (the small race is acceptable in tests)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class PrometheusStartError(RuntimeError):
    """Prometheus exited or did not become ready in time; the message carries its log tail."""


#: Flags that open Prometheus' write APIs over HTTP (/-/quit, /-/reload, /api/v1/admin/tsdb/...).
FORBIDDEN_FLAGS = ("--web.enable-lifecycle", "--web.enable-admin-api")


class PrometheusProcess:
    """Context manager running `prometheus` over `tsdb_dir` on a free loopback port.

    `url` is the base URL once started. Extra command-line flags may be passed in `extra_args`, except
    the HTTP APIs that change the server (FORBIDDEN_FLAGS): any local process, a webhook receiver URL
    included, could then shut Prometheus down (`/-/quit`) or delete its series (issue 23). Tests restart
    the process instead of reloading it.
    """

    def __init__(
        self,
        tsdb_dir: str | os.PathLike[str],
        *,
        binary: str | None = None,
        ready_timeout_s: float = 30.0,
        extra_args: tuple[str, ...] = (),
    ) -> None:
        self.tsdb_dir = Path(tsdb_dir)
        self.binary = binary or prometheus_binary()
        self.ready_timeout_s = ready_timeout_s
        forbidden = [a for a in extra_args if a.split("=", 1)[0] in FORBIDDEN_FLAGS]
        if forbidden:
            raise ValueError(f"{', '.join(forbidden)}: the lifecycle and admin APIs stay off (issue 23)")
        self.extra_args = extra_args
        self.port = 0
        self.url = ""
        self._proc: subprocess.Popen[bytes] | None = None
        self._workdir: tempfile.TemporaryDirectory[str] | None = None
        self._log_path: Path | None = None

    def start(self) -> PrometheusProcess:
        """Start the server and block until /-/ready answers 200 (raises PrometheusStartError)."""
        if self.binary is None:
            raise PrometheusStartError("prometheus binary not found on PATH")
        self.tsdb_dir.mkdir(parents=True, exist_ok=True)
        self._workdir = tempfile.TemporaryDirectory(prefix="prom-cfg-")
        config = Path(self._workdir.name) / "prometheus.yml"
        config.write_text(_MINIMAL_CONFIG)
        self._log_path = Path(self._workdir.name) / "prometheus.log"
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        args = [
            self.binary,
            f"--config.file={config}",
            f"--storage.tsdb.path={self.tsdb_dir}",
            f"--web.listen-address=127.0.0.1:{self.port}",
            "--storage.tsdb.retention.time=10y",
            "--log.level=warn",
            *self.extra_args,
        ]
        with self._log_path.open("wb") as log:
            try:
                # Own session so that stopping it never signals the test runner.
                self._proc = subprocess.Popen(
                    args, stdout=log, stderr=subprocess.STDOUT, cwd=self._workdir.name, start_new_session=True
                )
            except OSError as exc:
                self.stop()
                raise PrometheusStartError(f"cannot run {self.binary}: {exc}") from exc
        self._wait_ready()
        return self

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.ready_timeout_s
        assert self._proc is not None
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                log = self.log_tail()
                self.stop()
                raise PrometheusStartError(f"prometheus exited with {self._proc.returncode}: {log}")
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=1.0) as resp:
                    if resp.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(0.1)
        log = self.log_tail()
        self.stop()
        raise PrometheusStartError(f"prometheus not ready after {self.ready_timeout_s} s: {log}")

    def log_tail(self, chars: int = 2000) -> str:
        """The last characters of the server's combined stdout/stderr."""
        if self._log_path is None or not self._log_path.exists():
            return ""
        return self._log_path.read_text(errors="replace")[-chars:]

    def stop(self) -> None:
        """Terminate the server (SIGTERM, then SIGKILL after 10 s) and remove its config directory."""
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
        if self._workdir is not None:
            with contextlib.suppress(OSError):
                self._workdir.cleanup()
            self._workdir = None

    def __enter__(self) -> PrometheusProcess:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
