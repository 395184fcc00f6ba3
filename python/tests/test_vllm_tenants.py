"""Tenants in namespaces of their own (kv_connector_extra_config
['tenant_namespaces'], kvtier.vllm.tenants), through the connector's
vLLM-free halves against a real kvtierd:

- the map is checked at start: a bad entry or a tenant whose namespace name
  kvtierd would refuse is an error naming the key;
- requests are routed by their cache salt: a mapped tenant's request is
  stored in and served from `<tenant>.<namespace>` (bit-identical, into
  another worker's blocks), a request without a salt from the engine's
  namespace, one whose salt is in no entry is not cached; the scheduler
  warns once about each namespace that no --namespace_acl entry governs,
  and not about one an entry governs (Namespace.acl_entry, from Attach);
- two real users (useradd): with --namespace_acl 'ta.*=group:<A's group>',
  uid A's engine stores its tenant's prefix in ta.<namespace> and is served
  it; uid B's engine configured with the same map is refused at start (an
  error naming the key and the namespace), cannot open the namespace's
  banks, and B's lookups of the same request in its own namespace find
  nothing.

The two-user test needs root (useradd, setuid): it skips elsewhere, and
fails instead with CI=true or KVTIER_REQUIRE_USERS=1 (make test).
"""

import grp
import json
import logging
import os
import pwd
import shutil
import subprocess
import sys

import pytest

import kvtier
from kvtier.vllm.config import ConnectorConfig
from kvtier.vllm.layout import namespace_layout
from kvtier.vllm.scheduler import KvtierScheduler
from kvtier.vllm.worker import KvtierWorker
from tenant_actor import SaltedRequest
from test_vllm_worker import (BS, IDENTITY, attention_cache, block_bytes,
                              buffer_for, kvtier_namespaces)

HERE = os.path.dirname(os.path.abspath(__file__))
KEY = r"kv_connector_extra_config\['tenant_namespaces'\]"


# -- the map, checked at start ---------------------------------------------------

def test_tenant_map_errors_name_the_key():
    from kvtier.vllm.tenants import TenantMap
    cfg = ConnectorConfig.parse({"tenant_namespaces": {"s-a": "ta", "s-b": "tb"}})
    assert cfg.tenant_namespaces == (("s-a", "ta"), ("s-b", "tb"))
    assert cfg.unmapped_salts == "skip"
    bad = [
        ({"tenant_namespaces": ["ta"]}, KEY + ": expected dict, got list"),
        ({"tenant_namespaces": {"s": "t.a"}}, KEY + r": entry 0: tenant 't\.a'"),
        ({"tenant_namespaces": {"s": ""}}, KEY + r": entry 0: tenant ''"),
        ({"tenant_namespaces": {"s": 7}}, KEY + ": entry 0: tenant 7"),
        ({"tenant_namespaces": {"s": "ta", "": "tb"}},
         KEY + ": entry 1: a cache salt must be a non-empty string"),
        ({"tenant_namespaces": {"s": "ta"}, "unmapped_salts": "share"},
         r"\['unmapped_salts'\]: 'share' is not one of skip, default"),
        ({"unmapped_salts": "default"},
         r"\['unmapped_salts'\]: means nothing without"),
    ]
    for extra, message in bad:
        with pytest.raises(ValueError, match=message):
            ConnectorConfig.parse(extra)
    # The salt itself is never in a message (it may be a secret).
    with pytest.raises(ValueError) as e:
        ConnectorConfig.parse({"tenant_namespaces": {"secret-salt": "a/b"}})
    assert "secret-salt" not in str(e.value)
    # A namespace name kvtierd would refuse (over 128 characters).
    long = ConnectorConfig.parse({"tenant_namespaces": {"s": "t" * 96},
                                  "namespace": "n" * 40})
    with pytest.raises(ValueError, match=KEY + ": tenant 'tttt.*137 characters"):
        TenantMap.of(long, long.namespace)


def test_tenant_map_routes_by_cache_salt():
    from kvtier.vllm.tenants import TenantMap
    skip = TenantMap.of(ConnectorConfig.parse(
        {"tenant_namespaces": {"s-a": "ta", "s-a2": "ta", "s-b": "tb"}}), "vllm-x")
    assert skip.namespaces == ("vllm-x", "ta.vllm-x", "tb.vllm-x")
    assert skip.route("s-a") == skip.route("s-a2") == "ta.vllm-x"
    assert skip.route(None) == skip.route("") == "vllm-x"
    assert skip.route("s-unknown") is None  # not cached
    assert skip.tenant_of("tb.vllm-x") == "tb" and skip.tenant_of("vllm-x") is None
    default = TenantMap.of(ConnectorConfig.parse(
        {"tenant_namespaces": {"s-a": "ta"}, "unmapped_salts": "default"}), "vllm-x")
    assert default.route("s-unknown") == "vllm-x"
    # Without a map every request uses the engine's namespace, as before.
    plain = TenantMap.of(ConnectorConfig.parse({}), "vllm-x")
    assert plain.namespaces == ("vllm-x",) and plain.route("s-a") == "vllm-x"


# -- routing against a real daemon -------------------------------------------------

