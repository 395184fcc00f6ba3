"""kvtierd's KV events decode with vLLM's own classes: the payloads of
daemon/kv_events (through tests/kv_events_sample) are decoded with
msgspec into vllm.distributed.kv_events.KVEventBatch, as a router following
vLLM engines would, both live on the PUB socket and through the replay
ROUTER. Runs in the vLLM venv (ctest label vllm).
"""

import os
import subprocess
import time

import msgspec
import pytest
import zmq

from vllm.distributed.kv_events import (AllBlocksCleared, BlockRemoved,
                                        BlockStored, KVEventBatch)


@pytest.fixture
def sample(tmp_path):
    pub = f"ipc://{tmp_path}/pub"
    replay = f"ipc://{tmp_path}/replay"
    proc = subprocess.Popen([os.environ["KV_EVENTS_SAMPLE"], pub, replay],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True)
    assert proc.stdout.readline().strip() == "ready"
    yield proc, pub, replay
    proc.stdin.close()
    assert proc.wait(timeout=30) == 0


def replay_batches(sock, want: int):
    """(seq, KVEventBatch) of every buffered batch, asked of the replay
    socket until `want` are there: Publish only queues, the publisher's
    thread sends (bounded by count: 500 asks 20 ms apart)."""
    decoder = msgspec.msgpack.Decoder(type=KVEventBatch)
    for _ in range(500):
        sock.send_multipart([b"", (0).to_bytes(8, "big")])
        batches = []
        while True:
            empty, seq, payload = sock.recv_multipart()
            assert empty == b""
            if int.from_bytes(seq, "big", signed=True) == -1:
                assert payload == b""
                break
            batches.append((int.from_bytes(seq, "big"), decoder.decode(payload)))
        if len(batches) >= want:
            return batches
        time.sleep(0.02)
    pytest.fail(f"the replay holds {len(batches)} batches, not {want}")


def check_first(batch):
    assert isinstance(batch, KVEventBatch)
    assert batch.data_parallel_rank is None
    (e,) = batch.events
    assert isinstance(e, BlockStored)
    assert e.block_hashes == [b"\x11" * 32, b"\x22" * 32]
    assert e.parent_block_hash is None
    assert e.token_ids == list(range(1000, 1032))
    assert e.block_size == 16
    assert e.medium == "CPU"
    assert e.lora_id is None and e.lora_name is None


def test_replay_decodes_every_batch(sample):
    _, _, replay = sample
    ctx = zmq.Context.instance()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.RCVTIMEO, 10000)
    sock.connect(replay)
    batches = replay_batches(sock, 4)
    assert [s for s, _ in batches] == [0, 1, 2, 3]
    check_first(batches[0][1])
    (child,) = batches[1][1].events
    assert isinstance(child, BlockStored)
    assert child.block_hashes == [b"\x33" * 32]
    assert child.parent_block_hash == b"\x22" * 32
    assert child.token_ids == []
    (removed,) = batches[2][1].events
    assert isinstance(removed, BlockRemoved)
    assert removed.block_hashes == [b"\x33" * 32]
    assert removed.medium == "STORAGE"
    (cleared,) = batches[3][1].events
    assert isinstance(cleared, AllBlocksCleared)
    sock.close(linger=0)


def test_live_batches_decode_under_the_topic(sample):
    proc, pub, _ = sample
    ctx = zmq.Context.instance()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"llama")
    sub.setsockopt(zmq.RCVTIMEO, 100)
    sub.connect(pub)
    decoder = msgspec.msgpack.Decoder(type=KVEventBatch)
    # A subscription takes a moment to reach the publisher: ask for batches
    # until one arrives (bounded by count).
    for _ in range(200):
        proc.stdin.write("more\n")
        proc.stdin.flush()
        try:
            topic, seq, payload = sub.recv_multipart()
            break
        except zmq.Again:
            continue
    else:
        pytest.fail("no live batch arrived")
    assert topic == b"llama"
    assert int.from_bytes(seq, "big") >= 4  # after the four fixed batches
    check_first(decoder.decode(payload))
    sub.close(linger=0)


def test_the_daemons_events_decode(tmp_path):
    """A real kvtierd publishing what a commit through libkvtier stored, with
    the commit's token ids, as vLLM's classes read it."""
    import kvtier

    pub = f"ipc://{tmp_path}/events"
    replay = f"ipc://{tmp_path}/events-replay"
    flags = [f"--kv_events_endpoint={pub}",
             f"--kv_events_replay_endpoint={replay}"]
    with kvtier.Daemon(kvtierd=os.environ["KVTIERD"], flags=flags) as d, \
            kvtier.Client(socket=d.socket) as client:
        layout = kvtier.Layout(tokens_per_page=16, num_layers=1,
                               page_banks=(kvtier.BankLayout("kv", 4096),),
                               model="events")
        ns = client.attach("llama", layout, page_rows=8)
        hashes = [bytes([i + 1]) * 32 for i in range(3)]
        res = ns.reserve(3)
        with pytest.raises(kvtier.InvalidArgumentError, match="token_ids"):
            res.commit(hashes, token_ids=range(5))  # not 16 per page
        res.commit(hashes, token_ids=range(500, 548))
        ctx = zmq.Context.instance()
        sock = ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.RCVTIMEO, 10000)
        sock.connect(replay)
        stored = [e for _, b in replay_batches(sock, 1) for e in b.events]
        sock.close(linger=0)
        assert len(stored) == 1, stored
        (e,) = stored
        assert isinstance(e, BlockStored)
        assert e.block_hashes == hashes
        assert e.parent_block_hash is None
        assert e.token_ids == list(range(500, 548))
        assert e.block_size == 16
        assert e.medium == "CPU"
