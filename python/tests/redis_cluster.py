"""A real Redis Cluster for the Python tests (no mocks): 3 masters, no
replicas, started from Debian's redis-server on free loopback ports, each in
its own folder under one temporary folder, joined with `redis-cli --cluster
create`, and killed (folder removed) on teardown. kvtierd's cluster tier
(--cluster_redis) is pointed at `seeds`.

    from redis_cluster import redis_cluster  # the module-scoped fixture

    def test_x(redis_cluster):
        flags = [f"--cluster_redis={redis_cluster.seeds}"]

Without redis-server or redis-cli the fixture skips the test, unless
KVTIER_REQUIRE_REDIS=1, which makes that a failure (as the C++ tests'
RedisClusterFixture does). Nodes keep nothing on disk (save "", appendonly
no) and serve with part of the slots down (cluster-require-full-coverage
no). With `user`, the nodes also get an ACL user with a random password
allowed only what kvtierd needs on keys `kvt*` (ACL below, the C++
fixture's kDaemonAcl); the default user stays open, for the fixture itself.

For tests of kvtierd's cluster tier over it: key_file writes the shared
--cluster_key_file.

Thread-safety: not thread-safe; one test thread drives a RedisCluster.
"""

from __future__ import annotations

import ctypes
import os
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import time

import pytest

from redis_common import ACL, key_file, which as _tool  # noqa: F401


def require_redis() -> tuple[str, str]:
    """The paths of redis-server and redis-cli. Skips the calling test when
    one is missing, or fails it with KVTIER_REQUIRE_REDIS=1."""
    server, cli = _tool("redis-server"), _tool("redis-cli")
    if server and cli:
        return server, cli
    missing = "redis-server" if not server else "redis-cli"
    why = (f"{missing} not found (apt-get install redis-server redis-tools)")
    if os.environ.get("KVTIER_REQUIRE_REDIS") == "1":
        pytest.fail(f"{why}; KVTIER_REQUIRE_REDIS=1")
    pytest.skip(why)


def _port_free(port: int) -> bool:
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        s.bind(("127.0.0.1", port))
        return True
    except OSError:
        return False
    finally:
        s.close()


def free_port(taken: set[int]) -> int:
    """A loopback port that is free, and whose cluster bus port (+10000)
    is free too, not in `taken`."""
    for _ in range(200):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        s.close()
        if port + 10000 <= 65535 and port not in taken and \
                port + 10000 not in taken and _port_free(port + 10000):
            return port
        # The kernel hands out high ports first; try below the bus range.
        port = 20000 + secrets.randbelow(25000)
        if port not in taken and _port_free(port) and _port_free(port + 10000):
            return port
    raise RuntimeError("no free loopback port pair (port, port + 10000)")


def _die_with_parent() -> None:
    # SIGKILL the server when the test process dies: no server outlives a
    # crashed test run.
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