@pytest.fixture(scope="module")
def acl_daemon():
    """A daemon whose ACL governs tenant "tg"'s namespaces (this process's
    own group may attach them) and nothing else."""
    group = grp.getgrgid(os.getgid()).gr_name
    with kvtier.Daemon(flags=[f"--namespace_acl=tg.*=group:{group}"]) as d:
        yield d


def test_requests_use_their_tenants_namespace(acl_daemon, caplog):
    cache = attention_cache()
    layout = namespace_layout(cache, IDENTITY, 32)
    cfg = ConnectorConfig.parse({"socket": acl_daemon.socket, "tenant_namespaces": {
        "salt-g": "tg", "salt-o": "to"}})
    name = "unit-ten"
    with caplog.at_level(logging.WARNING, logger="kvtier.vllm"):
        sched = KvtierScheduler(cfg, name, layout, cache)
        assert sched.link.attach_all() == {"unit-ten", "tg.unit-ten", "to.unit-ten"}
    sched.worker_ready = {"unit-ten", "tg.unit-ten", "to.unit-ten"}
    # Warned once about each namespace no ACL entry governs, never about tg's.
    open_warnings = [r.getMessage() for r in caplog.records
                     if "governed by no --namespace_acl entry" in r.getMessage()]
    assert len(open_warnings) == 2, open_warnings
    assert "'unit-ten'" in open_warnings[0] and "tenant_namespaces" in open_warnings[0]
    assert "'to.unit-ten'" in open_warnings[1] and "'to.*=group:GROUP'" in open_warnings[1]
    assert sched.link.namespace("tg.unit-ten").acl_entry == "tg.*"
    assert sched.link.namespace("unit-ten").acl_entry == ""

    worker = KvtierWorker(cfg, name, layout, cache)
    worker.register(buffer_for(cache, seed=1))
    tokens = list(range(3 * BS + 1))
    requests = [SaltedRequest("g", tokens, "salt-g"), SaltedRequest("n", tokens),
                SaltedRequest("x", tokens, "salt-unmapped")]
    blocks = {"g": [1, 2, 3, 4], "n": [5, 6, 7, 8], "x": [9, 10, 11, 12]}
    jobs = []
    for r in requests:
        assert sched.matched_tokens(r, 0) == 0
        job = sched.plan_store(r.request_id, 3 * BS, (blocks[r.request_id],))
        if job is not None:
            jobs.append(job)
    assert [(j.req_id, j.namespace) for j in jobs] == [("g", "tg.unit-ten"),
                                                       ("n", "unit-ten")]
    worker.store(jobs)
    report = worker.poll()
    assert report.stored == [("g", 0, 3), ("n", 0, 3)] and not report.failed_stores
    assert report.attached == frozenset(sched.link.names)
    sched.on_report(report)
    assert sched.stats.take()["unmapped_requests"] == 1
    pages = {n["name"]: int(n["pages"]) for n in kvtier_namespaces(acl_daemon)}
    assert pages == {"unit-ten": 3, "tg.unit-ten": 3, "to.unit-ten": 0}, pages

    # Another engine: tenant g's request is served from tg's namespace into
    # its own blocks, bit-identical; the unmapped salt is still a miss.
    other = KvtierScheduler(cfg, name, layout, cache)
    other.worker_ready = other.link.attach_all()
    other_worker = KvtierWorker(cfg, name, layout, cache)
    other_worker.register(buffer_for(cache, seed=2))
    g2 = SaltedRequest("g2", tokens, "salt-g")
    assert other.matched_tokens(g2, 0) == 3 * BS
    other.after_alloc(g2, ([20, 21, 22, 23],), 3 * BS)
    loads = other.take_loads()
    assert [(l.namespace, l.block_ids) for l in loads] == [("tg.unit-ten", (20, 21, 22))]
    other_worker.load(loads)
    other.on_report(other_worker.poll())
    assert other.num_pinned == 0
    assert ([block_bytes(other_worker, b) for b in (20, 21, 22)]
            == [block_bytes(worker, b) for b in (1, 2, 3)])
    assert other.matched_tokens(SaltedRequest("x2", tokens, "salt-unmapped"), 0) == 0
    for x in (other_worker, other, worker, sched):
        x.close()


# -- two users -----------------------------------------------------------------

GROUP = "kvtier"  # the daemon's --group, as in tests/isolation_test.cc
TENANT_GROUP = "kvtier-ten-a"
USER_A, USER_B = "kvtier-ten-a", "kvtier-ten-b"


def _users_required() -> bool:
    return (os.environ.get("KVTIER_REQUIRE_USERS") == "1"
            or os.environ.get("CI", "").lower() == "true")


def _cannot_create_users() -> str:
    if os.geteuid() != 0:
        return "needs root to create users and run as them"
    for tool in ("useradd", "groupadd", "usermod"):
        if shutil.which(tool, path="/usr/sbin:/sbin:/usr/bin") is None:
            return f"{tool} is not installed"
    return ""


