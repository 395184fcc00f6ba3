"""The vLLM connector over kvtierd's cluster tier: vLLM's "ask again later".

Driven through the connector's vLLM-free halves (kvtier.vllm.scheduler and
.worker: what connector.py's get_num_new_matched_tokens hands on, a None
there being vLLM's `(None, False)`) against real kvtierd daemons and a real
Redis Cluster (redis_cluster.py):

- the Redis Cluster helper itself;
- `kv_connector_extra_config["cluster"]` parsed and checked;
- with the switch, against a daemon without a cluster tier: answered at
  once from the local match, no prefetch;
- two daemons sharing a Redis Cluster and a key file, both with
  --cluster_write_through: engine A stores a prefix through daemon A;
  engine B's scheduler on daemon B first answers None (ask again later)
  and starts one prefetch; asked again (a bounded number of times), the
  whole prefix, which B's worker loads bit-identical to A's blocks; without
  the switch, B answers a miss at once and never None;
- the same with the values of the prefix's last pages corrupted in Redis:
  after one "ask again later" the prefetch stops at the first bad value,
  and the request is answered from the local match (the good pages), never
  asked to wait again.

Without redis-server the Redis tests skip, unless KVTIER_REQUIRE_REDIS=1
(make test), which makes that a failure.
"""

import time

import pytest

import kvtier
from kvtier.vllm.config import ConnectorConfig
from kvtier.vllm.layout import namespace_layout
from kvtier.vllm.scheduler import KvtierScheduler
from kvtier.vllm.worker import KvtierWorker
from redis_cluster import key_file
from redis_cluster import redis_cluster  # noqa: F401 (a fixture)
from test_vllm_worker import (BS, IDENTITY, FakeRequest, attention_cache,
                              block_bytes, buffer_for)

# Polls of "ask again later" before a test gives up (a count, not a time).
POLLS = 600


def scheduler(daemon, name, cache, **extra):
    cfg = ConnectorConfig.parse({"socket": daemon.socket, "timeout_ms": 2000,
                                 **extra})
    layout = namespace_layout(cache, IDENTITY, 32)
    return cfg, layout, KvtierScheduler(cfg, name, layout, cache)


def store(daemon, name, cache, req, blocks, seed):
    """Engine A: stores `req`'s full blocks (those the tier lacks) from
    `blocks` of a buffer filled from `seed`; returns the blocks' bytes."""
    cfg, layout, sched = scheduler(daemon, name, cache)
    worker = KvtierWorker(cfg, name, layout, cache)
    worker.register(buffer_for(cache, seed=seed))
    first = sched.matched_tokens(req, 0) // BS
    n = len(blocks)
    ids = (list(blocks) + [0],)
    sched.after_alloc(req, ids, 0)  # computes it all: the hit's pin goes
    job = sched.plan_store(req.request_id, n * BS, ids)
    worker.store([job])
    report = worker.poll()
    assert report.stored == [(req.request_id, first, n - first)], report
    expected = [block_bytes(worker, b) for b in blocks]
    worker.close()
    sched.close()
    return expected


def ask_until_answered(sched, req):
    """matched_tokens until it is not None (at most POLLS times); returns
    the answer and how many times it was None."""
    waits = 0
    for _ in range(POLLS):
        hit = sched.matched_tokens(req, 0)
        if hit is not None:
            return hit, waits
        waits += 1
        time.sleep(0.05)
    pytest.fail(f"still 'ask again later' after {POLLS} asks")


# -- the helper and the switch ---------------------------------------------------

def test_redis_cluster_helper_starts_a_healthy_cluster(redis_cluster):  # noqa: F811
    assert len(redis_cluster.seeds.split(",")) == 3
    assert redis_cluster.healthy()
    # A key written through one node is read through another (redirected).
    redis_cluster.command(0, "set", "kvt:probe", "7", cluster_mode=True)
    assert redis_cluster.command(2, "get", "kvt:probe", cluster_mode=True).strip() == "7"


