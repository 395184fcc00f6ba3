"""Tests of kvtier.Mirror, mirror adoption and the device-pool calls on the
CPU, against a real kvtierd: the reference mirror of CPU tensors stores
tokens and whole per-page tensors bit for bit (the row format), counts
malformed entries, ensures rows back into the pool, is adopted into the
prefix index (read back through a Transfer), stores nothing once its session
ended; a plain reservation is adopted as a mirror; without device pools the
device calls answer as the C++ API does. The CUDA paths are in
test_gpu_mirror.py."""

import time

import pytest
import torch

import kvtier

PAGE = 4  # tokens per page


def make_pool(slots=6, seed=0):
    """kv: K and V [slots, PAGE, 2, 8] bf16 (token-major, 32 bytes a token);
    scale: 25 bytes a page (not a multiple of PAGE: mirrored whole)."""
    g = torch.Generator().manual_seed(seed)
    kv = [torch.randn(slots, PAGE, 2, 8, generator=g).to(torch.bfloat16)
          for _ in range(2)]
    scale = torch.randint(0, 256, (slots, 32), generator=g, dtype=torch.uint8)[:, :25]
    return kv, scale, kvtier.TorchPool({"kv": kv, "scale": [scale]})


def refill(kv, scale, seed):
    g = torch.Generator().manual_seed(seed)
    for t in kv:
        t.copy_(torch.randn(t.shape, generator=g).to(t.dtype))
    scale.copy_(torch.randint(0, 256, scale.shape, generator=g, dtype=torch.uint8))


def raw(t) -> bytes:
    return t.contiguous().view(torch.uint8).numpy().tobytes()


def kv_row(kv, slot) -> bytes:
    return b"".join(raw(t[slot]) for t in kv)


def attach(client, name, pool, page_rows=32):
    return client.attach(name, pool.layout(model=name), page_rows=page_rows,
                         register_with_cuda=False)


def all_tokens(pages, slots):
    """Every token of logical pages [0, pages); logical l in slot slots-1-l."""
    logical, slot, token = [], [], []
    for lp in range(pages):
        for t in range(PAGE):
            logical.append(lp)
            slot.append(slots - 1 - lp)
            token.append(t)
    return logical, slot, token


def wait_until(done, limit_s=30.0):
    end = time.monotonic() + limit_s
    while not done():
        assert time.monotonic() < end, "condition never held"
        time.sleep(0.005)


def test_mirror_entries_builds_a_padded_buffer():
    e = kvtier.mirror_entries([3, 4], [1, 2], [0, 3], capacity=4)
    assert e.dtype == torch.int32 and e.shape == (4, 3)
    assert e.tolist() == [[3, 1, 0], [4, 2, 3], [-1, -1, 0], [-1, -1, 0]]
    with pytest.raises(ValueError, match="capacity"):
        kvtier.mirror_entries([1, 2], [0, 0], [0, 0], capacity=1)
    with pytest.raises(ValueError, match="entries"):
        kvtier.mirror_entries([1], [0, 0], [0])


