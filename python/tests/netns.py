"""Network namespaces for multi-host tests and benchmarks on one machine.

A Topology puts every "host" in a network namespace of its own
(`kvt-<pid>-<host>`, `lo` up) and wires them to one Linux bridge that sits
in a "switch" namespace of its own (`kvt-<pid>-sw`), one veth pair per host
(`eth0` in the host's namespace, `v-<host>` on the bridge) with an address
on 10.77.<n>.0/24. Nothing is created in the root namespace, so the
machine's own network is left alone; every namespace (and with it its veth
and the bridge) is removed on close, also after a failure, and the
processes started through the Topology are killed first, as is anything
else still running inside its namespaces (only the Topology's own children
can be there).

    with Topology(["r0", "r1", "a"]) as topo:
        p = topo.popen("r0", ["redis-server", conf])   # in r0's namespace
        topo.run("a", ["redis-cli", "-h", topo.addr("r0"), "ping"])
        topo.set_link("r0", up=False)                  # r0 drops off the wire

Processes run through `ip netns exec NS ARGV`, which enters the namespace
and execs ARGV, so a Popen's pid is the program's own. Unix sockets and
files are shared with the root namespace, so a client outside reaches a
daemon inside through its unix socket. Children get SIGKILL when the
creating process dies (PR_SET_PDEATHSIG); namespaces left behind by a
process that died anyway (SIGKILL) are removed by the next Topology.

Needs root and iproute2: netns_unavailable() says why not; tests call
require_netns(), which skips unless KVTIER_REQUIRE_NETNS=1 (then fails).

Thread-safety: not thread-safe; one thread drives a Topology.
"""

from __future__ import annotations

import ctypes
import itertools
import os
import re
import shlex
import shutil
import signal
import subprocess
import time

_STALE = re.compile(r"^kvt-(\d+)(?:x\d+)?-[a-z0-9]+$")
_counter = itertools.count()


def ip_tool() -> str | None:
    return shutil.which("ip") or next(
        (p for p in ("/usr/sbin/ip", "/sbin/ip", "/usr/bin/ip")
         if os.access(p, os.X_OK)), None)


def netns_unavailable() -> str | None:
    """Why network namespaces cannot be made here (None when they can)."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    ip = ip_tool()
    if ip is None:
        return "ip not found (apt-get install iproute2)"
    name = f"kvt-{os.getpid()}-probe"
    r = subprocess.run([ip, "netns", "add", name], capture_output=True,
                       text=True, timeout=30)
    if r.returncode != 0:
        return f"ip netns add failed: {r.stderr.strip()}"
    subprocess.run([ip, "netns", "del", name], capture_output=True, timeout=30)
    return None


def require_netns() -> None:
    """Skips the calling test where netns_unavailable(), or fails it with
    KVTIER_REQUIRE_NETNS=1."""
    import pytest
    why = netns_unavailable()
    if why is None:
        return
    if os.environ.get("KVTIER_REQUIRE_NETNS") == "1":
        pytest.fail(f"{why}; KVTIER_REQUIRE_NETNS=1")
    pytest.skip(why)


def die_with_parent() -> None:
    """preexec_fn: SIGKILL the child when the creating process dies."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


