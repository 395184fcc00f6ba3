"""Tests of kvtier's ctypes bindings against a real kvtierd: hashing, lookup,
reserve/commit, page and snapshot transfers of torch tensors (the reference
backend on CPU, the CUDA backend where a GPU exists), errors, handle
lifetimes, and the cluster tier's remote lookup and prefetch against a
daemon without one."""

import os
import subprocess
import sys
import time

import pytest
import torch

import kvtier
from conftest import child_env

PAGE = 4  # tokens per page


def kv_pool(pages=8, layers=2, heads=2, dim=16, device="cpu", seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(pages, PAGE, heads, dim, generator=g, dtype=torch.float32)
            .to(torch.bfloat16).to(device) for _ in range(2 * layers)]


def snapshot_slots(slots=2, device="cpu", seed=1):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(slots, 4, 8, generator=g).to(device),           # 128 B
            torch.randn(slots, 16, generator=g).to(torch.bfloat16).to(device)]  # 32 B


def attach(client, name, pool, **kw):
    return client.attach(name, pool.layout(model=name), page_rows=kw.pop("page_rows", 32), **kw)


def page_bytes(tensors, page):
    return b"".join(t[page].contiguous().view(torch.uint8).numpy().tobytes()
                    for t in tensors)


# ------------------------------------------------------------------ loading


def test_library_loads_from_kvtier_lib_and_reports_version():
    assert kvtier.library_version() == "0.1.0"
    if os.environ.get("KVTIER_LIB"):
        assert kvtier.library_path() == os.path.realpath(os.environ["KVTIER_LIB"])


def test_bad_kvtier_lib_names_the_path():
    code = "import kvtier; kvtier.library_version()"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       env=child_env(KVTIER_LIB="/nonexistent/libkvtier.so"))
    assert r.returncode != 0
    assert "/nonexistent/libkvtier.so: no such file" in r.stderr


def test_connect_without_daemon_raises_unavailable(tmp_path):
    with pytest.raises(kvtier.KvtierError) as e:
        kvtier.Client(socket=str(tmp_path / "none.sock"), timeout_ms=300)
    assert isinstance(e.value, (kvtier.UnavailableError, kvtier.DeadlineExceededError))
    assert e.value.message


# ------------------------------------------------------------- namespaces


def test_attach_derives_layout_from_tensors(client):
    k = kv_pool(pages=8, layers=3, heads=2, dim=16)
    pool = kvtier.TorchPool({"kv": k})
    layout = pool.layout(model="m")
    assert layout.tokens_per_page == PAGE
    assert layout.num_layers == 3
    assert layout.page_banks == (kvtier.BankLayout("kv", 6 * PAGE * 2 * 16 * 2, "bfloat16"),)
    ns = client.attach("layout", layout, page_rows=16)
    [bank] = ns.page_banks
    assert (bank.name, bank.rows, bank.row_bytes) == ("kv", 16, layout.page_banks[0].row_bytes)
    assert ns.snapshot_bank is None
    assert ns.hash_bytes == 32


def test_attach_with_contradicting_layout_fails_and_names_the_field(client):
    pool = kvtier.TorchPool({"kv": kv_pool()})
    attach(client, "contra", pool)
    other = kvtier.TorchPool({"kv": kv_pool(dim=32)})
    with pytest.raises(kvtier.KvtierError) as e:
        attach(client, "contra", other)
    assert "row_bytes" in e.value.message or "layout" in e.value.message


def test_kv_pool_tensors_splits_stacked_kv():
    stacked = [torch.zeros(2, 8, PAGE, 2, 16) for _ in range(3)]
    flat = kvtier.kv_pool_tensors(stacked)
    assert len(flat) == 6
    assert all(t.shape == (8, PAGE, 2, 16) for t in flat)
    assert kvtier.TorchPool({"kv": flat}).layout().num_layers == 3
    pairs = kvtier.kv_pool_tensors([(torch.zeros(8, 4), torch.zeros(8, 4))])
    assert len(pairs) == 2


