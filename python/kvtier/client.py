"""Python handles over libkvtier's C ABI: Client, Namespace, Lease, Reservation,
PendingCommit and Transfer.

    with kvtier.Client(socket=path, name="engine-0") as client:
        ns = client.attach("llama-8b", layout, page_rows=4096)
        hashes = ns.hash_tokens(tokens)              # one bytes per full page
        with ns.lookup(hashes) as lease:             # pinned rows
            xfer.rehydrate(gpu_pages[:lease.usable_pages], lease.rows)
            lease.release(stream)                    # after the copies
        with ns.reserve(len(new)) as res:            # invisible rows
            xfer.evict(new_pages, res.page_rows)
            res.commit(new_hashes, parent=hashes[-1])

Every handle owns one C handle and frees it exactly once: explicitly (close,
release, commit, abort, wait) or through its context manager. A Client closes
the handles opened through it (transfers, leases, reservations, namespaces)
before its session, so a forgotten handle never outlives the session that
owns it. Failures raise the errors module's exceptions, which carry the
library's message.

Streams: a `stream` argument is a torch.cuda.Stream, a raw cudaStream_t as an
int (0 is CUDA's default stream), or None. For a transfer, None means the
current torch stream of the pool's device (CUDA) or no stream (reference
backend, which copies before returning). For Lease.release and
Reservation.commit_after, None means "now" and a stream means "once its
queued work has finished", the default stream included.

Thread-safety: Client and Namespace may be used from many threads (the C
library is thread-safe for them); a Lease, Reservation, PendingCommit or
Transfer by one thread at a time. Closing is not synchronised with other
threads' calls on the same handle.
"""

from __future__ import annotations

import ctypes
import dataclasses
import weakref
from collections.abc import Iterable, Sequence
from ctypes import byref, c_size_t, c_void_p

from . import _lib
from .errors import check

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
class PoolTensorSpec:
    """Page p of one pool tensor is [base + p*page_stride, +bytes_per_page)."""
    base: int
    page_stride: int
    bytes_per_page: int