def test_cluster_switch_is_checked():
    assert ConnectorConfig.parse(None).cluster is False
    cfg = ConnectorConfig.parse({"cluster": True, "cluster_wait_ms": 500})
    assert cfg.cluster and cfg.cluster_wait_ms == 500
    with pytest.raises(ValueError, match=r"\['cluster'\]: expected bool, got int"):
        ConnectorConfig.parse({"cluster": 1})
    with pytest.raises(ValueError, match=r"\['cluster_wait_ms'\]: must be > 0"):
        ConnectorConfig.parse({"cluster_wait_ms": 0})


def test_cluster_switch_without_a_cluster_tier_answers_at_once(daemon):
    cache = attention_cache()
    req = FakeRequest("stored", list(range(3 * BS + 1)))
    store(daemon, "cluster-local", cache, req, (1, 2, 3), seed=3)
    _, _, sched = scheduler(daemon, "cluster-local", cache, cluster=True)
    hit = FakeRequest("hit", list(range(3 * BS + 1)))
    assert sched.matched_tokens(hit, 0) == 3 * BS  # never None
    assert sched.num_pinned == 1
    miss = FakeRequest("miss", list(range(1000, 1000 + 3 * BS + 1)))
    assert sched.matched_tokens(miss, 0) == 0
    stats = sched.stats.take()
    assert (stats["prefetches"], stats["prefetch_waits"]) == (0, 0)
    assert stats["lookups"] == 2 and stats["lookup_errors"] == 0
    for r in (hit, miss):
        sched.finished(r.request_id)
    assert sched.num_pinned == 0 and not sched._reqs
    sched.close()


# -- two daemons over one Redis Cluster -------------------------------------------

def cluster_daemons(redis_cluster, tmp_path):  # noqa: F811
    """Two kvtierd daemons over `redis_cluster`, sharing one key file, both
    writing every commit through to it."""
    key = key_file(tmp_path / "cluster.key")
    flags = [f"--cluster_redis={redis_cluster.seeds}", f"--cluster_key_file={key}",
             "--cluster_write_through"]
    return kvtier.Daemon(flags=flags), kvtier.Daemon(flags=flags)


def wait_remote_pages(daemon, name, cache, prompt, pages):
    """Polls (by count) a plain remote lookup on `daemon` (no prefetch)
    until its cluster tier holds `pages` pages of `prompt` past a local
    match of none."""
    layout = namespace_layout(cache, IDENTITY, 32)
    hashes = [bytes(h) for h in FakeRequest("p", prompt).block_hashes]
    with kvtier.Client(socket=daemon.socket, timeout_ms=2000) as probe:
        ns = probe.attach(name, layout)
        seen = None
        for _ in range(POLLS):
            with ns.lookup(hashes, pin=False, remote=True) as lease:
                seen = (lease.matched_pages, lease.remote_pages)
            if seen == (0, pages):
                return
            time.sleep(0.05)
    pytest.fail(f"{daemon.socket}: (local, remote) pages stayed {seen}, "
                f"not (0, {pages})")


def local_pages(daemon, name, cache, prompt) -> int:
    layout = namespace_layout(cache, IDENTITY, 32)
    with kvtier.Client(socket=daemon.socket, timeout_ms=2000) as c:
        ns = c.attach(name, layout)
        hashes = [bytes(h) for h in FakeRequest("p", prompt).block_hashes]
        with ns.lookup(hashes, pin=False) as lease:
            return lease.matched_pages

