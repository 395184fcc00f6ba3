"""Exceptions for libkvtier's status codes.

Every C ABI call returns a kvt_status (the canonical absl/gRPC codes). A
non-zero status becomes an exception whose class names the code (a subclass of
KvtierError, which also carries `.code` and the library's kvt_last_error()
message), so callers can catch what they handle (say NotFoundError) and let
the rest propagate.

Thread-safety: check() must run on the thread that made the failing call:
kvt_last_error() is per thread.
"""

from __future__ import annotations

from . import _lib

CODE_NAMES = {
    0: "OK", 1: "CANCELLED", 2: "UNKNOWN", 3: "INVALID_ARGUMENT",
    4: "DEADLINE_EXCEEDED", 5: "NOT_FOUND", 6: "ALREADY_EXISTS",
    7: "PERMISSION_DENIED", 8: "RESOURCE_EXHAUSTED", 9: "FAILED_PRECONDITION",
    10: "ABORTED", 11: "OUT_OF_RANGE", 12: "UNIMPLEMENTED", 13: "INTERNAL",
    14: "UNAVAILABLE", 15: "DATA_LOSS", 16: "UNAUTHENTICATED",
}


class KvtierError(Exception):
    """A libkvtier call failed. `code` is the kvt_status, `message` the text."""

    def __init__(self, code: int, message: str, call: str = ""):
        self.code = code
        self.code_name = CODE_NAMES.get(code, str(code))
        self.message = message
        self.call = call
        where = f"{call}: " if call else ""
        super().__init__(f"{where}{self.code_name}: {message}")


class CancelledError(KvtierError): pass
class UnknownError(KvtierError): pass
class InvalidArgumentError(KvtierError, ValueError): pass
class DeadlineExceededError(KvtierError, TimeoutError): pass
class NotFoundError(KvtierError, LookupError): pass
class AlreadyExistsError(KvtierError): pass
class PermissionDeniedError(KvtierError, PermissionError): pass
class ResourceExhaustedError(KvtierError): pass
class FailedPreconditionError(KvtierError): pass
class AbortedError(KvtierError): pass
class OutOfRangeError(KvtierError, IndexError): pass
class UnimplementedError(KvtierError, NotImplementedError): pass
class InternalError(KvtierError): pass
class UnavailableError(KvtierError, ConnectionError): pass
class DataLossError(KvtierError): pass
class UnauthenticatedError(KvtierError): pass

_BY_CODE = {
    1: CancelledError, 2: UnknownError, 3: InvalidArgumentError,
    4: DeadlineExceededError, 5: NotFoundError, 6: AlreadyExistsError,
    7: PermissionDeniedError, 8: ResourceExhaustedError,
    9: FailedPreconditionError, 10: AbortedError, 11: OutOfRangeError,
    12: UnimplementedError, 13: InternalError, 14: UnavailableError,
    15: DataLossError, 16: UnauthenticatedError,
}


def error_for(code: int, message: str, call: str = "") -> KvtierError:
    """The exception for status `code` (KvtierError for unknown codes)."""
    return _BY_CODE.get(code, KvtierError)(code, message, call)


def check(status: int, call: str) -> None:
    """Raises the exception for `status` unless it is KVT_OK (0).

    The message is kvt_last_error() of this thread, read right away.
    """
    if status == 0:
        return
    raw = _lib.load().kvt_last_error()
    message = raw.decode("utf-8", "replace") if raw else ""
    # The library's text is absl::Status::ToString(): "CODE: message".
    prefix = CODE_NAMES.get(status, "") + ": "
    if message.startswith(prefix):
        message = message[len(prefix):]
    raise error_for(status, message, call)
