"""LocalServer: a driftkv-server process on a loopback port the OS picks,
for tests, examples and notebooks.

    with LocalServer(config="deploy/driftkv-server.textproto") as server:
        client = driftkv.Client(server.target)

The binary is `binary`, else $DRIFTKV_SERVER_BIN, else the repository's
bazel-bin/service/driftkv-server (`bazel build //service:driftkv-server`).
`config` is a path, or `config_text` the text-format ServerConfig itself.
"""
import os
import re
import signal
import subprocess
import tempfile
import time
from typing import Optional, Sequence

REPO_ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.realpath(__file__)), "..", ".."))


def default_binary() -> str:
    return os.environ.get("DRIFTKV_SERVER_BIN") or os.path.join(REPO_ROOT, "bazel-bin", "service", "driftkv-server")


class LocalServer:
    def __init__(self, config: Optional[str] = None, *, config_text: Optional[str] = None,
                 binary: Optional[str] = None, args: Sequence[str] = (), start_timeout: float = 60.0):
        if (config is None) == (config_text is None):
            raise ValueError("LocalServer: give config (a path) or config_text, not both")
        self.binary = binary or default_binary()
        if not os.access(self.binary, os.X_OK):
            raise FileNotFoundError(f"driftkv-server not found at {self.binary}: bazel build //service:driftkv-server, "
                                    "or pass binary= / set DRIFTKV_SERVER_BIN")
        self._dir = tempfile.TemporaryDirectory(prefix="driftkv-server-")
        if config_text is not None:
            config = os.path.join(self._dir.name, "config.textproto")
            with open(config, "w") as f:
                f.write(config_text)
        self.config = config
        self.log_path = os.path.join(self._dir.name, "server.log")
        self._log = open(self.log_path, "w")
        self.process = subprocess.Popen(
            [self.binary, "--config", config, "--listen", "127.0.0.1:0", "--metrics", "none", *args],
            stdout=self._log, stderr=subprocess.STDOUT)
        self.port = self._wait_for_port(start_timeout)
        self.target = f"127.0.0.1:{self.port}"

    def _wait_for_port(self, timeout: float) -> int:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            text = self.log()
            m = re.search(r"^listening on port (\d+) \(gRPC\)", text, re.M)
            if m:
                return int(m.group(1))
            if self.process.poll() is not None:
                raise RuntimeError(f"driftkv-server exited with {self.process.returncode}:\n{text}")
            time.sleep(0.05)
        self.stop()
        raise TimeoutError(f"driftkv-server did not start within {timeout} s:\n{self.log()}")

    def __repr__(self) -> str:
        """"<driftkv.local_server.LocalServer target='127.0.0.1:PORT' pid=N
        running>" (or "stopped, exit code C")."""
        code = self.process.poll()
        state = "running" if code is None else f"stopped, exit code {code}"
        target = getattr(self, "target", None)  # not yet while starting
        return f"<driftkv.local_server.LocalServer target={target!r} pid={self.process.pid} {state}>"

    def log(self) -> str:
        with open(self.log_path) as f:
            return f.read()

    def banner(self) -> str:
        """The server's first line (backend, shape, bits per value, pool)."""
        return self.log().splitlines()[0] if self.log() else ""

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._log.close()

    def __enter__(self) -> "LocalServer":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
        self._dir.cleanup()