def test_reference_mirror_store_ensure_and_adopt(client):
    kv, scale, pool = make_pool()
    ns = attach(client, "mirror", pool)
    kvb, scb = ns.page_banks
    m = ns.mirror(pool, logical_pages=8, max_batch=1, max_selected=4,
                  max_store_entries=32)
    assert m.backend == "reference" and m.gpu_slots == 6
    assert len(m.rows) == 8 and m.reservation_id != 0 and not m.revoked
    before = {r: (kvb.read_row(r), scb.read_row(r)) for r in m.rows}

    # Every token of logical pages 0..3: the rows hold the pool's bytes.
    entries = kvtier.mirror_entries(*all_tokens(4, 6), capacity=32)
    count = torch.tensor([4 * PAGE], dtype=torch.int32)
    m.store(entries, count)
    for lp in range(4):
        assert kvb.read_row(m.rows[lp]) == kv_row(kv, 5 - lp)
        assert scb.read_row(m.rows[lp]) == raw(scale[5 - lp])
    assert kvb.read_row(m.rows[4]) == before[m.rows[4]][0]
    assert m.store_drops == 0

    # One token of logical page 4 (slot 0): that token's bytes of K and of
    # V, and the whole scale page.
    refill(kv, scale, 1)
    m.store(kvtier.mirror_entries([4], [0], [2], capacity=32),
            torch.tensor([1], dtype=torch.int32))
    want = bytearray(before[m.rows[4]][0])
    tok = 2 * 8 * 2  # bytes of one token in K (and in V)
    for i, t in enumerate(kv):
        page = raw(t[0])
        start = i * PAGE * tok + 2 * tok
        want[start:start + tok] = page[2 * tok:3 * tok]
    assert kvb.read_row(m.rows[4]) == bytes(want)
    assert scb.read_row(m.rows[4]) == raw(scale[0])

    # Malformed entries (slot >= P, token >= PAGE) are dropped and counted.
    m.store(kvtier.mirror_entries([5, 5], [6, 0], [0, PAGE], capacity=32),
            torch.tensor([2], dtype=torch.int32))
    assert m.store_drops == 2
    assert kvb.read_row(m.rows[5]) == before[m.rows[5]][0]
    store_drops, ensure_drops = m.drop_counters()
    assert store_drops.tolist() == [2] and ensure_drops.tolist() == [0]

    # Ensure: the pool is lost; logical 3, 0 and 1 come back from the mirror,
    # 99 is dropped.
    for t in kv + [scale]:
        t.zero_()
    selected = torch.tensor([[3, 0, 99, 1]], dtype=torch.int32)
    translated = torch.full((1, 4), 7, dtype=torch.int32)
    m.ensure(selected, translated)
    got = translated[0].tolist()
    assert got[2] == -1 and m.ensure_drops == 1
    assert len({got[0], got[1], got[3]}) == 3
    for i in (0, 1, 3):
        lp, slot = selected[0, i].item(), got[i]
        assert kv_row(kv, slot) == kvb.read_row(m.rows[lp])
        assert raw(scale[slot]) == scb.read_row(m.rows[lp])
    again = torch.tensor([[1, -1, -1, -1]], dtype=torch.int32)
    m.ensure(again, translated)
    assert translated[0, 0].item() == got[3]  # resident: same slot

    # Adopt logical 0..3; a lookup finds copies in rows of the index's own.
    h = ns.hash_tokens(list(range(500, 500 + 4 * PAGE)))
    with pytest.raises(kvtier.InvalidArgumentError, match=r"logical_pages\[2\]"):
        m.adopt([0, 1, 8, 3], h)
    with pytest.raises(kvtier.InvalidArgumentError):
        m.adopt([0, 1, 2], h)
    with ns.lookup(h, pin=False) as miss:
        assert miss.matched_pages == 0
    assert m.adopt(range(4), h).committed_pages == 4
    mirrored = [kvb.read_row(m.rows[lp]) for lp in range(4)]
    for t in kv + [scale]:
        t.zero_()
    with ns.lookup(h) as lease:
        assert lease.usable_pages == 4
        assert not set(lease.rows) & set(m.rows)
        ns.transfer(pool).rehydrate([0, 1, 2, 3], lease.rows)
    for lp in range(4):
        assert kv_row(kv, lp) == mirrored[lp]
    assert ns.adopt_mirror(m, range(4), h).deduplicated_pages == 4
    m.close()
    assert m.closed
    # The mirror's rows went back (32 rows: 28 free again besides the 4).
    ns.reserve(28).abort()


def test_buffers_are_checked_before_the_call(client):
    kv, scale, pool = make_pool()
    ns = attach(client, "mirror-args", pool)
    m = ns.mirror(pool, logical_pages=8, max_batch=1, max_selected=4,
                  max_store_entries=32)
    count = torch.tensor([1], dtype=torch.int32)
    with pytest.raises(ValueError, match="entries: 36 bytes, needs 384"):
        m.store(kvtier.mirror_entries([0, 0, 0], [0, 0, 0], [0, 1, 2]), count)
    with pytest.raises(ValueError, match="entries: dtype"):
        m.store(torch.zeros(32, 3, dtype=torch.int64), count)
    with pytest.raises(ValueError, match="count: dtype"):
        m.store(kvtier.mirror_entries([], [], [], capacity=32),
                torch.tensor([1.0]))
    with pytest.raises(ValueError, match="selected"):
        m.ensure(torch.zeros(1, 3, dtype=torch.int32),
                 torch.zeros(1, 4, dtype=torch.int32))
    with pytest.raises(ValueError, match="translated: must be contiguous"):
        m.ensure(torch.zeros(1, 4, dtype=torch.int32),
                 torch.zeros(4, 2, dtype=torch.int32).t())
    with pytest.raises(kvtier.InvalidArgumentError, match="max_store_entries"):
        ns.mirror(pool, logical_pages=8, max_batch=1, max_selected=4,
                  max_store_entries=0)
    with pytest.raises(kvtier.InvalidArgumentError, match="gpu_slots"):
        ns.mirror(pool, logical_pages=8, max_batch=1, max_selected=4,
                  max_store_entries=4, gpu_slots=7)
    other = kvtier.TorchPool({"scale": [scale], "kv": kv})
    with pytest.raises(kvtier.InvalidArgumentError, match=r"pool.banks\[0\].bank"):
        ns.mirror(other, logical_pages=8, max_batch=1, max_selected=4,
                  max_store_entries=4)


