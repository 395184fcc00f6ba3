"""kvtierd's cluster tier end to end across network namespaces (issue 17):
every host in a network namespace of its own, joined by a bridge in a
"switch" namespace (python/tests/netns.py), nothing mocked:

  r0 r1 r2   Redis masters         r3 r4 r5   their replicas
  a          node A's kvtierd (--cluster_write_through, KV events on its eth0)
  b          node B's kvtierd
  c          a KV-events subscriber (kv_events_subscriber.py, vLLM's classes)

Engines are kvtier.Client sessions of this process; they reach each daemon
through its unix socket, which crosses network namespaces, while the
daemons reach Redis (and the subscriber reaches A) only over the veths.

  1. A commits a prefix (known bytes in every bank row, token ids given);
     B finds it with a remote lookup, prefetches it and reads A's bytes.
  2. A value with one flipped byte is a miss: B's prefetch stops before it.
  3. Values planted in Redis without the cluster key (a well-formed value
     MAC'd under another key, random bytes, a valid value moved under
     another page's key) are misses, never served; a control planted with
     the right key is served, so the refusals are the key's doing.
  4. A master and its replica killed (no failover possible): B's remote
     lookups keep answering, degraded to the pages the other masters hold;
     B prefetches those; once the nodes return, new pages are found. The
     same with the master's host also off the wire (its switch port down:
     connections time out instead of being refused): a lookup too hurried
     for a connect leaves the retries to the daemon's prober.
  5. A master killed while its replica takes over: lookups and prefetches
     go on once the failover is seen; new pages are written and found.
  6. The subscriber in c decodes A's KV events for a commit, live and
     through the replay socket: block hashes, token ids, medium "CPU"; and
     the "STORAGE" block A announces for each page it wrote through.

Polls are bounded by count; durations are printed, never asserted. Needs
root, iproute2, redis-server and redis-cli: skipped without them unless
KVTIER_REQUIRE_NETNS=1 / KVTIER_REQUIRE_REDIS=1. Runs in the vLLM venv
(ctest label vllm) for the subscriber's vLLM classes.
"""

import contextlib
import ctypes
import dataclasses
import hashlib
import json
import os
import queue
import secrets
import statistics
import subprocess
import sys
import threading
import time

import pytest

import kvtier

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))

import cluster_values as cv  # noqa: E402
from netns import Topology, require_netns  # noqa: E402
from netns_redis import (NetnsRedisCluster, key_file, netns_daemon,  # noqa: E402
                         read_key)
from redis_cluster import require_redis  # noqa: E402

MASTERS, REPLICAS = ["r0", "r1", "r2"], ["r3", "r4", "r5"]
TPP = 16
BANKS = (kvtier.BankLayout("kv", 32768, "bfloat16"),
         kvtier.BankLayout("scale", 256, "float32"))
LAYOUT = kvtier.Layout(tokens_per_page=TPP, num_layers=2, page_banks=BANKS,
                       model="netns-llama")
ROWS = 256
POLLS = 400  # of remote lookups, 50 ms apart, before a test gives up
EVENTS_PORT, REPLAY_PORT = 5557, 5558


@dataclasses.dataclass
class World:
    topo: Topology
    redis: NetnsRedisCluster
    a: kvtier.Daemon
    b: kvtier.Daemon
    key: bytes  # the cluster key the daemons share


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    require_netns()
    require_redis()
    work = str(tmp_path_factory.mktemp("netns"))
    with contextlib.ExitStack() as stack:
        topo = stack.enter_context(Topology(MASTERS + REPLICAS + ["a", "b", "c"]))
        redis = stack.enter_context(NetnsRedisCluster(topo, MASTERS, REPLICAS))
        key = key_file(os.path.join(work, "cluster.key"))
        common = [f"--cluster_redis={redis.seeds}", f"--cluster_key_file={key}",
                  f"--cluster_user={redis.user}",
                  f"--cluster_password_file={redis.password_file(work + '/pw')}"]
        a_ip = topo.addr("a")
        a = stack.enter_context(netns_daemon(topo, "a", work, common + [
            "--cluster_write_through",
            f"--kv_events_endpoint=tcp://{a_ip}:{EVENTS_PORT}",
            f"--kv_events_replay_endpoint=tcp://{a_ip}:{REPLAY_PORT}"]))
        b = stack.enter_context(netns_daemon(topo, "b", work, common))
        yield World(topo, redis, a, b, read_key(key))