def _ensure_user(name: str, groups: list[str]) -> pwd.struct_passwd:
    """User `name` (no home, no login) in exactly `groups`, created if
    missing; left in place for the next run."""
    for g in groups:
        subprocess.run(["groupadd", "-f", g], check=True, capture_output=True)
    try:
        pwd.getpwnam(name)
        subprocess.run(["usermod", "-G", ",".join(groups), name], check=True,
                       capture_output=True)
    except KeyError:
        subprocess.run(["useradd", "-M", "-N", "-s", "/usr/sbin/nologin",
                        "-G", ",".join(groups), name], check=True, capture_output=True)
    return pwd.getpwnam(name)


class Actor:
    """Runs tenant_actor.py as `user` (its own groups), under the first
    Python that user can execute and import kvtier with: this venv's, or
    the system's when the venv's lies where the user cannot reach it (a
    Python under root's home); the actor needs neither torch nor pytest."""

    def __init__(self, user: pwd.struct_passwd):
        self.user = user
        self.groups = [g for g in os.getgrouplist(user.pw_name, user.pw_gid)
                       if g != user.pw_gid]
        # The users have no home; the actor writes no file.
        self.env = dict(os.environ, HOME="/nonexistent")
        self.env["PYTHONPATH"] = os.pathsep.join(
            p for p in (os.path.dirname(HERE), os.environ.get("PYTHONPATH")) if p)
        tried = []
        for python in dict.fromkeys((sys.executable, "/usr/bin/python3")):
            try:
                r = self._run([python, "-c", "import kvtier.vllm.scheduler"])
            except OSError as e:
                tried.append(f"{python}: {e}")
                continue
            if r.returncode == 0:
                self.python = python
                return
            tried.append(f"{python}: {r.stderr.strip()[-500:]}")
        raise RuntimeError(f"no Python that {user.pw_name} can run imports "
                           f"kvtier: {'; '.join(tried)}")

    def _run(self, argv):
        return subprocess.run(argv, user=self.user.pw_uid, group=self.user.pw_gid,
                              extra_groups=self.groups, env=self.env,
                              capture_output=True, text=True, timeout=300)

    def __call__(self, cmd: dict) -> dict:
        r = self._run([self.python, os.path.join(HERE, "tenant_actor.py"),
                       json.dumps(cmd)])
        assert r.returncode == 0, f"as {self.user.pw_name}: {r.stderr[-4000:]}"
        return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.fixture
def two_users():
    why = _cannot_create_users()
    if why:
        if _users_required():
            pytest.fail(f"{why} (CI=true or KVTIER_REQUIRE_USERS=1)")
        pytest.skip(why)
    a = _ensure_user(USER_A, [GROUP, TENANT_GROUP])
    b = _ensure_user(USER_B, [GROUP])
    return Actor(a), Actor(b)


def test_uid_b_can_neither_attach_nor_see_tenant_a(two_users):
    as_a, as_b = two_users
    flags = [f"--group={GROUP}", f"--namespace_acl=ta.*=group:{TENANT_GROUP}"]
    with kvtier.Daemon(flags=flags) as d:
        # Only the files' own modes guard them: the folders are open to all.
        os.chmod(d.dir, 0o755)
        os.chmod(d.shm_dir, 0o755)
        name = "unit-2uid"
        extra = {"socket": d.socket, "tenant_namespaces": {"salt-a": "ta"}}
        # A's engine: tenant A's request goes to ta.<name>, governed by the
        # ACL (no warning about it), and is served to A's next engine.
        stored = as_a({"op": "store", "extra": extra, "name": name,
                                    "salt": "salt-a"})
        assert stored["stored"] == [["w1", 0, 3]] and stored["hit"] == 3 * BS, stored
        assert stored["acl"] == {name: "", f"ta.{name}": "ta.*"}, stored
        assert not [w for w in stored["warnings"] if f"'ta.{name}'" in w], stored
        pages = {n["name"]: int(n["pages"]) for n in kvtier_namespaces(d)}
        assert pages == {name: 0, f"ta.{name}": 3}, pages
        banks = sorted(os.path.join(d.shm_dir, f) for f in os.listdir(d.shm_dir)
                       if f".ta.{name}." in f)
        assert banks, os.listdir(d.shm_dir)

        # B's engine with the same map: refused at start, naming the key.
        refused = as_b({"op": "lookup", "extra": extra, "name": name,
                                     "salt": "salt-a"})
        assert refused.get("error") == "AttachRefused", refused
        assert f"'ta.{name}'" in refused["message"]
        assert "tenant_namespaces" in refused["message"]
        # ... cannot open the tenant's banks (A's own engine can) ...
        assert as_b({"op": "open", "paths": banks})["errno"] == \
            [13] * len(banks)
        assert as_a({"op": "open", "paths": banks})["errno"] == \
            [0] * len(banks)
        # ... and its lookups of the very same request (same salt, same
        # hashes) in its own namespace find nothing, mapped or not.
        for b_extra in ({"socket": d.socket},
                        {"socket": d.socket, "tenant_namespaces": {"salt-b": "tb"},
                         "unmapped_salts": "default"}):
            seen = as_b({"op": "lookup", "extra": b_extra,
                                      "name": name, "salt": "salt-a"})
            assert seen == {"hit": 0, "namespace": name}, seen