def test_ask_again_later_until_the_prefetch_lands(redis_cluster, tmp_path):  # noqa: F811
    cache = attention_cache()
    name = "cluster-vllm"
    a, b = cluster_daemons(redis_cluster, tmp_path)
    with a, b:
        prompt = list(range(5 * BS + 1))
        expected = store(a, name, cache, FakeRequest("a", prompt), (10, 11, 12, 13, 14),
                         seed=5)
        other = list(range(500, 500 + 2 * BS + 1))
        store(a, name, cache, FakeRequest("a2", other), (20, 21), seed=6)
        # Daemon A writes through to Redis: wait until daemon B's cluster
        # tier sees all 5 pages (and B holds none).
        wait_remote_pages(b, name, cache, prompt, 5)

        # Without the switch: no remote lookup, a miss at once.
        _, _, plain = scheduler(b, name, cache)
        assert plain.matched_tokens(FakeRequest("plain", other), 0) == 0
        plain.close()

        cfg, layout, sched = scheduler(b, name, cache, cluster=True)
        req = FakeRequest("b", prompt)
        assert sched.matched_tokens(req, 0) is None  # ask again later
        assert sched.num_pinned == 0
        hit, waits = ask_until_answered(sched, req)
        assert hit == 5 * BS, f"after {waits} more waits"
        stats = sched.stats.take()
        assert stats["prefetches"] == 1  # one prefetch for the request
        assert stats["prefetch_waits"] == 1 + waits
        assert stats["hit_tokens"] == 5 * BS

        # B's worker loads the prefetched rows: A's bytes.
        worker = KvtierWorker(cfg, name, layout, cache)
        worker.register(buffer_for(cache, seed=7))
        sched.after_alloc(req, ([3, 4, 5, 6, 7, 8],), 5 * BS)
        loads = sched.take_loads()
        assert [l.block_ids for l in loads] == [(3, 4, 5, 6, 7)]
        worker.load(loads)
        report = worker.poll()
        assert report.loaded == {"b"} and not report.failed_loads
        sched.on_report(report)
        assert [block_bytes(worker, blk) for blk in (3, 4, 5, 6, 7)] == expected

        # Now local: another request with the prompt is answered at once.
        again = FakeRequest("b2", prompt)
        assert sched.matched_tokens(again, 0) == 5 * BS
        assert sched.stats.take()["prefetches"] == 0
        for r in ("b", "b2"):
            sched.finished(r)
        assert sched.num_pinned == 0 and not sched._reqs  # forgotten
        worker.close()
        sched.close()


def test_a_prefetch_cut_short_answers_from_the_local_match(redis_cluster, tmp_path):  # noqa: F811
    cache = attention_cache()
    name = "cluster-vllm-cut"
    a, b = cluster_daemons(redis_cluster, tmp_path)
    with a, b:
        prompt = list(range(2000, 2000 + 5 * BS + 1))
        # Pages 0..2 first, then the whole prompt: the keys that appear in
        # between are those of pages 3 and 4 (A writes through each commit).
        store(a, name, cache, FakeRequest("a3", prompt[:3 * BS + 1]), (1, 2, 3), seed=8)
        wait_remote_pages(b, name, cache, prompt, 3)
        before = redis_cluster.keys()
        store(a, name, cache, FakeRequest("a5", prompt), (1, 2, 3, 4, 5), seed=8)
        wait_remote_pages(b, name, cache, prompt, 5)
        late = redis_cluster.keys() - before
        assert len(late) == 2, late  # pages 3 and 4, one rank
        for node, key in late:  # values that fail the daemon's MAC check
            redis_cluster.command(node, "set", key, "not a kvtier value")

        _, _, sched = scheduler(b, name, cache, cluster=True)
        req = FakeRequest("b", prompt)
        assert sched.matched_tokens(req, 0) is None  # the prefetch starts
        hit, waits = ask_until_answered(sched, req)
        # The prefetch committed pages 0..2 and stopped at page 3; the
        # request is not asked to wait again for what never comes.
        assert hit == 3 * BS, f"after {waits} more waits"
        assert local_pages(b, name, cache, prompt) == 3
        assert sched.matched_tokens(req, 0) == 3 * BS
        stats = sched.stats.take()
        assert stats["prefetches"] == 1 and stats["prefetch_errors"] == 0
        sched.finished("b")
        assert sched.num_pinned == 0 and not sched._reqs
        sched.close()