def test_a_reservation_is_adopted_as_a_mirror(client):
    kv, scale, pool = make_pool()
    ns = attach(client, "adopt-res", pool)
    kvb, scb = ns.page_banks
    res = ns.reserve(8)
    xfer = ns.transfer(pool)
    xfer.evict([0, 1, 2, 3, 4, 5], res.page_rows[:6])
    h = ns.hash_tokens(list(range(900, 900 + 3 * PAGE)))
    with pytest.raises(kvtier.InvalidArgumentError, match=r"mirror_indices\[1\]"):
        ns.adopt_mirror(res, [5, 8, 1], h)
    assert ns.adopt_mirror(res, [5, 2, 1], h).committed_pages == 3
    with ns.lookup(h) as lease:
        assert lease.usable_pages == 3
        for row, slot in zip(lease.rows, [5, 2, 1]):
            assert kvb.read_row(row) == kv_row(kv, slot)
            assert scb.read_row(row) == raw(scale[slot])
    # The reservation stays open: adopting again deduplicates.
    assert ns.adopt_mirror(res, [5, 2, 1], h).deduplicated_pages == 3
    res.abort()


def test_a_revoked_mirror_stores_nothing():
    with kvtier.Daemon() as d, kvtier.Client(socket=d.socket) as c:
        kv, scale, pool = make_pool()
        ns = attach(c, "revoked", pool)
        kvb = ns.page_banks[0]
        m = ns.mirror(pool, logical_pages=8, max_batch=1, max_selected=4,
                      max_store_entries=32)
        entries = kvtier.mirror_entries(*all_tokens(2, 6), capacity=32)
        count = torch.tensor([2 * PAGE], dtype=torch.int32)
        m.store(entries, count)
        stored = kvb.read_row(m.rows[0])
        assert stored == kv_row(kv, 5)
        d.kill()
        wait_until(lambda: m.revoked)
        d.start()
        wait_until(lambda: c.session_alive)
        assert m.revoked  # for good: a new session needs a new mirror
        refill(kv, scale, 2)
        m.store(entries, count)
        assert kvb.read_row(m.rows[0]) == stored, "a revoked mirror wrote its rows"
        with pytest.raises(kvtier.UnavailableError):
            m.adopt([0, 1], ns.hash_tokens(list(range(2 * PAGE))))
        m.close()
        fresh = ns.mirror(pool, logical_pages=8, max_batch=1, max_selected=4,
                          max_store_entries=32)
        fresh.store(entries, count)
        assert kvb.read_row(fresh.rows[0]) == kv_row(kv, 5)


def test_device_pool_calls_without_pools(client):
    kv, scale, pool = make_pool()
    ns = attach(client, "no-device-pools", pool)
    assert ns.device_pools == [] and not ns.device_pools_valid
    with pytest.raises(kvtier.InvalidArgumentError, match="index"):
        ns.open_device_pool(0)
    h = ns.hash_tokens(list(range(2 * PAGE)))
    with pytest.raises(kvtier.InvalidArgumentError):
        ns.reserve(0, 0, device_snapshots=1, device_pool=0)
    res = ns.reserve(2)
    assert res.device_snapshot_rows == []
    ns.transfer(pool).evict([0, 1], res.page_rows)
    assert res.commit(h, device_snapshots=()).committed_pages == 2
    with pytest.raises(kvtier.InvalidArgumentError, match="device_pool"):
        ns.lookup(h, device_pool=0)
    with ns.lookup(h) as lease:
        assert lease.usable_pages == 2
        assert not lease.has_device_snapshot and lease.device_snapshot_row is None


def test_closing_the_client_closes_its_mirrors(daemon):
    c = kvtier.Client(socket=daemon.socket)
    kv, scale, pool = make_pool()
    ns = attach(c, "close-mirror", pool)
    m = ns.mirror(pool, logical_pages=8, max_batch=1, max_selected=4,
                  max_store_entries=4)
    c.close()
    assert m.closed and ns.closed
    with pytest.raises(ValueError, match="closed"):
        m.store(kvtier.mirror_entries([], [], [], capacity=4),
                torch.tensor([0], dtype=torch.int32))
