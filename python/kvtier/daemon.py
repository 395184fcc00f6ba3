"""Starts a private kvtierd for tests, benchmarks and demos.

A Daemon owns a temporary folder (under /dev/shm by default) holding the
daemon's unix socket and its shared-memory segments, starts kvtierd there
with 4 KiB pages (--huge_pages=off), waits until the socket accepts
connections, and on stop() terminates the daemon and removes the folder.
Production daemons run under systemd (deploy/); this is not for them.

Where kvtierd comes from, first match wins (the order _lib uses for the
library): the `kvtierd` argument, $KVTIERD, kvtierd bundled inside the
package (kvtier/bin/kvtierd), $KVT_BIN/daemon/kvtierd or $KVT_BIN/kvtierd (the
GPU machine's bundle), then the build tree of a source checkout
(<repo>/build*/daemon/kvtierd, newest first).

Thread-safety: not thread-safe; one thread drives a Daemon.
"""

from __future__ import annotations

import glob
import os
import shutil
import signal
import socket as socketlib
import subprocess
import tempfile
import time


def find_kvtierd() -> str:
    """The kvtierd binary to start (see module doc). Raises FileNotFoundError
    listing the places tried."""
    tried = []
    env = os.environ.get("KVTIERD")
    if env:
        return env
    kvt_bin = os.environ.get("KVT_BIN")
    here = os.path.dirname(os.path.abspath(__file__))
    candidates = [os.path.join(here, "bin", "kvtierd")]
    if kvt_bin:
        candidates += [os.path.join(kvt_bin, "daemon", "kvtierd"),
                       os.path.join(kvt_bin, "kvtierd")]
    repo = os.path.dirname(os.path.dirname(here))
    builds = glob.glob(os.path.join(repo, "build*", "daemon", "kvtierd"))
    builds.sort(key=os.path.getmtime, reverse=True)
    candidates += builds
    for c in candidates:
        if os.access(c, os.X_OK):
            return c
        tried.append(c)
    raise FileNotFoundError("kvtierd not found; set KVTIERD. Tried: " +
                            ", ".join(tried))


class Daemon:
    """A kvtierd child process in its own temporary folder.

    Args:
      kvtierd: path of the binary (None: find_kvtierd()).
      flags: extra command-line flags, e.g. ["--default_namespace_bytes=..."].
      root: where the temporary folder goes (None: /dev/shm when it exists).
      log_level: the daemon's --log_level.
    """

    def __init__(self, kvtierd: str | None = None, flags=(), root: str | None = None,
                 log_level: str = "warn"):
        self.kvtierd = kvtierd or find_kvtierd()
        self.flags = list(flags)
        if root is None:
            root = "/dev/shm" if os.path.isdir("/dev/shm") else None
        self.dir = tempfile.mkdtemp(prefix="kvtier-py-", dir=root)
        self.shm_dir = os.path.join(self.dir, "shm")
        self.socket = os.path.join(self.dir, "kvtierd.sock")
        self.log_path = os.path.join(self.dir, "kvtierd.log")
        self.log_level = log_level
        # kvtierd refuses a bank folder others can write (mode 0750 at most).
        os.makedirs(self.shm_dir, mode=0o750, exist_ok=True)
        self.proc: subprocess.Popen | None = None

    def start(self, timeout_s: float = 20.0) -> "Daemon":
        """Starts kvtierd and returns once its socket accepts connections.
        Raises RuntimeError (with the daemon's log) if it exits or does not
        listen within timeout_s."""
        argv = [self.kvtierd, f"--socket={self.socket}", f"--shm_dir={self.shm_dir}",
                "--huge_pages=off", f"--log_level={self.log_level}", *self.flags]
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL)
        log.close()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"kvtierd exited with {self.proc.returncode}: "
                                   f"{self.log()}")
            s = socketlib.socket(socketlib.AF_UNIX, socketlib.SOCK_STREAM)
            try:
                s.connect(self.socket)
                return self
            except OSError:
                time.sleep(0.02)
            finally:
                s.close()
        self.kill()
        raise RuntimeError(f"kvtierd did not listen on {self.socket} within "
                           f"{timeout_s} s: {self.log()}")

    def log(self) -> str:
        try:
            with open(self.log_path, "rb") as f:
                return f.read().decode("utf-8", "replace")[-4000:]
        except OSError:
            return ""

    def stop(self, timeout_s: float = 10.0) -> int:
        """SIGTERM, wait, and return the exit code (kills after timeout_s)."""
        if self.proc is None:
            return 0
        self.proc.send_signal(signal.SIGTERM)
        try:
            rc = self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            rc = self.proc.wait()
        self.proc = None
        return rc

    def kill(self) -> None:
        """SIGKILL and wait."""
        if self.proc is None:
            return
        self.proc.kill()
        self.proc.wait()
        self.proc = None

    def close(self) -> None:
        """Stops the daemon (if running) and removes its folder."""
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> "Daemon":
        return self.start() if self.proc is None else self

    def __exit__(self, *exc) -> None:
        self.close()