@dataclasses.dataclass(frozen=True)
class PoolDescriptor:
    """An engine's page pool (see client/include/kvtier/pool.h): `banks` maps
    each page bank's name, in namespace order, to its tensors; `snapshot`
    lists the snapshot segments of slot 0..num_snapshot_slots-1.
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


class _Handle:
    """Owns one C handle; subclasses say how to free it."""

    _ptr: c_void_p | None = None

    @property
    def closed(self) -> bool:
        return self._ptr is None

    def _need(self) -> c_void_p:
        if self._ptr is None:
            raise ValueError(f"{type(self).__name__} is closed")
        return self._ptr

    def _take(self) -> c_void_p:
        ptr = self._need()
        self._ptr = None
        return ptr

    def close(self) -> None:  # pragma: no cover - overridden
        raise NotImplementedError

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        try:
            if self._ptr is not None:
                self.close()
        except Exception:  # interpreter shutdown: the library may be gone
            pass


class Client(_Handle):
    """A session with kvtierd (kvt_connect). Closing it releases the session's
    pins and reservations in the daemon at once.

    Args:
      socket: the daemon's unix socket; None for $KVTIER_SOCKET or the default.
      name: shown to operators.
      timeout_ms: connect and per-RPC deadline; 0 for 5000.
      instance: 16 bytes naming the client instance this process belongs to
        (the fence protocol: processes of one engine that share leases and
        reservations, such as vLLM's scheduler and workers, pass the same);
        None for a fresh one.
    Raises:
      UnavailableError / DeadlineExceededError when no daemon answers.
    """

    def __init__(self, socket: str | None = None, name: str = "python",
                 timeout_ms: int = 0, instance: bytes | None = None):
        lib = _lib.load()
        out = c_void_p()
        if instance is not None and len(instance) != 16:
            raise ValueError(f"instance: must be 16 bytes, got {len(instance)}")
        inst = bytes(instance or b"")
        check(lib.kvt_connect_instance(socket.encode() if socket else None,
                                       name.encode(), timeout_ms,
                                       _lib.u8(inst) if inst else None, len(inst),
                                       byref(out)),
              "kvt_connect_instance")
        self._ptr = out
        self._children: weakref.WeakSet = weakref.WeakSet()

    @property
    def session_id(self) -> int:
        return _lib.load().kvt_session_id(self._need())

    @property
    def session_alive(self) -> bool:
        """False once the daemon closed the session (stopped or restarted)."""
        return bool(_lib.load().kvt_session_alive(self._need()))

    def attach(self, name: str, layout: Layout, *, tp_rank: int = 0,
               page_rows: int = 0, snapshot_rows: int = 0,
               max_replay_tokens: int = 0, tenant_salt: bytes = b"",
               register_with_cuda: bool = True) -> "Namespace":
        """Creates or opens namespace `name` and maps its banks (kvt_attach).

        page_rows / snapshot_rows / max_replay_tokens size the banks when this
        attach creates the namespace (0: the daemon's default).
        Raises InvalidArgumentError naming the field for a bad layout, and
        FailedPreconditionError (or similar) when `layout` contradicts an
        existing namespace of that name.
        """
        if layout.hash_kind not in HASH_KINDS:
            raise ValueError(f"layout.hash_kind: {layout.hash_kind!r} is not one "
                             f"of {sorted(HASH_KINDS)}")
        banks = (_lib.BankLayout * max(1, len(layout.page_banks)))()
        keep = []
        for i, b in enumerate(layout.page_banks):
            nm, dt = b.name.encode(), b.dtype.encode()
            keep += [nm, dt]
            banks[i] = _lib.BankLayout(nm, b.row_bytes, dt)
        model = layout.model.encode()
        cl = _lib.Layout(model, layout.tokens_per_page, layout.num_layers, banks,
                         len(layout.page_banks), layout.snapshot_row_bytes,
                         layout.tp_size, int(layout.replicated),
                         HASH_KINDS[layout.hash_kind])
        salt = _lib.u8(tenant_salt)
        opts = _lib.AttachOptions(
            name.encode(), ctypes.pointer(cl), tp_rank, page_rows, snapshot_rows,
            max_replay_tokens, ctypes.cast(salt, c_void_p) if salt else None,
            len(tenant_salt), int(register_with_cuda))
        out = c_void_p()
        check(_lib.load().kvt_attach(self._need(), byref(opts), byref(out)),
              "kvt_attach")
        ns = Namespace(self, name, layout, out)
        self._children.add(ns)
        return ns

    def drop(self, name: str, hash: bytes | None = None, force: bool = False) -> None:
        """Drops namespace `name` (hash None) or the prefix subtree under `hash`."""
        h = _lib.u8(hash)
        check(_lib.load().kvt_drop(self._need(), name.encode(), h,
                                   len(hash or b""), int(force)), "kvt_drop")

    def close(self) -> None:
        """Closes every handle opened through this client, then the session."""
        if self._ptr is None:
            return
        for child in list(self._children):
            if isinstance(child, Namespace):
                child.close()
        _lib.load().kvt_client_close(self._take())


class Namespace(_Handle):
    """An attached namespace: hashing, lookup, reservations and transfers.
    Made by Client.attach."""

    def __init__(self, client: Client, name: str, layout: Layout, ptr: c_void_p):
        self._client = client  # the session outlives its namespaces
        self._ptr = ptr
        self.name = name
        self.layout = layout
        self._children: weakref.WeakSet = weakref.WeakSet()
        lib = _lib.load()
        self.hash_bytes = lib.kvt_hash_bytes(ptr)
        self.id = lib.kvt_namespace_id(ptr)

    def _adopt(self, handle):
        self._children.add(handle)
        return handle

    def _bank_info(self, info: _lib.BankInfo) -> BankInfo:
        return BankInfo(info.name.decode(), int(info.base or 0), info.rows,
                        info.row_bytes, info.row_stride,
                        bool(info.cuda_registered), bool(info.huge_pages))

    @property
    def page_banks(self) -> list[BankInfo]:
        lib = _lib.load()
        out = []
        for i in range(lib.kvt_num_page_banks(self._need())):
            info = _lib.BankInfo()
            check(lib.kvt_page_bank(self._ptr, i, byref(info)), "kvt_page_bank")
            out.append(self._bank_info(info))
        return out

    @property
    def snapshot_bank(self) -> BankInfo | None:
        """The snapshot bank, or None when the namespace keeps no snapshots."""
        info = _lib.BankInfo()
        status = _lib.load().kvt_snapshot_bank(self._need(), byref(info))
        if status == 5:  # NOT_FOUND: not hybrid
            return None
        check(status, "kvt_snapshot_bank")
        return self._bank_info(info)

    def hash_tokens(self, tokens, parent: bytes | None = None,
                    extra_key: bytes | None = None) -> list[bytes]:
        """The block hashes of every full page of `tokens` (ints, a list, a
        numpy array or a CPU tensor), continuing the chain from `parent` when
        given. A trailing partial page is not hashed."""
        arr = _tokens_array(tokens)
        cap = (len(arr) // max(1, self.layout.tokens_per_page) + 1) * self.hash_bytes
        out = (ctypes.c_uint8 * max(1, cap))()
        n = c_size_t()
        p, e = _lib.u8(parent), _lib.u8(extra_key)
        check(_lib.load().kvt_hash_tokens(
            self._need(), arr, len(arr), p, len(parent or b""), e,
            len(extra_key or b""), out, cap, byref(n)), "kvt_hash_tokens")
        raw = bytes(out)[: n.value * self.hash_bytes]
        hb = self.hash_bytes
        return [raw[i * hb:(i + 1) * hb] for i in range(n.value)]

    def lookup(self, hashes, pin: bool = True) -> "Lease":
        """The longest cached run of `hashes` (a list of per-page hashes or
        packed bytes). With pin, the rows stay valid until the lease is
        released."""
        packed, n = _join_hashes(hashes, self.hash_bytes)
        out = c_void_p()
        check(_lib.load().kvt_lookup(self._need(), _lib.u8(packed), n, int(pin),
                                     byref(out)), "kvt_lookup")
        return self._adopt(Lease(self, out))

    def reserve(self, pages: int, snapshots: int = 0) -> "Reservation":
        """`pages` page rows (and `snapshots` snapshot rows), invisible until
        committed. Raises ResourceExhaustedError when eviction cannot free
        enough."""
        out = c_void_p()
        check(_lib.load().kvt_reserve(self._need(), pages, snapshots, byref(out)),
              "kvt_reserve")
        return self._adopt(Reservation(self, out))

    def transfer(self, pool, max_ctas: int = 0) -> "Transfer":
        """A transfer engine between `pool` (a PoolDescriptor, or anything with
        a descriptor() method such as kvtier.TorchPool) and this namespace's
        banks. The CUDA backend runs when pool.backend == "cuda"."""
        desc = pool.descriptor() if hasattr(pool, "descriptor") else pool
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
        snap = tensors(desc.snapshot) if desc.snapshot else None
        cpool = _lib.Pool(desc.device, desc.num_pages, banks, len(desc.banks),
                          snap, len(desc.snapshot), desc.num_snapshot_slots)
        if desc.backend not in ("cuda", "reference"):
            raise ValueError(f"pool.backend: {desc.backend!r} is not 'cuda' or "
                             f"'reference'")
        backend = _lib.BACKEND_CUDA if desc.backend == "cuda" else _lib.BACKEND_REFERENCE
        out = c_void_p()
        check(_lib.load().kvt_transfer_create(self._need(), backend, byref(cpool),
                                              max_ctas, byref(out)),
              "kvt_transfer_create")
        return self._adopt(Transfer(self, desc, out))

    def close(self) -> None:
        """Closes the handles made through this namespace, then unmaps it."""
        if self._ptr is None:
            return
        for child in list(self._children):
            child.close()
        _lib.load().kvt_namespace_close(self._take())


class Lease(_Handle):
    """The answer of a lookup. `rows` are the page rows of pages
    [0, usable_pages); with a snapshot, `snapshot_row` holds the state after
    page usable_pages-1. Release after the copies that read the rows: use
    release(stream) when they are queued on a CUDA stream. The context
    manager releases now if not released yet."""

    def __init__(self, ns: Namespace, ptr: c_void_p):
        self._ns = ns
        self._ptr = ptr
        lib = _lib.load()
        self.matched_pages = lib.kvt_lease_matched_pages(ptr)
        self.usable_pages = lib.kvt_lease_usable_pages(ptr)
        rows = lib.kvt_lease_rows(ptr)
        self.rows = [rows[i] for i in range(self.usable_pages)] if rows else []
        self.has_snapshot = bool(lib.kvt_lease_has_snapshot(ptr))
        self.snapshot_row = lib.kvt_lease_snapshot_row(ptr) if self.has_snapshot else None

    def release(self, stream=None) -> None:
        """Releases the pin now (stream None) or once `stream`'s queued work
        has finished, without blocking. Idempotent."""
        if self._ptr is None:
            return
        check(_lib.load().kvt_lease_release(self._take(), c_void_p(_after_handle(stream))),
              "kvt_lease_release")

    close = release


class PendingCommit(_Handle):
    """A commit that runs once a stream's queued work finished
    (Reservation.commit_after). wait() returns its CommitResult."""

    def __init__(self, ptr: c_void_p):
        self._ptr = ptr
        self.result: CommitResult | None = None

    def wait(self, timeout_ms: int = 0) -> CommitResult:
        """Waits (0: forever). Raises DeadlineExceededError when still pending
        after timeout_ms (the handle stays usable), or the commit's error."""
        if self.result is not None:
            return self.result
        res = _lib.CommitResult()
        ptr = self._need()
        status = _lib.load().kvt_pending_wait(ptr, timeout_ms, byref(res))
        if status != 4:  # the C call freed the handle unless DEADLINE_EXCEEDED
            self._ptr = None
        check(status, "kvt_pending_wait")
        self.result = CommitResult(res.committed_pages, res.deduplicated_pages,
                                   res.committed_snapshots, res.deduplicated_snapshots)
        return self.result

    def close(self) -> None:
        """Waits for the commit (errors are dropped: call wait() to see them)."""
        if self._ptr is None:
            return
        try:
            self.wait()
        except Exception:
            pass


class Reservation(_Handle):
    """Rows reserved for writing (`page_rows`, `snapshot_rows`), invisible
    until commit. The context manager aborts one neither committed nor
    aborted."""

    def __init__(self, ns: Namespace, ptr: c_void_p):
        self._ns = ns
        self._ptr = ptr
        lib = _lib.load()
        self.id = lib.kvt_reservation_id(ptr)
        n = lib.kvt_reservation_num_page_rows(ptr)
        p = lib.kvt_reservation_page_rows(ptr)
        self.page_rows = [p[i] for i in range(n)] if n else []
        n = lib.kvt_reservation_num_snapshot_rows(ptr)
        p = lib.kvt_reservation_snapshot_rows(ptr)
        self.snapshot_rows = [p[i] for i in range(n)] if n else []

    def _args(self, hashes, parent, snapshots):
        hb = self._ns.hash_bytes
        packed, n = _join_hashes(hashes, hb)
        snaps = list(snapshots)
        arr = (_lib.SnapshotPlacement * max(1, len(snaps)))()
        keep = []
        for i, (index, h) in enumerate(snaps):
            if len(h) != hb:
                raise ValueError(f"snapshots[{i}].hash: {len(h)} bytes, the "
                                 f"namespace's hashes have {hb}")
            buf = _lib.u8(bytes(h))
            keep.append(buf)
            arr[i] = _lib.SnapshotPlacement(index, ctypes.cast(buf, ctypes.POINTER(ctypes.c_uint8)))
        return (_lib.u8(parent), len(parent or b""), _lib.u8(packed), n,
                arr, len(snaps), keep)

    def commit(self, hashes, parent: bytes | None = None,
               snapshots: Iterable[tuple[int, bytes]] = ()) -> CommitResult:
        """Makes the rows visible under `hashes` (one per page row) below
        `parent` (None: the first pages); `snapshots` places snapshot row
        `index` (into snapshot_rows) after the page with that hash. REQUIRES:
        the rows are fully written (else commit_after). On failure the
        reservation stays open."""
        p, plen, h, n, arr, ns, keep = self._args(hashes, parent, snapshots)
        res = _lib.CommitResult()
        check(_lib.load().kvt_commit(self._need(), p, plen, h, n, arr, ns,
                                     byref(res)), "kvt_commit")
        self._ptr = None
        return CommitResult(res.committed_pages, res.deduplicated_pages,
                            res.committed_snapshots, res.deduplicated_snapshots)

    def commit_after(self, stream, hashes, parent: bytes | None = None,
                     snapshots: Iterable[tuple[int, bytes]] = ()) -> PendingCommit:
        """As commit, once `stream`'s queued work has finished, without
        blocking (stream None: now, on libkvtier's worker)."""
        p, plen, h, n, arr, ns, keep = self._args(hashes, parent, snapshots)
        out = c_void_p()
        check(_lib.load().kvt_commit_after(self._need(), c_void_p(_after_handle(stream)),
                                           p, plen, h, n, arr, ns, byref(out)),
              "kvt_commit_after")
        self._ptr = None
        return PendingCommit(out)

    def abort(self, stream=None) -> None:
        """Returns the rows now (stream None: no copy into them may still be
        queued) or once `stream`'s queued work has finished, without blocking.
        Idempotent."""
        if self._ptr is None:
            return
        if stream is None:
            check(_lib.load().kvt_abort(self._take()), "kvt_abort")
            return
        check(_lib.load().kvt_abort_after(self._take(), c_void_p(_after_handle(stream))),
              "kvt_abort_after")

    close = abort


class Transfer(_Handle):
    """Copies pages between an engine's pool and the namespace's banks
    (kvt_evict / kvt_rehydrate) and snapshots between slots and snapshot rows.
    Made by Namespace.transfer; holds the pool's tensors alive."""

    def __init__(self, ns: Namespace, desc: PoolDescriptor, ptr: c_void_p):
        self._ns = ns
        self._ptr = ptr
        self.descriptor = desc

    @property
    def backend(self) -> str:
        return self.descriptor.backend

    def _stream(self, stream) -> c_void_p:
        if stream is None and self.descriptor.backend == "cuda":
            import torch
            stream = torch.cuda.current_stream(self.descriptor.device)
        return c_void_p(_stream_handle(stream))

    def _pages(self, fn, name, pages, rows, stream):
        pages, rows = list(pages), list(rows)
        if len(pages) != len(rows):
            raise ValueError(f"pages, rows: {len(pages)} pages but {len(rows)} rows")
        check(getattr(_lib.load(), fn)(self._need(), _lib.u32_array(pages),
                                       _lib.u32_array(rows), len(pages),
                                       self._stream(stream)), name)

    def evict(self, pages: Sequence[int], rows: Sequence[int], stream=None) -> None:
        """Copies pool page pages[i] into row rows[i] of every page bank,
        enqueued on `stream` (the reference backend copies before returning)."""
        self._pages("kvt_evict", "kvt_evict", pages, rows, stream)

    def rehydrate(self, pages: Sequence[int], rows: Sequence[int], stream=None) -> None:
        """Copies row rows[i] of every page bank into pool page pages[i]."""
        self._pages("kvt_rehydrate", "kvt_rehydrate", pages, rows, stream)

    def save_snapshot(self, slot: int, row: int, stream=None) -> None:
        """Copies snapshot slot `slot` into snapshot row `row`."""
        check(_lib.load().kvt_snapshot_save(self._need(), slot, row,
                                            self._stream(stream)),
              "kvt_snapshot_save")

    def restore_snapshot(self, slot: int, row: int, stream=None) -> None:
        """Copies snapshot row `row` into snapshot slot `slot`."""
        check(_lib.load().kvt_snapshot_restore(self._need(), slot, row,
                                               self._stream(stream)),
              "kvt_snapshot_restore")

    def close(self) -> None:
        if self._ptr is None:
            return
        _lib.load().kvt_transfer_free(self._take())
