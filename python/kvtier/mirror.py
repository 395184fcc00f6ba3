"""The sparse-attention write-through mirror (client/mirror.h, through the C
ABI's kvt_mirror_*): L logical pages in session-private rows, a
graph-capturable store kernel that copies each token the engine writes into
its GPU pool on to the mirror, and a device-side LRU (ensure) that makes the
pool's first P pages a cache over the mirror.

    pool = kvtier.TorchPool({"kv": kv_tensors, "scale": scale_tensors})
    m = ns.mirror(pool, logical_pages=20000, max_batch=8, max_selected=512,
                  max_store_entries=4096)
    entries = kvtier.mirror_entries(logical, slot, token,
                                    capacity=4096, device="cuda")
    count = torch.tensor([n], dtype=torch.int32, device="cuda")
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):            # each step, after store_kv:
        m.store(entries, count)          # the current (capture) stream
        m.ensure(selected, translated)   # before attention
    g.replay()
    m.adopt(range(n_pages), hashes)      # into the prefix index

CUDA tensors get the CUDA backend (kernels on the caller's stream; None: the
current torch stream of the pool's device); CPU tensors the reference
backend, which runs the kernels' references at once (for tests and CPU
engines; no graphs). When the session ends (the daemon restarted) the mirror
is revoked: its store, captured graphs included, writes nothing more; make a
new mirror.

Thread-safety: a Mirror is used by one thread and one stream at a time.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from ctypes import byref, c_void_p

from . import _lib
from ._handle import _Handle
from ._types import (CommitResult, _backend, _c_pool, _commit_result,
                     _join_hashes, _stream_handle)
from .device_pool import cuda_tensor
from .errors import check


def mirror_entries(logical: Sequence[int], slot: Sequence[int],
                   token: Sequence[int], capacity: int | None = None,
                   device="cpu"):
    """The store's entry buffer: a torch.int32 tensor [capacity, 3] of
    (logical page, pool page, token in page) rows, padded (logical -1) past
    len(logical). capacity defaults to len(logical)."""
    import torch
    n = len(logical)
    if not len(slot) == len(token) == n:
        raise ValueError(f"logical, slot, token: {n}, {len(slot)} and "
                         f"{len(token)} entries")
    capacity = n if capacity is None else capacity
    if capacity < n:
        raise ValueError(f"capacity: {capacity} is below the {n} entries")
    out = torch.empty(capacity, 3, dtype=torch.int32)
    out[:, 0] = -1
    out[:, 1] = -1
    out[:, 2] = 0
    if n:
        out[:n] = torch.stack([torch.as_tensor(list(x), dtype=torch.int32)
                               for x in (logical, slot, token)], dim=1)
    return out.to(device)


class Mirror(_Handle):
    """A write-through mirror (kvt_mirror_create); made by Namespace.mirror.

    Raises InvalidArgumentError naming the field for a bad option or a pool
    that does not match the namespace's banks, FailedPreconditionError for
    CUDA tensors over banks not registered with CUDA (or without CUDA), and
    reserve's errors. Holds the pool's tensors alive."""

    def __init__(self, ns, pool, *, logical_pages: int, gpu_slots: int | None,
                 max_batch: int, max_selected: int, max_store_entries: int,
                 copy_ctas: int = 0, store_ctas: int = 0, stream=None):
        self._ns = ns  # the namespace outlives the mirror
        desc = pool.descriptor() if hasattr(pool, "descriptor") else pool
        self.descriptor = desc
        self.backend = desc.backend
        backend = _backend(desc)
        cpool, keep = _c_pool(desc)
        self.logical_pages = logical_pages
        self.gpu_slots = desc.num_pages if gpu_slots is None else gpu_slots
        self.max_batch = max_batch
        self.max_selected = max_selected
        self.max_store_entries = max_store_entries
        opts = _lib.MirrorOptions(logical_pages, self.gpu_slots, max_batch,
                                  max_selected, max_store_entries, copy_ctas,
                                  store_ctas, backend)
        out = c_void_p()
        check(_lib.load().kvt_mirror_create(ns._need(), byref(cpool),
                                            byref(opts), self._stream(stream),
                                            byref(out)), "kvt_mirror_create")
        del keep
        self._ptr = out
        lib = _lib.load()
        n = lib.kvt_mirror_num_rows(out)
        rows = lib.kvt_mirror_rows(out)
        self.rows = [rows[i] for i in range(n)]  # row of each logical page
        self.reservation_id = lib.kvt_mirror_reservation_id(out)

    def _stream(self, stream) -> c_void_p:
        if stream is None and self.backend == "cuda":
            import torch
            stream = torch.cuda.current_stream(self.descriptor.device)
        return c_void_p(_stream_handle(stream))

    def _address(self, t, what: str, min_bytes: int, dtypes: tuple) -> int:
        """The address of buffer `t`: a torch tensor (checked: contiguous, one
        of `dtypes`, on the backend's device, min_bytes at least), a ctypes
        object, or an int address (taken as is)."""
        if isinstance(t, int):
            return t
        if isinstance(t, ctypes._SimpleCData) or isinstance(t, ctypes.Array):
            if ctypes.sizeof(t) < min_bytes:
                raise ValueError(f"{what}: {ctypes.sizeof(t)} bytes, needs "
                                 f"{min_bytes}")
            return ctypes.addressof(t)
        if t.dtype not in dtypes:
            raise ValueError(f"{what}: dtype {t.dtype}, expected one of "
                             f"{[str(d) for d in dtypes]}")
        want_cuda = self.backend == "cuda"
        if t.is_cuda != want_cuda:
            raise ValueError(f"{what}: on {t.device}, the mirror's pool is on "
                             f"{'CUDA' if want_cuda else 'the CPU'}")
        if not t.is_contiguous():
            raise ValueError(f"{what}: must be contiguous")
        nbytes = t.numel() * t.element_size()
        if nbytes < min_bytes:
            raise ValueError(f"{what}: {nbytes} bytes, needs {min_bytes}")
        return t.data_ptr()

    def store(self, entries, count, stream=None) -> None:
        """Enqueues the mirror store: entries[0, min(count[0],
        max_store_entries)) go from the pool to the mirror rows.

        entries: int32 [>= max_store_entries, 3] (mirror_entries); count: one
        int32/uint32 element; both on the pool's device (or int addresses).
        Graph-capturable: inside torch.cuda.graph the capture stream is the
        current stream. Raises ValueError for a bad buffer."""
        import torch
        counts = (torch.int32,) + ((torch.uint32,) if hasattr(torch, "uint32") else ())
        e = self._address(entries, "entries", 12 * self.max_store_entries,
                          (torch.int32,))
        c = self._address(count, "count", 4, counts)
        check(_lib.load().kvt_mirror_store(self._need(), c_void_p(e),
                                           c_void_p(c), self._stream(stream)),
              "kvt_mirror_store")

    def ensure(self, selected, translated, stream=None) -> None:
        """Enqueues one ensure step over `selected` (int32, max_batch x
        max_selected logical pages, -1 padded) and writes each one's pool page
        to `translated` (int32, same shape; -1 for padding and drops). Pages
        not resident are copied from the mirror into victim slots.
        Graph-capturable."""
        import torch
        n = 4 * self.max_batch * self.max_selected
        s = self._address(selected, "selected", n, (torch.int32,))
        t = self._address(translated, "translated", n, (torch.int32,))
        check(_lib.load().kvt_mirror_ensure(self._need(), c_void_p(s),
                                            c_void_p(t), self._stream(stream)),
              "kvt_mirror_ensure")

    def drop_counters(self):
        """(store drops, ensure drops) as one-element torch.int64 tensors over
        the mirror's own counters (device memory for CUDA; no copy): the
        entries the store dropped as malformed, and the pages the ensure
        dropped as out of range. Valid while the mirror is open."""
        import torch
        lib = _lib.load()
        out = []
        for fn in (lib.kvt_mirror_store_drops, lib.kvt_mirror_ensure_drops):
            address = fn(self._need())
            if self.backend == "cuda":
                out.append(cuda_tensor(address, (1,), typestr="<i8", owner=self))
            else:
                buf = (ctypes.c_int64 * 1).from_address(address)
                t = torch.frombuffer(buf, dtype=torch.int64)
                t._kvtier_owner = self  # the counters live in the mirror
                out.append(t)
        return tuple(out)

    @property
    def store_drops(self) -> int:
        """The store's drop counter. For CUDA, read once the store's stream
        has finished (torch.cuda.synchronize)."""
        return int(self.drop_counters()[0].item())

    @property
    def ensure_drops(self) -> int:
        """The ensure's drop counter (read as store_drops)."""
        return int(self.drop_counters()[1].item())

    @property
    def revoked(self) -> bool:
        """True once the session that reserved the rows ended: the store
        writes nothing from then on."""
        return bool(_lib.load().kvt_mirror_revoked(self._need()))

    def adopt(self, logical_pages: Sequence[int], hashes,
              parent: bytes | None = None) -> CommitResult:
        """Adopts mirrored pages into the prefix index: the daemon copies rows
        rows[logical_pages[i]] into fresh rows and commits them under
        `hashes` (one per page) below `parent`. The mirror keeps its rows.
        REQUIRES: the pages' stores have completed. Raises
        InvalidArgumentError naming logical_pages[i] when not below
        logical_pages, UnavailableError once the mirror's session ended."""
        packed, n = _join_hashes(hashes, self._ns.hash_bytes)
        pages = _lib.u32_array(logical_pages)
        res = _lib.CommitResult()
        check(_lib.load().kvt_mirror_adopt(
            self._need(), pages, len(pages), _lib.u8(parent),
            len(parent or b""), _lib.u8(packed), n, byref(res)),
            "kvt_mirror_adopt")
        return _commit_result(res)

    def close(self) -> None:
        """Frees the device state and returns the rows. REQUIRES: no queued
        launch (or captured graph still to be replayed) uses the mirror:
        synchronise its stream first."""
        if self._ptr is None:
            return
        _lib.load().kvt_mirror_close(self._take())