@pytest.fixture
def engines(world, request):
    """An engine on node A and one on node B, each attached to a namespace
    of the test's own name (one per test)."""
    name = "netns-" + hashlib.sha256(request.node.name.encode()).hexdigest()[:12]
    with kvtier.Client(socket=world.a.socket, name="engine-a", timeout_ms=5000) as ca, \
            kvtier.Client(socket=world.b.socket, name="engine-b", timeout_ms=5000) as cb:
        yield ca.attach(name, LAYOUT, page_rows=ROWS), cb.attach(name, LAYOUT, page_rows=ROWS)


# -- pages -----------------------------------------------------------------------

def tokens(tag: str, pages: int) -> list[int]:
    seed = int.from_bytes(hashlib.sha256(tag.encode()).digest()[:4], "little")
    return [(seed + 7919 * i) % 150000 for i in range(pages * TPP)]


def content(tag: str, page: int) -> list[bytes]:
    """The known bytes of page `page` of prefix `tag`, one row per bank."""
    return [hashlib.shake_256(f"{tag}/{page}/{b.name}".encode()).digest(b.row_bytes)
            for b in BANKS]


def commit(ns, toks: list[int], tag: str) -> list[bytes]:
    """Commits every full page of `toks`, page p holding content(tag, p),
    with their token ids; returns the pages' hashes."""
    hashes = ns.hash_tokens(toks)
    res = ns.reserve(len(hashes))
    banks = ns.page_banks
    for p, row in enumerate(res.page_rows):
        for bank, data in zip(banks, content(tag, p)):
            ctypes.memmove(bank.row_address(row), data, len(data))
    res.commit(hashes, token_ids=toks[:len(hashes) * TPP])
    return hashes


def read_local(ns, hashes) -> list[list[bytes]]:
    """Every bank row of the pages `ns`'s node holds of `hashes` (pinned
    while read)."""
    with ns.lookup(hashes, pin=True) as lease:
        return [[bank.read_row(r) for bank in ns.page_banks] for r in lease.rows]


def remote(ns, hashes) -> tuple[int, int, int]:
    """(matched, remote, prefetching) pages of a remote lookup."""
    with ns.lookup(hashes, pin=False, remote=True) as lease:
        return lease.matched_pages, lease.remote_pages, lease.prefetching_pages


def wait_remote(ns, hashes, want: int, polls: int = POLLS) -> list[float]:
    """Remote lookups (bounded by count) until the cluster tier holds `want`
    pages past the local match; returns each lookup's milliseconds (to
    print). Fails with the last answer."""
    took, seen = [], None
    for _ in range(polls):
        t0 = time.perf_counter()
        seen = remote(ns, hashes)
        took.append((time.perf_counter() - t0) * 1e3)
        if seen[1] == want:
            return took
        time.sleep(0.05)
    pytest.fail(f"(matched, remote, prefetching) stayed {seen}; want remote {want}")


def prefetch(ns, hashes) -> tuple[int, list]:
    """Prefetches `hashes` and waits (bounded) until nothing of them is
    being prefetched; again while a round made progress and the tier holds
    more (a probe cut by --cluster_lookup_deadline_ms). Returns the pages
    then matched locally and the PrefetchResults."""
    results, matched = [], remote(ns, hashes)[0]
    for _ in range(8):
        res = ns.prefetch(hashes)
        results.append(res)
        if res.remote_pages == 0 and res.prefetching_pages == 0:
            break
        for _ in range(POLLS):
            m, _, p = remote(ns, hashes)
            if p == 0:
                break
            time.sleep(0.05)
        else:
            pytest.fail(f"still prefetching after {POLLS} polls")
        if m in (matched, len(hashes)):
            matched = m
            break
        matched = m
    return matched, results