def test_torch_pool_rejects_bad_tensors():
    with pytest.raises(ValueError, match=r"banks\['kv'\]\[1\]: 4 pages, the pool has 8"):
        kvtier.TorchPool({"kv": [torch.zeros(8, 16), torch.zeros(4, 16)]})
    with pytest.raises(ValueError, match=r"must be contiguous"):
        kvtier.TorchPool({"kv": [torch.zeros(16, 8).t()]})
    with pytest.raises(ValueError, match=r"snapshot\[1\]: 3 slots"):
        kvtier.TorchPool({"kv": [torch.zeros(8, 16)]},
                         snapshot=[torch.zeros(2, 16), torch.zeros(3, 16)])
    with pytest.raises(ValueError, match=r"tokens_per_page"):
        kvtier.TorchPool({"kv": [torch.zeros(8, 16)] * 2}).layout()


def test_misaligned_pool_is_rejected_naming_the_tensor(client):
    pool = kvtier.TorchPool({"kv": kv_pool()}, snapshot=[torch.zeros(2, 3, 5)])
    ns = attach(client, "misaligned", pool, snapshot_rows=4)
    with pytest.raises(kvtier.InvalidArgumentError, match=r"snapshot\[0\]\.page_stride"):
        ns.transfer(pool)


# ---------------------------------------------------------------- hashing


def test_hash_tokens_chains_and_skips_partial_pages(client):
    ns = attach(client, "hash", kvtier.TorchPool({"kv": kv_pool()}))
    tokens = list(range(100, 100 + 3 * PAGE + 2))
    h = ns.hash_tokens(tokens)
    assert len(h) == 3 and all(len(x) == 32 for x in h)
    assert ns.hash_tokens(torch.tensor(tokens)) == h
    assert ns.hash_tokens(tokens[PAGE:], parent=h[0]) == h[1:]
    assert ns.hash_tokens(tokens[:PAGE]) == h[:1]
    assert ns.hash_tokens(tokens, extra_key=b"lora-1") != h
    assert ns.hash_tokens([]) == []
    with pytest.raises(ValueError, match=r"tokens\[1\]"):
        ns.hash_tokens([1, 2**40])


def test_xxh3_namespaces_have_16_byte_hashes(client):
    pool = kvtier.TorchPool({"kv": kv_pool()})
    ns = client.attach("xxh3", pool.layout(hash_kind="xxh3_128"), page_rows=8)
    assert ns.hash_bytes == 16
    assert len(ns.hash_tokens(list(range(PAGE)))[0]) == 16
    with pytest.raises(ValueError, match="hash_kind"):
        client.attach("bad", pool.layout(hash_kind="md5"))


# ----------------------------------------------------- pages and snapshots


def test_evict_commit_lookup_rehydrate_roundtrip_on_cpu(client):
    k = kv_pool(pages=8)
    pool = kvtier.TorchPool({"kv": k})
    ns = attach(client, "roundtrip", pool)
    xfer = ns.transfer(pool)
    assert xfer.backend == "reference"
    tokens = list(range(3 * PAGE))
    h = ns.hash_tokens(tokens)
    with ns.lookup(h) as miss:
        assert (miss.matched_pages, miss.usable_pages, miss.rows) == (0, 0, [])

    res = ns.reserve(3)
    assert len(res.page_rows) == 3
    xfer.evict([5, 2, 7], res.page_rows)
    [bank] = ns.page_banks
    for page, row in zip([5, 2, 7], res.page_rows):
        assert bank.read_row(row) == page_bytes(k, page)  # the row format
    result = res.commit(h)
    assert result == kvtier.CommitResult(3, 0, 0, 0)

    saved = [t.clone() for t in k]
    for t in k:
        t.zero_()
    lease = ns.lookup(h + ns.hash_tokens(list(range(50, 50 + PAGE)), parent=h[-1]))
    assert (lease.matched_pages, lease.usable_pages) == (3, 3)
    xfer.rehydrate([0, 1, 2], lease.rows)
    lease.release()
    for t, s in zip(k, saved):
        assert torch.equal(t[0], s[5]) and torch.equal(t[1], s[2]) and torch.equal(t[2], s[7])
        assert not t[3:].any()


def test_commit_dedups_and_continues_chains(client):
    pool = kvtier.TorchPool({"kv": kv_pool()})
    ns = attach(client, "dedup", pool)
    xfer = ns.transfer(pool)
    h = ns.hash_tokens(list(range(4 * PAGE)))
    with ns.reserve(2) as res:
        xfer.evict([0, 1], res.page_rows)
        assert res.commit(h[:2]).committed_pages == 2
    with ns.reserve(2) as res:
        xfer.evict([0, 1], res.page_rows)
        assert res.commit(h[:2]).deduplicated_pages == 2
    with ns.reserve(2) as res:
        xfer.evict([2, 3], res.page_rows)
        pending = res.commit_after(None, h[2:], parent=h[1])
    assert pending.wait().committed_pages == 2
    with ns.lookup(h) as lease:
        assert lease.matched_pages == 4


