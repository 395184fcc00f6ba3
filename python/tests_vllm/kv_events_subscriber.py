"""A KV-events subscriber as a cache-aware router runs it: connects to a
kvtierd's --kv_events_endpoint (ZMQ SUB) or asks its
--kv_events_replay_endpoint (a DEALER to vLLM's ROUTER), decodes every batch
with vLLM's own classes (vllm.distributed.kv_events.KVEventBatch through
msgspec) and prints one JSON line per batch on stdout:

    {"seq": 3, "topic": "ns", "ts": 1.7e9, "events": [
        {"type": "BlockStored", "block_hashes": ["<hex>", ...],
         "parent_block_hash": "<hex>" | null, "token_ids": [...],
         "block_size": 16, "medium": "CPU", ...}, ...]}

Usage:
    kv_events_subscriber.py live ENDPOINT TOPIC
        prints {"ready": true} once connected, then every batch published
        under TOPIC, until its stdin closes;
    kv_events_subscriber.py replay ENDPOINT START_SEQ
        prints every batch the replay buffer holds from START_SEQ, then
        {"end": true}, and exits.

Used by test_cluster_netns.py, which runs it in another network namespace
than the daemon's (`ip netns exec NS python kv_events_subscriber.py ...`).

Thread-safety: a single-threaded script.
"""

import json
import sys

import msgspec
import zmq
from vllm.distributed.kv_events import KVEventBatch


def _plain(value):
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).hex()
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def batch_json(seq: int, topic: str, batch: KVEventBatch) -> dict:
    events = []
    for e in batch.events:
        d = {"type": type(e).__name__}
        for field in e.__struct_fields__:
            d[field] = _plain(getattr(e, field))
        events.append(d)
    return {"seq": seq, "topic": topic, "ts": batch.ts, "events": events,
            "data_parallel_rank": batch.data_parallel_rank}


def emit(obj) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def live(endpoint: str, topic: str) -> int:
    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, topic.encode())
    sub.connect(endpoint)
    decoder = msgspec.msgpack.Decoder(type=KVEventBatch)
    poller = zmq.Poller()
    poller.register(sub, zmq.POLLIN)
    poller.register(sys.stdin.fileno(), zmq.POLLIN)
    emit({"ready": True})
    while True:
        ready = dict(poller.poll())
        if sub in ready:
            t, seq, payload = sub.recv_multipart()
            emit(batch_json(int.from_bytes(seq, "big"), t.decode(),
                            decoder.decode(payload)))
        if sys.stdin.fileno() in ready and not sys.stdin.buffer.read1(4096):
            break
    sub.close(linger=0)
    ctx.term()
    return 0


def replay(endpoint: str, start: int) -> int:
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.RCVTIMEO, 30000)
    sock.connect(endpoint)
    decoder = msgspec.msgpack.Decoder(type=KVEventBatch)
    sock.send_multipart([b"", start.to_bytes(8, "big")])
    while True:
        empty, seq, payload = sock.recv_multipart()
        s = int.from_bytes(seq, "big", signed=True)
        if s == -1:
            break
        emit(batch_json(s, "", decoder.decode(payload)))
    emit({"end": True})
    sock.close(linger=0)
    ctx.term()
    return 0


def main(argv) -> int:
    if len(argv) == 4 and argv[1] == "live":
        return live(argv[2], argv[3])
    if len(argv) == 4 and argv[1] == "replay":
        return replay(argv[2], int(argv[3]))
    sys.stderr.write(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