def status(daemon) -> dict:
    ctl = os.environ.get("KVTIERCTL") or os.path.join(
        os.path.dirname(kvtier.find_kvtierd()), "..", "cli", "kvtierctl")
    out = subprocess.run([ctl, f"--socket={daemon.socket}", "--json", "status"],
                         check=True, capture_output=True, text=True, timeout=60)
    return json.loads(out.stdout)


def cluster_status(daemon) -> dict:
    return status(daemon).get("cluster", {})


def counter(daemon, field: str) -> int:
    return int(cluster_status(daemon).get(field, 0))


# -- 1. across the wire ------------------------------------------------------------

def test_b_prefetches_what_a_wrote_through(world, engines):
    na, nb = engines
    toks = tokens("roundtrip", 12)
    hashes = commit(na, toks, "roundtrip")
    took = wait_remote(nb, hashes, 12)
    print(json.dumps({"remote_lookup_ms": [round(t, 2) for t in took[-3:]]}))
    # The formula of daemon/cluster_value.h names the keys A wrote.
    key = cv.page_key(na, hashes[5])
    assert world.redis.command("r0", "exists", key, cluster_mode=True).strip() == "1"

    fetched = counter(world.b, "fetched_values")
    matched, results = prefetch(nb, hashes)
    assert (results[0].local_pages, results[0].remote_pages > 0) == (0, True), results
    assert matched == 12
    assert read_local(nb, hashes) == [content("roundtrip", p) for p in range(12)]
    assert counter(world.b, "fetched_values") >= fetched + 12
    assert remote(nb, hashes) == (12, 0, 0)  # local now: nothing past it


def test_b_reports_its_cluster_tier(world, engines):
    na, nb = engines
    hashes = commit(na, tokens("status", 3), "status")
    wait_remote(nb, hashes, 3)
    assert prefetch(nb, hashes)[0] == 3
    st = cluster_status(world.b)
    assert st["enabled"] and not st.get("write_through", False)
    assert cluster_status(world.a)["write_through"]
    assert st["covered_slots"] == 16384
    masters = sorted(n["address"] for n in st["nodes"] if n.get("master"))
    assert masters == sorted(world.redis.address(h) for h in MASTERS)
    assert all(n.get("up") for n in st["nodes"] if n.get("master"))
    assert int(st["prefetched_pages"]) >= 3
    # Prometheus, scraped inside B's namespace (its loopback).
    text = world.topo.run("b", [sys.executable, "-c",
                                "import urllib.request, sys; sys.stdout.write("
                                "urllib.request.urlopen('http://127.0.0.1:9464"
                                "/metrics', timeout=30).read().decode())"]).stdout
    pages = [l for l in text.splitlines()
             if l.startswith("kvtier_cluster_prefetched_pages_total")]
    assert pages and float(pages[0].split()[-1]) >= 3, pages
    assert 'kvtier_cluster_redis_covered_slots 16384' in text


# -- 2. and 3. values that fail their check ----------------------------------------

def flip_byte(world, key: str, offset: int) -> None:
    """Flips the low bit of byte `offset` of `key`'s value, in Redis."""
    script = ("local v = redis.call('GET', KEYS[1]) "
              "local i = tonumber(ARGV[1]) "
              "return redis.call('SETRANGE', KEYS[1], i, "
              "string.char(bit.bxor(string.byte(v, i + 1), 1)))")
    world.redis.command("r0", "eval", script, 1, key, offset, via="b",
                        cluster_mode=True)


def plant(world, key: str, value: bytes) -> None:
    world.redis.command("r0", "set", key, via="c", cluster_mode=True, stdin=value)


def get_value(world, key: str) -> bytes:
    out = world.redis.command("r0", "get", key, via="c", cluster_mode=True, raw=True)
    assert out.endswith(b"\n")
    return out[:-1]  # redis-cli ends the reply with a newline