def test_snapshots_save_restore_and_bound_the_usable_match(client):
    k, snap = kv_pool(), snapshot_slots()
    pool = kvtier.TorchPool({"kv": k}, snapshot=snap)
    ns = attach(client, "hybrid", pool, snapshot_rows=4)
    assert ns.snapshot_bank.row_bytes == pool.snapshot_row_bytes == 160
    xfer = ns.transfer(pool)
    h = ns.hash_tokens(list(range(3 * PAGE)))
    res = ns.reserve(3, 1)
    xfer.evict([0, 1, 2], res.page_rows)
    xfer.save_snapshot(1, res.snapshot_rows[0])
    assert ns.snapshot_bank.read_row(res.snapshot_rows[0]) == page_bytes(snap, 1)
    r = res.commit(h, snapshots=[(0, h[1])])  # the state after page 1
    assert (r.committed_pages, r.committed_snapshots) == (3, 1)

    saved = [t.clone() for t in snap]
    for t in snap:
        t.zero_()
    with ns.lookup(h) as lease:
        assert (lease.matched_pages, lease.usable_pages) == (3, 2)
        assert lease.has_snapshot and len(lease.rows) == 2
        xfer.restore_snapshot(0, lease.snapshot_row)
    for t, s in zip(snap, saved):
        assert torch.equal(t[0], s[1])


def test_reservation_context_aborts_and_returns_rows(client):
    pool = kvtier.TorchPool({"kv": kv_pool()})
    ns = attach(client, "abort", pool, page_rows=8)
    with ns.reserve(8) as res:
        assert len(res.page_rows) == 8
    with ns.reserve(8) as res:  # all rows came back
        res.abort()
        res.abort()  # idempotent
    with pytest.raises(ValueError, match="closed"):
        res.commit([])


def test_stream_ordered_abort_returns_the_rows(client):
    pool = kvtier.TorchPool({"kv": kv_pool()})
    ns = attach(client, "abort-after", pool, page_rows=8)
    res = ns.reserve(8)
    # No GPU here: an int stream is CUDA's "after what is queued", which on a
    # host without a device is now.
    res.abort(stream=1)
    assert res.closed
    deadline = time.monotonic() + 30
    while True:  # the abort runs on libkvtier's worker thread
        try:
            ns.reserve(8).abort()
            break
        except kvtier.ResourceExhaustedError:
            assert time.monotonic() < deadline, "rows never came back"
            time.sleep(0.01)


def test_client_instance_must_be_16_bytes(daemon):
    with pytest.raises(ValueError, match="16 bytes"):
        kvtier.Client(socket=daemon.socket, instance=b"short")
    # Two processes' worth of sessions under one instance.
    with kvtier.Client(socket=daemon.socket, instance=bytes(16)) as a, \
            kvtier.Client(socket=daemon.socket, instance=bytes(16)) as b:
        assert a.session_id != b.session_id


def test_bad_arguments_raise_and_change_nothing(client):
    k = kv_pool()
    pool = kvtier.TorchPool({"kv": k})
    ns = attach(client, "badargs", pool, page_rows=8)
    xfer = ns.transfer(pool)
    with pytest.raises(kvtier.InvalidArgumentError, match=r"exceeds the bank's 8 rows"):
        ns.reserve(9)
    before = [t.clone() for t in k]
    with pytest.raises(kvtier.InvalidArgumentError, match=r"gpu_pages\[1\]"):
        xfer.rehydrate([0, 99], [0, 1])
    assert all(torch.equal(a, b) for a, b in zip(k, before))
    with pytest.raises(ValueError, match="2 pages but 1 rows"):
        xfer.evict([0, 1], [0])
    with pytest.raises(kvtier.FailedPreconditionError):
        xfer.save_snapshot(0, 0)  # the pool has no snapshot segments
    with ns.reserve(2) as res:
        with pytest.raises(kvtier.InvalidArgumentError, match="hashes"):
            res.commit(ns.hash_tokens(list(range(3 * PAGE))))
        assert res.commit(ns.hash_tokens(list(range(2 * PAGE)))).committed_pages == 2
    with pytest.raises(ValueError, match=r"hashes\[0\]: 3 bytes"):
        ns.lookup([b"abc"])


