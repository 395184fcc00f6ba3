"""Python handles over libkvtier's C ABI: Client, Namespace, Lease, Reservation,
PendingCommit and Transfer (mirrors and device pools: kvtier.mirror,
kvtier.device_pool; the handle base and Lease live below all three, in
_handle.py and _lease.py, and Lease is re-exported here).

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
import weakref
from collections.abc import Iterable, Sequence
from ctypes import byref, c_size_t, c_void_p

from . import _lib
from ._handle import _Handle
from ._lease import Lease
from ._types import (HASH_KINDS, BankInfo, BankLayout, CommitResult,  # noqa: F401
                     Layout, PoolDescriptor, PoolTensorSpec, PrefetchResult,
                     _after_handle,
                     _backend, _c_pool, _commit_result, _join_hashes,
                     _stream_handle, _tokens_array)
from .device_pool import DevicePool, device_pool_infos
from .errors import check
from .mirror import Mirror


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
        # The daemon's --namespace_acl entry governing this namespace (its
        # pattern); "" when none does: every engine that reaches the daemon
        # may attach it and write its rows (docs/operations.md).
        self.acl_entry = (lib.kvt_namespace_acl(ptr) or b"").decode()

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

    def lookup(self, hashes, pin: bool = True,
               device_pool: int | None = None, remote: bool = False) -> "Lease":
        """The longest cached run of `hashes` (a list of per-page hashes or
        packed bytes). With pin, the rows stay valid until the lease is
        released. With `device_pool` (an index into device_pools) the lookup
        also asks that pool for the usable snapshot
        (Lease.has_device_snapshot; kvt_lookup_with_device): as a protobuf
        Lookup call, not the binary lookup frame, and host-only while not
        device_pools_valid. With `remote` it also asks the daemon's cluster
        tier how far the chain continues past the local match
        (Lease.remote_pages, Lease.prefetching_pages; kvt_lookup_remote),
        also as a Lookup call; not together with device_pool. While the
        daemon is unreachable any lookup is a miss."""
        if remote and device_pool is not None:
            raise ValueError("lookup: remote and device_pool cannot be asked "
                             "together")
        packed, n = _join_hashes(hashes, self.hash_bytes)
        out = c_void_p()
        if remote:
            check(_lib.load().kvt_lookup_remote(self._need(), _lib.u8(packed), n,
                                                int(pin), byref(out)),
                  "kvt_lookup_remote")
        elif device_pool is None:
            check(_lib.load().kvt_lookup(self._need(), _lib.u8(packed), n,
                                         int(pin), byref(out)), "kvt_lookup")
        else:
            check(_lib.load().kvt_lookup_with_device(
                self._need(), _lib.u8(packed), n, device_pool, int(pin),
                byref(out)), "kvt_lookup_with_device")
        return self._adopt(Lease(self, out))

    def prefetch(self, hashes) -> PrefetchResult:
        """Starts bringing the continuation of `hashes` (the chain from its
        first page, as for lookup) past the local match from the daemon's
        cluster tier into the host tier, and returns at once (kvt_prefetch):
        later lookups see the pages locally. Without a cluster tier nothing
        starts (remote_pages 0). Raises UnavailableError while the daemon is
        unreachable, ValueError for a hash of the wrong size."""
        packed, n = _join_hashes(hashes, self.hash_bytes)
        res = _lib.PrefetchResult()
        check(_lib.load().kvt_prefetch(self._need(), _lib.u8(packed), n,
                                       byref(res)), "kvt_prefetch")
        return PrefetchResult(res.local_pages, res.remote_pages,
                              res.prefetching_pages)

    def reserve(self, pages: int, snapshots: int = 0, device_snapshots: int = 0,
                device_pool: int = 0) -> "Reservation":
        """`pages` page rows (and `snapshots` snapshot rows, and
        `device_snapshots` slots of device pool `device_pool`), invisible
        until committed. Raises ResourceExhaustedError when eviction cannot
        free enough; UnavailableError for device slots while not
        device_pools_valid."""
        out = c_void_p()
        if device_snapshots == 0:
            check(_lib.load().kvt_reserve(self._need(), pages, snapshots,
                                          byref(out)), "kvt_reserve")
        else:
            check(_lib.load().kvt_reserve_with_device(
                self._need(), pages, snapshots, device_snapshots, device_pool,
                byref(out)), "kvt_reserve_with_device")
        return self._adopt(Reservation(self, out))

    # Device pools, mirrors and adoption: kvtier.device_pool, kvtier.mirror.

    @property
    def device_pools(self) -> list:
        """The daemon's device pools (kvtier.DevicePoolInfo) as the first
        attach reported them; empty unless kvtierd runs with
        --device_pool_bytes."""
        return device_pool_infos(self)

    @property
    def device_pools_valid(self) -> bool:
        """True while the daemon session that reported device_pools is the
        current one; False for good once it ended (attach again)."""
        return bool(_lib.load().kvt_device_pools_valid(self._need()))

    def open_device_pool(self, index: int):
        """Opens device pool `index` on the current CUDA device (its GPU):
        a kvtier.DevicePool. See kvt_device_pool_open for the errors."""
        return self._adopt(DevicePool(self, index))

    def mirror(self, pool, *, logical_pages: int, max_batch: int,
               max_selected: int, max_store_entries: int,
               gpu_slots: int | None = None, copy_ctas: int = 0,
               store_ctas: int = 0, stream=None):
        """A write-through mirror of `logical_pages` pages over `pool` (a
        PoolDescriptor or kvtier.TorchPool): a kvtier.Mirror. gpu_slots
        defaults to the pool's page count."""
        return self._adopt(Mirror(
            self, pool, logical_pages=logical_pages,
            gpu_slots=gpu_slots, max_batch=max_batch,
            max_selected=max_selected, max_store_entries=max_store_entries,
            copy_ctas=copy_ctas, store_ctas=store_ctas, stream=stream))

    def adopt_mirror(self, mirror, indices: Sequence[int], hashes,
                     parent: bytes | None = None) -> CommitResult:
        """Commits copies of mirror pages into the prefix index under
        `hashes` (one per index) below `parent`: for a kvtier.Mirror,
        `indices` are logical pages (Mirror.adopt); for a Reservation of
        this namespace used as a mirror, indices into its page_rows
        (kvt_adopt_mirror). The mirror keeps its rows. REQUIRES: those rows
        are fully written."""
        if not isinstance(mirror, Reservation):
            return mirror.adopt(indices, hashes, parent)
        packed, n = _join_hashes(hashes, self.hash_bytes)
        idx = _lib.u32_array(indices)
        res = _lib.CommitResult()
        check(_lib.load().kvt_adopt_mirror(
            self._need(), mirror._need(), idx, len(idx), _lib.u8(parent),
            len(parent or b""), _lib.u8(packed), n, byref(res)),
            "kvt_adopt_mirror")
        return _commit_result(res)

    def transfer(self, pool, max_ctas: int = 0) -> "Transfer":
        """A transfer engine between `pool` (a PoolDescriptor, or anything with
        a descriptor() method such as kvtier.TorchPool) and this namespace's
        banks. The CUDA backend runs when pool.backend == "cuda"."""
        desc = pool.descriptor() if hasattr(pool, "descriptor") else pool
        cpool, keep = _c_pool(desc)
        backend = _backend(desc)
        out = c_void_p()
        check(_lib.load().kvt_transfer_create(self._need(), backend, byref(cpool),
                                              max_ctas, byref(out)),
              "kvt_transfer_create")
        del keep  # the C call copied the descriptor
        return self._adopt(Transfer(self, desc, out))

    def close(self) -> None:
        """Closes the handles made through this namespace, then unmaps it."""
        if self._ptr is None:
            return
        for child in list(self._children):
            child.close()
        _lib.load().kvt_namespace_close(self._take())


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
        n = lib.kvt_reservation_num_device_snapshot_rows(ptr)
        p = lib.kvt_reservation_device_snapshot_rows(ptr)
        self.device_snapshot_rows = [p[i] for i in range(n)] if n else []

    def _placements(self, snapshots, what: str):
        hb = self._ns.hash_bytes
        snaps = list(snapshots)
        arr = (_lib.SnapshotPlacement * max(1, len(snaps)))()
        keep = []
        for i, (index, h) in enumerate(snaps):
            if len(h) != hb:
                raise ValueError(f"{what}[{i}].hash: {len(h)} bytes, the "
                                 f"namespace's hashes have {hb}")
            buf = _lib.u8(bytes(h))
            keep.append(buf)
            arr[i] = _lib.SnapshotPlacement(index, ctypes.cast(buf, ctypes.POINTER(ctypes.c_uint8)))
        return arr, len(snaps), keep

    def _args(self, hashes, parent, snapshots):
        packed, n = _join_hashes(hashes, self._ns.hash_bytes)
        arr, ns, keep = self._placements(snapshots, "snapshots")
        return (_lib.u8(parent), len(parent or b""), _lib.u8(packed), n,
                arr, ns, keep)

    def _set_tokens(self, token_ids) -> None:
        if token_ids is None:
            return
        ids = [int(t) for t in token_ids]
        arr = (ctypes.c_uint32 * max(1, len(ids)))(*ids)
        check(_lib.load().kvt_reservation_set_token_ids(self._need(), arr, len(ids)),
              "kvt_reservation_set_token_ids")

    def commit(self, hashes, parent: bytes | None = None,
               snapshots: Iterable[tuple[int, bytes]] = (),
               device_snapshots: Iterable[tuple[int, bytes]] = (),
               token_ids: Iterable[int] | None = None) -> CommitResult:
        """Makes the rows visible under `hashes` (one per page row) below
        `parent` (None: the first pages); `snapshots` places snapshot row
        `index` (into snapshot_rows) after the page with that hash, and
        `device_snapshots` device slot `index` (into device_snapshot_rows)
        the same way (kvt_commit_with_device; a device slot is served only
        where the host index holds the same snapshot). `token_ids` (the
        pages' tokens, tokens_per_page each) go to the daemon's KV events
        only. REQUIRES: the rows are fully written (else commit_after). On
        failure the reservation stays open."""
        self._set_tokens(token_ids)
        p, plen, h, n, arr, ns, keep = self._args(hashes, parent, snapshots)
        res = _lib.CommitResult()
        device = list(device_snapshots)
        if not device:
            check(_lib.load().kvt_commit(self._need(), p, plen, h, n, arr, ns,
                                         byref(res)), "kvt_commit")
        else:
            darr, dn, dkeep = self._placements(device, "device_snapshots")
            check(_lib.load().kvt_commit_with_device(
                self._need(), p, plen, h, n, arr, ns, darr, dn, byref(res)),
                "kvt_commit_with_device")
        self._ptr = None
        return _commit_result(res)

    def commit_after(self, stream, hashes, parent: bytes | None = None,
                     snapshots: Iterable[tuple[int, bytes]] = (),
                     token_ids: Iterable[int] | None = None) -> PendingCommit:
        """As commit, once `stream`'s queued work has finished, without
        blocking (stream None: now, on libkvtier's worker)."""
        self._set_tokens(token_ids)
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

    def save_snapshots(self, slots: Sequence[int], row: int, stream=None) -> None:
        """A snapshot row of several groups (vLLM's Mamba groups): copies
        slots[g] into group g's part of row `row`, one copy on the stream."""
        slots = list(slots)
        check(_lib.load().kvt_snapshot_save_groups(
            self._need(), _lib.u32_array(slots), len(slots), row,
            self._stream(stream)), "kvt_snapshot_save_groups")

    def restore_snapshots(self, slots: Sequence[int], row: int, stream=None) -> None:
        """Copies group g's part of snapshot row `row` into slots[g]."""
        slots = list(slots)
        check(_lib.load().kvt_snapshot_restore_groups(
            self._need(), _lib.u32_array(slots), len(slots), row,
            self._stream(stream)), "kvt_snapshot_restore_groups")

    def close(self) -> None:
        if self._ptr is None:
            return
        _lib.load().kvt_transfer_free(self._take())