def test_a_corrupted_value_ends_the_prefetch_before_it(world, engines):
    na, nb = engines
    hashes = commit(na, tokens("corrupt", 8), "corrupt")
    wait_remote(nb, hashes, 8)
    key = cv.page_key(na, hashes[5])
    good = get_value(world, key)
    # One byte in the middle of the "kv" row (past the header).
    flip_byte(world, key, cv.header_bytes(len(BANKS)) + 1000)
    bad = get_value(world, key)
    assert len(bad) == len(good) and bad != good
    rejected = counter(world.b, "rejected_values")
    matched, _ = prefetch(nb, hashes)
    assert matched == 5
    assert read_local(nb, hashes) == [content("corrupt", p) for p in range(5)]
    assert counter(world.b, "rejected_values") > rejected
    # Asked again, still never served.
    assert prefetch(nb, hashes)[0] == 5


@pytest.mark.parametrize("kind", ["control", "other_key", "random", "moved"])
def test_a_value_planted_without_the_key_is_a_miss(world, engines, kind):
    """Pages 0..2 written by A; page 3 planted (`kind`); page 4 planted with
    the right key. Only the control makes the chain go past page 3."""
    na, nb = engines
    toks = tokens(f"plant-{kind}", 5)
    commit(na, toks[:3 * TPP], f"plant-{kind}")
    hashes = na.hash_tokens(toks)
    wait_remote(nb, hashes, 3)
    fp = cv.layout_fingerprint(LAYOUT)

    def planted(page, secret):
        digest = cv.key_digest(na.name, fp, hashes[page])
        return cv.encode_value(secret, fp, digest, 0, content("planted", page))

    other = secrets.token_hex(32).encode()
    bad = {"control": planted(3, world.key),
           "other_key": planted(3, other),
           "random": secrets.token_bytes(len(planted(3, world.key))),
           "moved": get_value(world, cv.page_key(na, hashes[1]))}[kind]
    plant(world, cv.page_key(na, hashes[3]), bad)
    plant(world, cv.page_key(na, hashes[4]), planted(4, world.key))
    wait_remote(nb, hashes, 5)
    rejected = counter(world.b, "rejected_values")
    matched, _ = prefetch(nb, hashes)
    rows = read_local(nb, hashes)
    assert rows[:3] == [content(f"plant-{kind}", p) for p in range(3)]
    if kind == "control":
        assert matched == 5
        assert rows[3:] == [content("planted", 3), content("planted", 4)]
        assert counter(world.b, "rejected_values") == rejected
    else:
        assert matched == 3
        assert counter(world.b, "rejected_values") > rejected


# -- 6. KV events, read in a third namespace -----------------------------------------

SUBSCRIBER = os.path.join(HERE, "kv_events_subscriber.py")


def read_lines(proc) -> queue.Queue:
    """A queue of the JSON lines `proc` prints (None at its end); other
    lines (a library's log) are skipped."""
    q: queue.Queue = queue.Queue()

    def pump():
        for line in proc.stdout:
            if line.startswith("{"):
                q.put(json.loads(line))
        q.put(None)
    threading.Thread(target=pump, daemon=True).start()
    return q


def stored(batch) -> list[dict]:
    return [e for e in (batch or {}).get("events", []) if e["type"] == "BlockStored"]


