"""A real Redis Cluster and kvtierd daemons spread over network namespaces
(netns.Topology), for tests and benchmarks of kvtierd's cluster tier that
cross a (virtual) wire.

NetnsRedisCluster starts one redis-server per host namespace, bound to the
host's address on port 6379 (`ip netns exec NS redis-server CONF`), joins
them with `redis-cli --cluster create ... --cluster-replicas R` run inside
the first host's namespace, and waits until every node reports the cluster
ok (and, with replicas, every replica's link up). Its redis.conf is the C++
fixture's (tests/redis_cluster_fixture.cc): cluster-require-full-coverage
no, maxmemory with allkeys-lru, nothing kept on disk, replicas that may take
over however stale (cluster-replica-validity-factor 0), diskless
replication without delay; the default user (the administrator, which
redis-cli and replication use) has a random password, and `user` is the
daemons' ACL user, allowed only what kvtierd needs (redis_cluster.ACL).
Nodes are killed and restarted by host name; a restarted node keeps its
nodes.conf (its id and slots) but no data.

netns_daemon() starts kvtierd in a host's namespace through kvtier.Daemon:
its unix socket (and segments, under /dev/shm) are shared with the test's
namespace, so the engine-side kvtier.Client reaches it as usual.

Thread-safety: not thread-safe; one thread drives these.
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import tempfile
import time

import kvtier
from netns import Topology
from redis_common import ACL, key_file, which  # noqa: F401 (re-exported)

PORT = 6379


def find_tool(name: str) -> str:
    """The path of `name` (redis-server, redis-cli, redis-benchmark) on PATH
    or in /usr/bin, /usr/sbin. Raises FileNotFoundError."""
    path = which(name)
    if path is None:
        raise FileNotFoundError(f"{name} not found (apt-get install redis-server "
                                f"redis-tools)")
    return path


class NetnsRedisCluster:
    """Redis Cluster nodes, one per host of `topo`.

    Args:
      topo: a started netns.Topology holding every host below.
      masters: hosts of the masters (3 at least).
      replicas: hosts of the replicas (len(masters) * R of them, R >= 0);
        which master each follows is redis-cli's choice (replica_of()).
      maxmemory: redis.conf's maxmemory (with allkeys-lru).
      user: the daemons' ACL user (--cluster_user), with a random password.
      node_timeout_ms: cluster-node-timeout (how soon a failover starts).
      server, cli: redis-server and redis-cli (None: find_tool()).
      env: extra environment of the servers (e.g. MALLOC_CONF, read by the
        jemalloc Debian's redis-server links).
    """

    def __init__(self, topo: Topology, masters, replicas=(), *,
                 maxmemory: str = "256mb", user: str = "kvtierd",
                 node_timeout_ms: int = 1000, server: str | None = None,
                 cli: str | None = None, env: dict[str, str] | None = None):
        if len(masters) < 3:
            raise ValueError(f"masters: Redis Cluster needs 3, got {len(masters)}")
        if len(replicas) % len(masters):
            raise ValueError("replicas: a multiple of the masters' count")
        server = server or find_tool("redis-server")
        cli = cli or find_tool("redis-cli")
        self.topo, self.server, self.cli = topo, server, cli
        self.masters, self.replicas = list(masters), list(replicas)
        self.hosts = self.masters + self.replicas
        self.maxmemory, self.user = maxmemory, user
        self.node_timeout_ms = node_timeout_ms
        self.env = dict(os.environ, **env) if env else None
        self.password = secrets.token_hex(16)
        self.admin_password = secrets.token_hex(16)
        self.dir = tempfile.mkdtemp(prefix="kvtier-netns-redis-")
        self.procs: dict[str, subprocess.Popen] = {}

    # -- addresses ---------------------------------------------------------------

    def address(self, host: str) -> str:
        return f"{self.topo.addr(host)}:{PORT}"

    @property
    def seeds(self) -> str:
        """Every master, "ip:port,..." (kvtierd --cluster_redis)."""
        return ",".join(self.address(h) for h in self.masters)

    def host_of(self, address: str) -> str:
        """The host whose node listens at "ip:port" (the address itself when
        no host does)."""
        for h in self.hosts:
            if self.address(h) == address:
                return h
        return address

    def password_file(self, path: str) -> str:
        """Writes the daemons' password to `path` (mode 0600:
        --cluster_password_file) and returns the path."""
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(self.password)
        return path

    # -- processes -----------------------------------------------------------------

    def _config(self, host: str) -> str:
        node_dir = os.path.join(self.dir, host)
        os.makedirs(node_dir, exist_ok=True)
        lines = [
            f"port {PORT}", f"bind {self.topo.addr(host)}", "protected-mode no",
            "daemonize no", f"dir {node_dir}", f"logfile {node_dir}/redis.log",
            "cluster-enabled yes", "cluster-config-file nodes.conf",
            f"cluster-node-timeout {self.node_timeout_ms}",
            "cluster-require-full-coverage no",
            "cluster-replica-validity-factor 0", 'save ""', "appendonly no",
            f"maxmemory {self.maxmemory}", "maxmemory-policy allkeys-lru",
            "repl-diskless-sync yes", "repl-diskless-sync-delay 0",
            f"masterauth {self.admin_password}",
            f"user default on >{self.admin_password} ~* &* +@all",
            f"user {self.user} on >{self.password} resetkeys ~kvt* {ACL}",
        ]
        path = os.path.join(node_dir, "redis.conf")
        with open(path, "w") as f:
            f.write("\n".join(lines) + "\n")
        return path

    def _spawn(self, host: str) -> None:
        conf = os.path.join(self.dir, host, "redis.conf")
        self.procs[host] = self.topo.popen(
            host, [self.server, conf], stdout=subprocess.DEVNULL,
            stderr=subprocess.STDOUT, env=self.env)

    def command(self, host: str, *argv, via: str | None = None,
                cluster_mode: bool = False, stdin: bytes | None = None,
                raw: bool = False, check: bool = True):
        """Runs one command on `host`'s node as the administrator, with
        redis-cli inside `via`'s namespace (default: the node's own). Returns
        its reply as redis-cli prints it (bytes with `raw`). `cluster_mode`
        follows redirections (-c); `stdin` becomes the last argument (-x)."""
        cmd = [self.cli, "--no-auth-warning", "-a", self.admin_password,
               "-h", self.topo.addr(host), "-p", str(PORT)]
        if cluster_mode:
            cmd.append("-c")
        if stdin is not None:
            cmd.append("-x")
        r = self.topo.run(via or host, cmd + [str(a) for a in argv], check=False,
                          text=False, input=stdin, timeout=60)
        if check and r.returncode != 0:
            raise RuntimeError(f"redis-cli {argv[:3]} on {host}: "
                               f"{(r.stderr or r.stdout).decode(errors='replace')}")
        return r.stdout if raw else r.stdout.decode("utf-8", "replace")

    def wait_for(self, what: str, ok, polls: int = 600) -> None:
        """Polls ok() (50 ms apart, at most `polls` times) until it is true;
        RuntimeError with the nodes' logs when it never is."""
        last = ""
        for _ in range(polls):
            try:
                if ok():
                    return
            except (RuntimeError, subprocess.TimeoutExpired) as e:
                last = str(e)
            time.sleep(0.05)
        raise RuntimeError(f"Redis Cluster: {what} never happened ({last}); "
                           f"logs:\n{self.logs()}")

    def ping(self, host: str) -> bool:
        return self.command(host, "ping", check=False).strip() == "PONG"

    def start(self) -> "NetnsRedisCluster":
        """Starts every node, creates the cluster and waits until it is ok.
        Raises RuntimeError with the nodes' logs when it does not come up."""
        for h in self.hosts:
            self._config(h)
            self._spawn(h)
        for h in self.hosts:
            self.wait_for(f"{h} answering PING", lambda h=h: self.ping(h))
        create = [self.cli, "--no-auth-warning", "-a", self.admin_password,
                  "--cluster", "create", *[self.address(h) for h in self.hosts],
                  "--cluster-replicas", str(len(self.replicas) // len(self.masters)),
                  "--cluster-yes"]
        r = self.topo.run(self.masters[0], create, check=False, timeout=120)
        if r.returncode != 0:
            raise RuntimeError(f"redis-cli --cluster create: {r.stdout}{r.stderr}")
        self.wait_healthy()
        return self

    def nodes(self, via: str | None = None) -> list[dict]:
        """CLUSTER NODES as `via`'s node (default: the first live master)
        sees it: [{id, host, master (bool), failed (bool), master_id,
        slots [(lo, hi)]}]."""
        via = via or next(h for h in self.masters + self.replicas
                          if h in self.procs and self.procs[h].poll() is None)
        out = []
        for line in self.command(via, "cluster", "nodes").splitlines():
            f = line.split()
            if len(f) < 8:
                continue
            slots = []
            for s in f[8:]:
                if s.startswith("["):
                    continue  # a slot being migrated
                lo, _, hi = s.partition("-")
                slots.append((int(lo), int(hi or lo)))
            out.append({"id": f[0], "host": self.host_of(f[1].split("@")[0]),
                        "master": "master" in f[2].split(","),
                        "failed": "fail" in f[2].split(","),
                        "master_id": None if f[3] == "-" else f[3],
                        "slots": slots})
        return out

    def replica_of(self) -> dict[str, str]:
        """{replica host: its master's host}, as the cluster sees it now."""
        nodes = self.nodes()
        by_id = {n["id"]: n["host"] for n in nodes}
        return {n["host"]: by_id[n["master_id"]] for n in nodes
                if not n["master"] and n["master_id"] in by_id}

    def owner(self, slot: int, via: str | None = None) -> str:
        """The host of the master serving `slot`."""
        for n in self.nodes(via):
            if n["master"] and not n["failed"] and \
                    any(lo <= slot <= hi for lo, hi in n["slots"]):
                return n["host"]
        raise KeyError(f"slot {slot}: no master serves it")

    def healthy(self) -> bool:
        """Every running node sees cluster_state:ok and every slot assigned
        to a live master; every running replica's link to its master is up."""
        running = [h for h in self.hosts if self.procs[h].poll() is None]
        for h in running:
            info = self.command(h, "cluster", "info")
            if "cluster_state:ok" not in info or \
                    "cluster_slots_ok:16384" not in info:
                return False
            nodes = self.nodes(h)
            if any(n["failed"] for n in nodes if n["host"] in running):
                return False
        for h in running:
            repl = self.command(h, "info", "replication")
            if "role:slave" in repl and "master_link_status:up" not in repl:
                return False
        return True

    def wait_healthy(self) -> None:
        self.wait_for("a healthy cluster", self.healthy)

    def synced(self, master: str) -> bool:
        """Whether every replica of `master` has its whole replication
        stream (offsets equal)."""
        info = self.command(master, "info", "replication")
        fields = dict(l.split(":", 1) for l in info.splitlines() if ":" in l)
        offset = fields.get("master_repl_offset", "").strip()
        n = int(fields.get("connected_slaves", "0").strip() or 0)
        return n > 0 and all(f"offset={offset}," in fields.get(f"slave{i}", "")
                             for i in range(n))

    def kill(self, host: str) -> None:
        """SIGKILLs `host`'s node."""
        p = self.procs[host]
        if p.poll() is None:
            p.kill()
        p.wait()

    def restart(self, host: str) -> None:
        """Starts `host`'s node again (its nodes.conf kept, its data not)
        and waits until it answers PING."""
        self._spawn(host)
        self.wait_for(f"{host} answering PING", lambda: self.ping(host))

    def logs(self, max_bytes: int = 1500) -> str:
        out = []
        for h in self.hosts:
            try:
                with open(os.path.join(self.dir, h, "redis.log"), "rb") as f:
                    out.append(f"--- {h}:\n" + f.read()[-max_bytes:].decode(
                        "utf-8", "replace"))
            except OSError:
                pass
        return "\n".join(out)

    def stop(self) -> None:
        """Kills every node and removes the folder."""
        for h in list(self.procs):
            self.kill(h)
        self.procs = {}
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> "NetnsRedisCluster":
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc) -> None:
        self.stop()


def read_key(path: str) -> bytes:
    """The cluster key as kvtierd reads it (trailing newlines dropped)."""
    with open(path, "rb") as f:
        return f.read().rstrip(b"\r\n")


def netns_daemon(topo: Topology, host: str, workdir: str, flags,
                 kvtierd: str | None = None, log_level: str = "warn") -> kvtier.Daemon:
    """A kvtier.Daemon (not started) whose kvtierd runs in `host`'s
    namespace, through a launcher script written to `workdir`."""
    launcher = topo.exec_script(host, kvtierd or kvtier.find_kvtierd(),
                                os.path.join(workdir, f"kvtierd-in-{host}"))
    return kvtier.Daemon(kvtierd=launcher, flags=list(flags), log_level=log_level)
