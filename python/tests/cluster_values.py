"""kvtierd's cluster-tier keys and values, recomputed in Python from their
specification, so tests can name the Redis key of one page and plant values
of their own: the layout fingerprint (daemon/namespace_layout.cc: SHA-256 of
the normalized layout's canonical text), the key digest and name, the
Redis Cluster slot of a key, and the value format with its HMAC
(daemon/cluster_value.h). A test that uses them checks them against the
daemon (a computed key must be one the daemon wrote), so a drift between
this file and the daemon fails loudly instead of passing vacuously.

Thread-safety: pure functions.
"""

from __future__ import annotations

import hashlib
import hmac
import struct

import kvtier

_HASH_KIND = {"sha256": 1, "xxh3_128": 2}
MAGIC = b"KVTCV1\0\0"


def layout_fingerprint(layout: kvtier.Layout) -> bytes:
    """SHA-256 of the canonical text of `layout`, normalized as the daemon
    does (tp_size 0 -> 1)."""
    model = layout.model.encode()
    s = (b"kvtier.layout.v1;model=%d:" % len(model) + model +
         b";tpp=%d;layers=%d" % (layout.tokens_per_page, layout.num_layers))
    for b in layout.page_banks:
        dtype = b.dtype.encode()
        s += b";bank=" + b.name.encode() + b":%d:%d:" % (b.row_bytes, len(dtype)) + dtype
    s += b";snap=%d;tp=%d;repl=%d;hash=%d" % (
        layout.snapshot_row_bytes, layout.tp_size or 1, int(layout.replicated),
        _HASH_KIND[layout.hash_kind])
    return hashlib.sha256(s).digest()


def key_digest(name: str, fingerprint: bytes, block_hash: bytes, rank: int = 0) -> bytes:
    """The digest naming page `block_hash` of `rank` in namespace `name`."""
    n = name.encode()
    text = (b"kvtier-cluster-v1\0" + struct.pack("<I", len(n)) + n + fingerprint +
            struct.pack("<I", len(block_hash)) + block_hash + struct.pack("<I", rank))
    return hashlib.sha256(text).digest()


def key_name(digest: bytes) -> str:
    """The Redis key: "kvt1:" and the digest in lowercase hex."""
    return "kvt1:" + digest.hex()


def page_key(ns: kvtier.Namespace, block_hash: bytes, rank: int = 0) -> str:
    """The Redis key of page `block_hash` of attached namespace `ns`."""
    return key_name(key_digest(ns.name, layout_fingerprint(ns.layout), block_hash,
                               rank))


def _crc16(data: bytes) -> int:
    crc = 0
    for byte in data:
        crc ^= byte << 8
        for _ in range(8):
            crc = ((crc << 1) ^ 0x1021) if crc & 0x8000 else crc << 1
            crc &= 0xFFFF
    return crc


def key_slot(key: str) -> int:
    """The Redis Cluster slot of `key` (CRC16/XMODEM mod 16384; hash tags
    honoured)."""
    k = key.encode()
    lo = k.find(b"{")
    if lo >= 0:
        hi = k.find(b"}", lo + 1)
        if hi > lo + 1:
            k = k[lo + 1:hi]
    return _crc16(k) % 16384


def header_bytes(banks: int) -> int:
    return 88 + 8 * banks + 8


def encode_value(secret: bytes, fingerprint: bytes, digest: bytes, rank: int,
                 banks, snapshot: bytes | None = None) -> bytes:
    """A value holding one row per page bank (`banks`, bytes each) and an
    optional snapshot row, MAC'd under `secret` (EncodeClusterValue)."""
    banks = [bytes(b) for b in banks]
    head = (MAGIC + struct.pack("<II", header_bytes(len(banks)),
                                1 if snapshot is not None else 0) +
            fingerprint + digest + struct.pack("<II", rank, len(banks)) +
            b"".join(struct.pack("<Q", len(b)) for b in banks) +
            struct.pack("<Q", len(snapshot) if snapshot is not None else 0))
    body = head + b"".join(banks) + (snapshot or b"")
    return body + hmac.new(secret, body, hashlib.sha256).digest()