def test_a_router_in_another_namespace_decodes_the_events(world, engines):
    na, _ = engines
    a_ip = world.topo.addr("a")
    env = dict(os.environ, VLLM_CONFIGURE_LOGGING="0")
    sub = world.topo.popen("c", [sys.executable, SUBSCRIBER, "live",
                                 f"tcp://{a_ip}:{EVENTS_PORT}", na.name],
                           stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                           text=True, env=env)
    lines = read_lines(sub)
    assert lines.get(timeout=300) == {"ready": True}
    # A subscription reaches the publisher a moment after connect (ZMQ's slow
    # joiner): commit one-page probes until one arrives (bounded by count).
    probe_seq = None
    for i in range(100):
        probe = commit(na, tokens(f"probe-{i}", 1), f"probe-{i}")
        with contextlib.suppress(queue.Empty):
            while probe_seq is None:
                batch = lines.get(timeout=0.3)
                assert batch is not None, "the subscriber ended"
                if any(e["block_hashes"] == [probe[0].hex()] for e in stored(batch)):
                    probe_seq = batch["seq"]
        if probe_seq is not None:
            break
    assert probe_seq is not None, "no probe's event reached the subscriber"

    # The commit (medium CPU, one chain), then, as A writes each page
    # through to Redis, one STORAGE block per page with its parent and tokens.
    toks = tokens("events", 6)
    hashes = commit(na, toks, "events")
    hexes = [h.hex() for h in hashes]
    cpu, storage = [], {}
    for _ in range(200):
        batch = lines.get(timeout=60)
        assert batch is not None, "the subscriber ended"
        assert batch["topic"] == na.name and batch["seq"] > probe_seq
        for e in stored(batch):
            if e["medium"] == "CPU" and e["block_hashes"][:1] == hexes[:1]:
                cpu.append((batch["seq"], e))
            elif e["medium"] == "STORAGE" and e["block_hashes"][0] in hexes:
                storage[e["block_hashes"][0]] = e
        if cpu and len(storage) == len(hexes):
            break
    else:
        pytest.fail(f"{len(cpu)} CPU and {len(storage)} STORAGE events arrived")
    [(seq, e)] = cpu
    assert e["block_hashes"] == hexes
    assert e["parent_block_hash"] is None
    assert e["token_ids"] == toks
    assert e["block_size"] == TPP
    for p, h in enumerate(hexes):
        s = storage[h]
        assert s["block_hashes"] == [h]
        assert s["parent_block_hash"] == (hexes[p - 1] if p else None)
        assert s["token_ids"] == toks[p * TPP:(p + 1) * TPP]
        assert s["block_size"] == TPP
    sub.stdin.close()
    assert sub.wait(timeout=60) == 0

    # The replay socket, over the same wire, holds the same batch.
    out = world.topo.run("c", [sys.executable, SUBSCRIBER, "replay",
                               f"tcp://{a_ip}:{REPLAY_PORT}", "0"],
                         timeout=300, env=env).stdout
    replayed = [json.loads(l) for l in out.splitlines() if l.startswith("{")]
    assert replayed[-1] == {"end": True}
    again = [r for r in replayed[:-1] if r["seq"] == seq]
    assert len(again) == 1 and e in again[0]["events"]


# -- 4. and 5. Redis nodes going away ------------------------------------------------

def owners(world, ns, hashes, nodes=None) -> list[str]:
    """The host of the master holding each page's key, as the cluster sees
    it now (or as `nodes`, an earlier NetnsRedisCluster.nodes(), saw it)."""
    masters = [n for n in nodes or world.redis.nodes()
               if n["master"] and not n["failed"]]

    def owner(slot):
        return next(n["host"] for n in masters
                    if any(lo <= slot <= hi for lo, hi in n["slots"]))
    return [owner(cv.key_slot(cv.page_key(ns, h))) for h in hashes]


def write_until_found(world, na, nb, tag: str, pages: int = 12):
    """A commits fresh prefixes (at most 10) until B's cluster tier holds
    one whole: A's daemon retries a node it saw fail only after a while, so
    a page written right after the node's return may be lost (a spill is
    never retried). Returns that prefix's content tag and hashes."""
    for attempt in range(10):
        t = f"{tag}-{attempt}"
        hashes = commit(na, tokens(t, pages), t)
        for _ in range(100):
            if remote(nb, hashes)[1] == pages:
                return t, hashes
            time.sleep(0.05)
    pytest.fail(f"B never found a whole {pages}-page prefix A wrote")


def lookup_ms(nb, hashes, n: int) -> list[float]:
    took = []
    for _ in range(n):
        t0 = time.perf_counter()
        remote(nb, hashes)
        took.append((time.perf_counter() - t0) * 1e3)
    return took