class Topology:
    """Hosts on one bridged /24, each in its own network namespace.

    Args:
      hosts: host names ([a-z0-9]+, at most 10 characters, not "sw").
    Raises:
      RuntimeError (with ip's message) when a namespace or link cannot be
      made; what was made is removed first.
    """

    def __init__(self, hosts):
        self.ip = ip_tool()
        if self.ip is None:
            raise RuntimeError("ip not found (apt-get install iproute2)")
        self.hosts = list(hosts)
        for h in self.hosts:
            if not re.fullmatch(r"[a-z0-9]{1,10}", h) or h == "sw":
                raise ValueError(f"hosts: {h!r} must match [a-z0-9]{{1,10}}, "
                                 f"not 'sw'")
        if len(set(self.hosts)) != len(self.hosts) or len(self.hosts) > 250:
            raise ValueError("hosts: distinct names, at most 250")
        tag = f"kvt-{os.getpid()}"
        n = next(_counter)
        if n:
            tag += f"x{n}"
        self.switch = f"{tag}-sw"
        self._ns = {h: f"{tag}-{h}" for h in self.hosts}
        self.subnet = f"10.77.{n % 250}"
        self._addr = {h: f"{self.subnet}.{i + 1}" for i, h in enumerate(self.hosts)}
        self._made: list[str] = []  # namespaces, in creation order
        self._procs: list[subprocess.Popen] = []

    # -- names -----------------------------------------------------------------

    def ns(self, host: str) -> str:
        """The namespace of `host`."""
        return self._ns[host]

    def addr(self, host: str) -> str:
        """The IPv4 address of `host` (on its eth0)."""
        return self._addr[host]

    def argv(self, host: str, argv) -> list[str]:
        """`argv` run inside `host`'s namespace."""
        return [self.ip, "netns", "exec", self._ns[host], *map(str, argv)]

    # -- building and removing -------------------------------------------------

    def _ip(self, *args: str, ns: str | None = None) -> None:
        cmd = [self.ip] + (["-n", ns] if ns else []) + list(args)
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
        if r.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)}: {r.stderr.strip()}")

    def _reap_stale(self) -> None:
        """Removes namespaces of earlier Topologies whose process is gone."""
        r = subprocess.run([self.ip, "netns", "list"], capture_output=True,
                           text=True, timeout=30)
        for line in r.stdout.splitlines():
            m = _STALE.match(line.split()[0]) if line.split() else None
            if m and not _pid_alive(int(m.group(1))):
                self._kill_inside(m.group(0))
                subprocess.run([self.ip, "netns", "del", m.group(0)],
                               capture_output=True, timeout=30)

    def start(self) -> "Topology":
        self._reap_stale()
        try:
            self._ip("netns", "add", self.switch)
            self._made.append(self.switch)
            self._ip("link", "set", "lo", "up", ns=self.switch)
            self._ip("link", "add", "br0", "type", "bridge", ns=self.switch)
            self._ip("link", "set", "br0", "up", ns=self.switch)
            for h in self.hosts:
                ns = self._ns[h]
                self._ip("netns", "add", ns)
                self._made.append(ns)
                self._ip("link", "set", "lo", "up", ns=ns)
                # Both ends are made in the switch, the host's moved at once.
                self._ip("link", "add", f"v-{h}", "type", "veth", "peer", "name",
                         "eth0", "netns", ns, ns=self.switch)
                self._ip("link", "set", f"v-{h}", "master", "br0", ns=self.switch)
                self._ip("link", "set", f"v-{h}", "up", ns=self.switch)
                self._ip("addr", "add", f"{self._addr[h]}/24", "dev", "eth0", ns=ns)
                self._ip("link", "set", "eth0", "up", ns=ns)
        except BaseException:
            self.close()
            raise
        return self

    def _kill_inside(self, ns: str) -> None:
        r = subprocess.run([self.ip, "netns", "pids", ns], capture_output=True,
                           text=True, timeout=30)
        for pid in r.stdout.split():
            try:
                os.kill(int(pid), signal.SIGKILL)
            except (ProcessLookupError, ValueError):
                pass

    def close(self) -> None:
        """Kills the processes started here and anything left in the
        namespaces, then removes the namespaces (the veths and the bridge go
        with them). Idempotent."""
        for p in self._procs:
            if p.poll() is None:
                p.kill()
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                pass
        self._procs = []
        for ns in reversed(self._made):
            self._kill_inside(ns)
        for ns in reversed(self._made):
            for _ in range(50):  # a killed process may take a moment to go
                r = subprocess.run([self.ip, "netns", "pids", ns],
                                   capture_output=True, text=True, timeout=30)
                if not r.stdout.split():
                    break
                time.sleep(0.05)
            subprocess.run([self.ip, "netns", "del", ns], capture_output=True,
                           timeout=30)
        self._made = []

    def __enter__(self) -> "Topology":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    # -- running things --------------------------------------------------------

    def popen(self, host: str, argv, **kw) -> subprocess.Popen:
        """Starts `argv` in `host`'s namespace (killed on close; also when
        this process dies). Keyword arguments go to subprocess.Popen."""
        kw.setdefault("stdin", subprocess.DEVNULL)
        p = subprocess.Popen(self.argv(host, argv), preexec_fn=die_with_parent, **kw)
        self._procs.append(p)
        return p

    def run(self, host: str, argv, *, check: bool = True, timeout: float = 60,
            **kw) -> subprocess.CompletedProcess:
        """Runs `argv` in `host`'s namespace to its end; its output captured
        (text unless text=False). Raises RuntimeError with stderr when it
        exits non-zero and `check`."""
        kw.setdefault("capture_output", True)
        kw.setdefault("text", True)
        r = subprocess.run(self.argv(host, argv), timeout=timeout,
                           preexec_fn=die_with_parent, **kw)
        if check and r.returncode != 0:
            err = r.stderr if isinstance(r.stderr, str) else (r.stderr or b"").decode(
                "utf-8", "replace")
            raise RuntimeError(f"{host}: {' '.join(map(str, argv))[:200]} exited "
                               f"{r.returncode}: {err.strip()[:2000]}")
        return r

    def set_link(self, host: str, up: bool) -> None:
        """Takes `host` off the wire (its switch port down: packets to it are
        dropped, so connections to it time out rather than being refused) or
        back on it."""
        self._ip("link", "set", f"v-{host}",
                 "up" if up else "down", ns=self.switch)

    def exec_script(self, host: str, program: str, path: str) -> str:
        """Writes a shell script at `path` that execs `program` with its
        arguments in `host`'s namespace, for launchers that take a binary
        (kvtier.Daemon(kvtierd=path)), and returns `path`."""
        with open(path, "w") as f:
            f.write(f"#!/bin/sh\nexec {self.ip} netns exec {self._ns[host]} "
                    f"{shlex.quote(program)} \"$@\"\n")
        os.chmod(path, 0o755)
        return path
