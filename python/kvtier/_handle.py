"""_Handle, the base of every class that owns one C handle of libkvtier
(Client, Namespace, Lease, Reservation, PendingCommit, Transfer, Mirror,
DevicePool): the handle is freed exactly once, through close() (or its
alias), the context manager, or at the latest by garbage collection.

It sits below client.py, mirror.py and device_pool.py so that they import
it rather than one another (tests/test_imports.py keeps the package's
import graph free of cycles).

Thread-safety: as its subclasses say; closing is not synchronised with
other threads' calls on the same handle.
"""

from __future__ import annotations

from ctypes import c_void_p


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
