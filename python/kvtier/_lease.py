"""Lease, the answer of a lookup (Namespace.lookup): pinned rows of the
prefix index until released. Re-exported by kvtier.client (and kvtier);
its own module because device pools restore from a lease
(DevicePool.restore_snapshot) and device_pool.py must not import
client.py, which opens device pools.

Thread-safety: one thread at a time; release is idempotent.
"""

from __future__ import annotations

from ctypes import c_void_p

from . import _lib
from ._handle import _Handle
from ._types import _after_handle
from .errors import check


class Lease(_Handle):
    """The answer of a lookup. `rows` are the page rows of pages
    [0, usable_pages); with a snapshot, `snapshot_row` holds the state after
    page usable_pages-1. Release after the copies that read the rows: use
    release(stream) when they are queued on a CUDA stream. The context
    manager releases now if not released yet. Made by Namespace.lookup
    (`ns`, which the lease keeps alive)."""

    def __init__(self, ns, ptr: c_void_p):
        self._ns = ns
        self._ptr = ptr
        lib = _lib.load()
        self.matched_pages = lib.kvt_lease_matched_pages(ptr)
        self.usable_pages = lib.kvt_lease_usable_pages(ptr)
        rows = lib.kvt_lease_rows(ptr)
        self.rows = [rows[i] for i in range(self.usable_pages)] if rows else []
        self.has_snapshot = bool(lib.kvt_lease_has_snapshot(ptr))
        self.snapshot_row = lib.kvt_lease_snapshot_row(ptr) if self.has_snapshot else None
        # The same snapshot in the device pool the lookup named (pinned with
        # the lease): restore it device-to-device (DevicePool.restore_snapshot).
        self.has_device_snapshot = bool(lib.kvt_lease_has_device_snapshot(ptr))
        self.device_snapshot_row = (lib.kvt_lease_device_snapshot_row(ptr)
                                    if self.has_device_snapshot else None)
        # From a remote lookup (0 otherwise): the pages past matched_pages
        # that the cluster tier holds, and those a running prefetch brings
        # in (neither pinned nor in rows yet; Namespace.prefetch).
        self.remote_pages = lib.kvt_lease_remote_pages(ptr)
        self.prefetching_pages = lib.kvt_lease_prefetching_pages(ptr)

    def release(self, stream=None) -> None:
        """Releases the pin now (stream None) or once `stream`'s queued work
        has finished, without blocking. Idempotent."""
        if self._ptr is None:
            return
        check(_lib.load().kvt_lease_release(self._take(), c_void_p(_after_handle(stream))),
              "kvt_lease_release")

    close = release