def test_closing_the_client_closes_its_handles(daemon):
    c = kvtier.Client(socket=daemon.socket)
    pool = kvtier.TorchPool({"kv": kv_pool()})
    ns = attach(c, "close", pool)
    xfer = ns.transfer(pool)
    lease = ns.lookup(ns.hash_tokens(list(range(PAGE))))
    res = ns.reserve(1)
    c.close()
    assert c.closed and ns.closed and xfer.closed and lease.closed and res.closed
    c.close()  # idempotent
    with pytest.raises(ValueError, match="closed"):
        ns.reserve(1)


def test_a_new_process_finds_what_an_exited_one_committed(daemon, tmp_path):
    script = tmp_path / "writer.py"
    script.write_text(f"""
import sys, torch, kvtier
k = [torch.full((8, {PAGE}, 2, 16), float(i + 1), dtype=torch.bfloat16) for i in range(4)]
pool = kvtier.TorchPool({{"kv": k}})
with kvtier.Client(socket=sys.argv[1]) as c:
    ns = c.attach("restart", pool.layout(model="restart"), page_rows=32)
    res = ns.reserve(2)
    ns.transfer(pool).evict([3, 4], res.page_rows)
    res.commit(ns.hash_tokens(list(range(2 * {PAGE}))))
""")
    subprocess.run([sys.executable, str(script), daemon.socket], check=True,
                   env=child_env())
    k = [torch.zeros(8, PAGE, 2, 16, dtype=torch.bfloat16) for _ in range(4)]
    pool = kvtier.TorchPool({"kv": k})
    with kvtier.Client(socket=daemon.socket) as c:
        ns = c.attach("restart", pool.layout(model="restart"), page_rows=32)
        with ns.lookup(ns.hash_tokens(list(range(2 * PAGE)))) as lease:
            assert lease.usable_pages == 2
            ns.transfer(pool).rehydrate([0, 1], lease.rows)
    for i, t in enumerate(k):
        assert torch.all(t[:2] == i + 1) and not t[2:].any()


# ------------------------------------------------------------ cluster tier


def test_remote_lookup_without_a_cluster_tier(client):
    pool = kvtier.TorchPool({"kv": kv_pool()})
    ns = attach(client, "remote", pool, page_rows=8)
    xfer = ns.transfer(pool)
    h = ns.hash_tokens(list(range(5 * PAGE)))
    with ns.reserve(3) as res:
        xfer.evict([0, 1, 2], res.page_rows)
        res.commit(h[:3])
    with ns.lookup(h) as local, ns.lookup(h, remote=True) as remote:
        assert (remote.matched_pages, remote.usable_pages) == (3, 3)
        assert remote.rows == local.rows
        # Nothing past the local match: the daemon has no cluster tier.
        assert (remote.remote_pages, remote.prefetching_pages) == (0, 0)
        assert (local.remote_pages, local.prefetching_pages) == (0, 0)
        # Pinned as asked: the 3 rows cannot be evicted for a reservation.
        with pytest.raises(kvtier.ResourceExhaustedError):
            ns.reserve(6)
    with ns.lookup(h, pin=False, remote=True) as unpinned:
        assert unpinned.matched_pages == 3
        ns.reserve(6).abort()  # unpinned: eviction may take them


def test_prefetch_without_a_cluster_tier_starts_nothing(client):
    pool = kvtier.TorchPool({"kv": kv_pool()})
    ns = attach(client, "prefetch", pool, page_rows=8)
    h2 = ns.hash_tokens(list(range(100, 100 + 4 * PAGE)))
    with ns.reserve(2) as res:
        res.commit(h2[:2])
    r = ns.prefetch(h2)
    assert r == kvtier.PrefetchResult(local_pages=2, remote_pages=0,
                                      prefetching_pages=0)
    assert ns.prefetch(b"".join(h2)) == r  # packed bytes as well
    with ns.lookup(h2, pin=False, remote=True) as lease:
        assert (lease.matched_pages, lease.prefetching_pages) == (2, 0)