class RedisCluster:
    """`masters` redis-server processes joined as one cluster.

    Args:
      masters: how many nodes (each a master, no replicas); 3 at least.
      user: the name of an ACL user to add (kvtierd's --cluster_user), with
        a random `password`; None: none.
      key_pattern: the keys that user may touch.
    """

    def __init__(self, masters: int = 3, user: str | None = None,
                 key_pattern: str = "kvt*"):
        if masters < 3:
            raise ValueError(f"masters: Redis Cluster needs 3, got {masters}")
        self.server, self.cli = require_redis()
        self.masters = masters
        self.user = user
        self.password = secrets.token_hex(16) if user else None
        self.key_pattern = key_pattern
        self.dir = tempfile.mkdtemp(prefix="kvtier-redis-")
        self.ports: list[int] = []
        self.procs: list[subprocess.Popen] = []

    @property
    def seeds(self) -> str:
        """"host:port,host:port,...": every node (kvtierd --cluster_redis)."""
        return ",".join(f"127.0.0.1:{p}" for p in self.ports)

    def password_file(self, path: str) -> str:
        """Writes the ACL user's password to `path` (mode 0600: kvtierd's
        --cluster_password_file) and returns the path."""
        if self.password is None:
            raise ValueError("password_file: the cluster has no ACL user")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(self.password)
        return path

    def _config(self, node_dir: str, port: int) -> str:
        lines = [
            f"port {port}", "bind 127.0.0.1", "protected-mode no",
            "daemonize no", f"dir {node_dir}", "logfile redis.log",
            "cluster-enabled yes", "cluster-config-file nodes.conf",
            "cluster-node-timeout 1000", "cluster-require-full-coverage no",
            'save ""', "appendonly no",
            "maxmemory 256mb", "maxmemory-policy allkeys-lru",
        ]
        if self.user:
            lines.append(f"user {self.user} on >{self.password} "
                         f"~{self.key_pattern} {ACL}")
        path = os.path.join(node_dir, "redis.conf")
        with open(path, "w") as f:
            f.write("\n".join(lines) + "\n")
        return path

    def command(self, i: int, *argv: str, cluster_mode: bool = False) -> str:
        """Runs one command on node i as the default user; its reply as
        redis-cli prints it. `cluster_mode` follows redirections (-c)."""
        cmd = [self.cli, "-h", "127.0.0.1", "-p", str(self.ports[i])]
        if cluster_mode:
            cmd.append("-c")
        r = subprocess.run(cmd + list(argv), capture_output=True, text=True,
                           timeout=30)
        if r.returncode != 0:
            raise RuntimeError(f"redis-cli {' '.join(argv)} on node {i}: "
                               f"{r.stderr.strip() or r.stdout.strip()}")
        return r.stdout

    def keys(self, pattern: str = "kvt*") -> set[tuple[int, str]]:
        """Every key matching `pattern`, as (node index, key): the node is
        the master that holds it, where SET and GET of the key need no
        redirection."""
        out = set()
        for i in range(len(self.ports)):
            for line in self.command(i, "keys", pattern).splitlines():
                if line.strip():
                    out.add((i, line.strip()))
        return out

    def _poll(self, what: str, ok, polls: int = 300) -> None:
        last = ""
        for _ in range(polls):
            try:
                if ok():
                    return
            except (RuntimeError, subprocess.TimeoutExpired) as e:
                last = str(e)
            time.sleep(0.1)
        raise RuntimeError(f"Redis Cluster: {what} never happened ({last}); "
                           f"logs:\n{self.logs()}")

    def healthy(self) -> bool:
        """Every node reports cluster_state:ok with every slot assigned."""
        for i in range(len(self.ports)):
            info = self.command(i, "cluster", "info")
            if "cluster_state:ok" not in info or \
                    "cluster_slots_assigned:16384" not in info:
                return False
        return True

    def start(self) -> "RedisCluster":
        """Starts the nodes, creates the cluster and waits until it is ok.
        Raises RuntimeError with the nodes' logs when it does not come up."""
        taken: set[int] = set()
        for i in range(self.masters):
            port = free_port(taken)
            taken.update((port, port + 10000))
            node_dir = os.path.join(self.dir, f"node{i}")
            os.makedirs(node_dir)
            conf = self._config(node_dir, port)
            self.ports.append(port)
            self.procs.append(subprocess.Popen(
                [self.server, conf], cwd=node_dir, stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
                preexec_fn=_die_with_parent))
        for i in range(self.masters):
            self._poll(f"node {i} answering PING",
                       lambda i=i: self.command(i, "ping").strip() == "PONG")
        r = subprocess.run(
            [self.cli, "--cluster", "create",
             *[f"127.0.0.1:{p}" for p in self.ports],
             "--cluster-replicas", "0", "--cluster-yes"],
            capture_output=True, text=True, timeout=120)
        if r.returncode != 0:
            raise RuntimeError(f"redis-cli --cluster create: {r.stdout}{r.stderr}")
        self._poll("cluster_state:ok on every node", self.healthy)
        return self

    def logs(self, max_bytes: int = 2000) -> str:
        out = []
        for i in range(len(self.ports)):
            path = os.path.join(self.dir, f"node{i}", "redis.log")
            try:
                with open(path, "rb") as f:
                    out.append(f"--- node {i}:\n" +
                               f.read()[-max_bytes:].decode("utf-8", "replace"))
            except OSError:
                pass
        return "\n".join(out)

    def stop(self) -> None:
        """Kills every node and removes the folder."""
        for p in self.procs:
            if p.poll() is None:
                p.kill()
            p.wait()
        self.procs = []
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> "RedisCluster":
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc) -> None:
        self.stop()


@pytest.fixture(scope="module")
def redis_cluster():
    """A running 3-master RedisCluster (see the module doc), per test module."""
    with RedisCluster() as c:
        yield c