def master_down(world, engines, tag: str, off_the_wire: bool) -> None:
    """A master and its replica die (no failover possible), and with
    `off_the_wire` the master's host drops off the wire too (connections to
    it time out instead of being refused). B's remote lookups keep
    answering, with the pages up to the first one on the dead master; B
    prefetches those. Once the nodes return (empty: nothing is kept on
    disk), a new prefix is written and found whole."""
    na, nb = engines
    redis, topo = world.redis, world.topo
    hashes = commit(na, tokens(tag, 12), tag)
    wait_remote(nb, hashes, 12)
    nodes = redis.nodes()
    owner = owners(world, na, hashes, nodes)
    j = next(i for i, o in enumerate(owner) if o != owner[0])  # 3^-11: never all one
    victim = owner[j]
    replica = next(r for r, m in redis.replica_of().items() if m == victim)
    redis.kill(replica)
    redis.kill(victim)
    if off_the_wire:
        topo.set_link(victim, up=False)
    try:
        took = wait_remote(nb, hashes, j)
        for _ in range(10):  # and it stays so
            assert remote(nb, hashes) == (0, j, 0)
        took += lookup_ms(nb, hashes, 20)
        print(json.dumps({"degraded_lookups": len(took), "off_the_wire": off_the_wire,
                          "median_ms": round(statistics.median(took), 2),
                          "max_ms": round(max(took), 2)}))
        node = [n for n in cluster_status(world.b)["nodes"]
                if n["address"] == redis.address(victim)]
        assert node and not node[0].get("up") and node[0].get("last_error"), node
        assert prefetch(nb, hashes)[0] == j
        assert read_local(nb, hashes) == [content(tag, p) for p in range(j)]
        # A keeps writing through: B finds the new prefix up to its first
        # page on the dead master.
        later = commit(na, tokens(tag + "-later", 12), tag + "-later")
        lo = owners(world, na, later, nodes)
        wait_remote(nb, later, next((i for i, o in enumerate(lo) if o == victim), 12))
    finally:
        if off_the_wire:
            topo.set_link(victim, up=True)
        redis.restart(victim)
        redis.restart(replica)
        redis.wait_healthy()
    back_tag, back = write_until_found(world, na, nb, tag + "-back")
    assert victim in owners(world, na, back)  # pages on the returned master
    assert prefetch(nb, back)[0] == 12
    assert read_local(nb, back) == [content(back_tag, p) for p in range(12)]


def test_a_dead_master_degrades_lookups_to_the_live_ones(world, engines):
    master_down(world, engines, "down", off_the_wire=False)


def test_a_master_off_the_wire_degrades_lookups_to_the_live_ones(world, engines):
    master_down(world, engines, "offwire", off_the_wire=True)


def test_a_replica_takes_over_and_lookups_go_on(world, engines):
    na, nb = engines
    redis = world.redis
    hashes = commit(na, tokens("failover", 12), "failover")
    wait_remote(nb, hashes, 12)
    victim = owners(world, na, hashes)[0]
    replica = next(r for r, m in redis.replica_of().items() if m == victim)
    redis.wait_for(f"{replica} in sync with {victim}", lambda: redis.synced(victim))
    redis.kill(victim)
    # B's lookups go on through the failover: short (or none) while the
    # master is gone, whole once B's slot map names the replica.
    took = wait_remote(nb, hashes, 12, polls=2 * POLLS)
    other = next(m for m in MASTERS if m != victim)
    assert any(n["host"] == replica and n["master"] and n["slots"]
               for n in redis.nodes(via=other))
    print(json.dumps({"lookups_until_failover_seen": len(took),
                      "median_ms": round(statistics.median(took), 2)}))
    assert prefetch(nb, hashes)[0] == 12
    assert read_local(nb, hashes) == [content("failover", p) for p in range(12)]
    tag, after = write_until_found(world, na, nb, "after-failover")
    assert replica in owners(world, na, after)  # pages on the new master
    assert prefetch(nb, after)[0] == 12
    assert read_local(nb, after) == [content(tag, p) for p in range(12)]
    # The old master returns as the new master's replica.
    redis.restart(victim)
    redis.wait_healthy()
    assert redis.replica_of().get(victim) == replica