def test_remote_lookup_and_prefetch_refuse_bad_arguments(client):
    pool = kvtier.TorchPool({"kv": kv_pool()})
    ns = attach(client, "remote-bad", pool, page_rows=8)
    h = ns.hash_tokens(list(range(2 * PAGE)))
    with ns.reserve(2) as res:
        res.commit(h)
    with pytest.raises(ValueError, match=r"hashes\[1\]: 3 bytes"):
        ns.prefetch([h[0], b"abc"])
    with pytest.raises(ValueError, match=r"hashes\[0\]: 3 bytes"):
        ns.lookup([b"abc"], remote=True)
    with pytest.raises(ValueError, match="remote and device_pool"):
        ns.lookup(h, remote=True, device_pool=0)
    with pytest.raises(ValueError, match="33 bytes is not a multiple"):
        ns.prefetch(b"x" * 33)  # packed bytes that are not whole hashes
    with ns.lookup(h, pin=False, remote=True) as lease:
        assert lease.matched_pages == 2
    with ns.reserve(8) as res:  # nothing was left pinned or reserved
        assert len(res.page_rows) == 8


def test_remote_lookup_misses_and_prefetch_is_unavailable_without_daemon():
    d = kvtier.Daemon().start()
    try:
        c = kvtier.Client(socket=d.socket, timeout_ms=1000)
        pool = kvtier.TorchPool({"kv": kv_pool()})
        ns = attach(c, "remote-down", pool, page_rows=8)
        h = ns.hash_tokens(list(range(2 * PAGE)))
        with ns.reserve(2) as res:
            res.commit(h)
        d.kill()
        for _ in range(500):
            if not c.session_alive:
                break
            time.sleep(0.01)
        assert not c.session_alive
        with ns.lookup(h, remote=True) as lease:
            assert (lease.matched_pages, lease.remote_pages) == (0, 0)
        with pytest.raises(kvtier.UnavailableError, match="Prefetch"):
            ns.prefetch(h)
        c.close()
    finally:
        d.close()


# --------------------------------------------------------------------- CUDA


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_cuda_evict_rehydrate_on_the_current_stream(client):
    k = kv_pool(pages=64, device="cuda")
    snap = snapshot_slots(device="cuda")
    pool = kvtier.TorchPool({"kv": k}, snapshot=snap)
    ns = attach(client, "cuda", pool, page_rows=128, snapshot_rows=4)
    assert ns.page_banks[0].cuda_registered
    xfer = ns.transfer(pool)
    assert xfer.backend == "cuda"
    h = ns.hash_tokens(list(range(40 * PAGE)))
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        res = ns.reserve(40, 1)
        xfer.evict(list(range(10, 50)), res.page_rows)  # current stream
        xfer.save_snapshot(1, res.snapshot_rows[0])
        pending = res.commit_after(stream, h, snapshots=[(0, h[-1])])
    assert pending.wait().committed_pages == 40
    saved = [t.clone() for t in k + snap]
    for t in k + snap:
        t.zero_()
    with torch.cuda.stream(stream):
        lease = ns.lookup(h)
        xfer.rehydrate(list(range(40)), lease.rows, stream)
        xfer.restore_snapshot(0, lease.snapshot_row, stream)
        lease.release(stream)
    stream.synchronize()
    for t, s in zip(k, saved):
        assert torch.equal(t[:40], s[10:50])
    for t, s in zip(snap, saved[len(k):]):
        assert torch.equal(t[0], s[1])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_cuda_default_stream_commit_waits_for_queued_work(client):
    # torch's default stream is CUDA's stream 0, which libkvtier would read as
    # "no stream": the bindings must still commit only after the copies.
    k = kv_pool(pages=8, device="cuda")
    pool = kvtier.TorchPool({"kv": k})
    ns = attach(client, "cuda-default", pool)
    xfer = ns.transfer(pool)
    assert torch.cuda.current_stream().cuda_stream == 0
    h = ns.hash_tokens(list(range(2 * PAGE)))
    res = ns.reserve(2)
    torch.cuda._sleep(4_000_000_000)  # ~2 s of GPU clock cycles ahead
    xfer.evict([0, 1], res.page_rows)
    pending = res.commit_after(torch.cuda.current_stream(), h)
    with pytest.raises(kvtier.DeadlineExceededError):
        pending.wait(timeout_ms=100)  # the stream is still sleeping
    assert pending.wait().committed_pages == 2
