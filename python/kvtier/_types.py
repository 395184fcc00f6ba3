"""Value types of the package (Layout, BankInfo, CommitResult,
PrefetchResult, pool descriptors) and the argument conversions its handle
modules share (streams, hashes, tokens, kvt_pool). Re-exported by
kvtier.client.

Thread-safety: immutable dataclasses and pure functions.
"""

from __future__ import annotations

import ctypes
import dataclasses
from collections.abc import Sequence

from . import _lib

HASH_KINDS = {"sha256": _lib.HASH_SHA256, "xxh3_128": _lib.HASH_XXH3_128}


@dataclasses.dataclass(frozen=True)
class BankLayout:
    """One per-page bank: `row_bytes` bytes of every page ("kv", "scale", ...)."""
    name: str
    row_bytes: int
    dtype: str = ""


@dataclasses.dataclass(frozen=True)
class Layout:
    """Everything that decides whether two engines can share rows (see
    kvt_layout). `hash_kind` is "sha256" (default) or "xxh3_128"."""
    tokens_per_page: int
    num_layers: int
    page_banks: tuple[BankLayout, ...]
    snapshot_row_bytes: int = 0
    model: str = ""
    tp_size: int = 1
    replicated: bool = False
    hash_kind: str = "sha256"


@dataclasses.dataclass(frozen=True)
class BankInfo:
    """A mapped bank: row r starts at base + r * row_stride (a host address,
    also the device address when cuda_registered)."""
    name: str
    base: int
    rows: int
    row_bytes: int
    row_stride: int
    cuda_registered: bool
    huge_pages: bool

    def row_address(self, row: int) -> int:
        if not 0 <= row < self.rows:
            raise IndexError(f"row {row} is not below {self.rows}")
        return self.base + row * self.row_stride

    def read_row(self, row: int) -> bytes:
        """A copy of row `row`'s payload (for tests and tools)."""
        return ctypes.string_at(self.row_address(row), self.row_bytes)


@dataclasses.dataclass(frozen=True)
class CommitResult:
    committed_pages: int
    deduplicated_pages: int
    committed_snapshots: int
    deduplicated_snapshots: int


@dataclasses.dataclass(frozen=True)
class PrefetchResult:
    """What Namespace.prefetch answered, in pages of the chain it was given:
    the local match, the pages past it that this prefetch brings in from the
    cluster tier (0 when it holds none, or when a running prefetch already
    brings them in), and the pages past it a running prefetch brings in."""
    local_pages: int
    remote_pages: int
    prefetching_pages: int


@dataclasses.dataclass(frozen=True)
class PoolTensorSpec:
    """Page p of one pool tensor is [base + p*page_stride, +bytes_per_page)."""
    base: int
    page_stride: int
    bytes_per_page: int


@dataclasses.dataclass(frozen=True)
class PoolDescriptor:
    """An engine's page pool (see client/pool.h): `banks` maps each page
    bank's name, in namespace order, to its tensors; `snapshot` lists the
    snapshot segments of slot 0..num_snapshot_slots-1.
    `device` is the CUDA ordinal (ignored by the reference backend).
    `keepalive` holds the objects that own the memory (torch tensors)."""
    num_pages: int
    banks: tuple[tuple[str, tuple[PoolTensorSpec, ...]], ...]
    snapshot: tuple[PoolTensorSpec, ...] = ()
    num_snapshot_slots: int = 0
    device: int = 0
    backend: str = "reference"  # "cuda" or "reference"
    keepalive: tuple = ()


def _stream_handle(stream) -> int | None:
    """The cudaStream_t of `stream` as an int (None stays None)."""
    if stream is None:
        return None
    if isinstance(stream, int):
        return stream
    handle = getattr(stream, "cuda_stream", None)
    if handle is None:
        raise TypeError(f"stream: expected a torch.cuda.Stream, an int "
                        f"cudaStream_t or None, got {type(stream).__name__}")
    return int(handle)


def _after_handle(stream) -> int | None:
    """The stream for libkvtier's "once the stream's queued work finished"
    calls (commit_after, lease release). libkvtier reads NULL there as "now",
    but 0 is also CUDA's legacy default stream, where torch queues its work
    unless told otherwise: pass that one as cudaStreamLegacy (0x1), which
    names the same stream and is not NULL."""
    handle = _stream_handle(stream)
    return 1 if handle == 0 else handle


def _join_hashes(hashes, hash_bytes: int, what: str = "hashes") -> tuple[bytes, int]:
    """Packs a list of per-page hashes (or already packed bytes) and counts them."""
    if isinstance(hashes, (bytes, bytearray, memoryview)):
        packed = bytes(hashes)
    else:
        parts = list(hashes)
        for i, h in enumerate(parts):
            if len(h) != hash_bytes:
                raise ValueError(f"{what}[{i}]: {len(h)} bytes, the namespace's "
                                 f"hashes have {hash_bytes}")
        packed = b"".join(bytes(h) for h in parts)
    if len(packed) % hash_bytes:
        raise ValueError(f"{what}: {len(packed)} bytes is not a multiple of "
                         f"{hash_bytes}")
    return packed, len(packed) // hash_bytes


def _tokens_array(tokens) -> ctypes.Array:
    if hasattr(tokens, "tolist"):
        tokens = tokens.tolist()
    values = list(tokens)
    for i, t in enumerate(values):
        if not -2**31 <= int(t) < 2**31:
            raise ValueError(f"tokens[{i}]: {t} is not an int32")
    return (ctypes.c_int32 * len(values))(*values)


def _c_pool(desc: PoolDescriptor):
    """The kvt_pool of `desc` and the ctypes objects it points into (keep them
    alive for the call)."""
    keep = []

    def tensors(specs: Sequence[PoolTensorSpec]):
        arr = (_lib.PoolTensor * max(1, len(specs)))()
        for i, s in enumerate(specs):
            arr[i] = _lib.PoolTensor(s.base, s.page_stride, s.bytes_per_page)
        keep.append(arr)
        return arr

    banks = (_lib.BankPool * max(1, len(desc.banks)))()
    for i, (name, specs) in enumerate(desc.banks):
        nm = name.encode()
        keep.append(nm)
        banks[i] = _lib.BankPool(nm, tensors(specs), len(specs))
    keep.append(banks)
    snap = tensors(desc.snapshot) if desc.snapshot else None
    cpool = _lib.Pool(desc.device, desc.num_pages, banks, len(desc.banks),
                      snap, len(desc.snapshot), desc.num_snapshot_slots)
    return cpool, keep


def _backend(desc: PoolDescriptor) -> int:
    """kvt_backend of `desc.backend` ("cuda" or "reference")."""
    if desc.backend not in ("cuda", "reference"):
        raise ValueError(f"pool.backend: {desc.backend!r} is not 'cuda' or "
                         f"'reference'")
    return _lib.BACKEND_CUDA if desc.backend == "cuda" else _lib.BACKEND_REFERENCE


def _commit_result(res: _lib.CommitResult) -> CommitResult:
    return CommitResult(res.committed_pages, res.deduplicated_pages,
                        res.committed_snapshots, res.deduplicated_snapshots)
