"""The exceptions of the ckpt package.

Every failure of libckpt arrives as an instance of Error carrying the
library's status code (``.code``, the ``CKPT_*`` value of ckpt.h, which is
the absl/gRPC status code), its name (``.code_name``) and the message
(``.message``), which names the tensor, key path, option or variable at
fault. Each code has its own subclass; where a builtin exception means the
same thing the subclass derives from it too, so ``except ValueError`` or
``except LookupError`` catch what they would in plain Python.
"""

__all__ = [
    "Error", "Cancelled", "Unknown", "InvalidArgument", "DeadlineExceeded",
    "NotFound", "AlreadyExists", "PermissionDenied", "ResourceExhausted",
    "FailedPrecondition", "Aborted", "OutOfRange", "Unimplemented",
    "Internal", "Unavailable", "DataLoss", "Unauthenticated",
    "LibraryNotFound", "error_for_code",
]

_CODE_NAMES = {
    1: "CANCELLED", 2: "UNKNOWN", 3: "INVALID_ARGUMENT",
    4: "DEADLINE_EXCEEDED", 5: "NOT_FOUND", 6: "ALREADY_EXISTS",
    7: "PERMISSION_DENIED", 8: "RESOURCE_EXHAUSTED", 9: "FAILED_PRECONDITION",
    10: "ABORTED", 11: "OUT_OF_RANGE", 12: "UNIMPLEMENTED", 13: "INTERNAL",
    14: "UNAVAILABLE", 15: "DATA_LOSS", 16: "UNAUTHENTICATED",
}


class Error(Exception):
    """A failure of ckpt: ``code`` (int), ``code_name`` and ``message``."""

    code = 2

    def __init__(self, message, code=None):
        if code is not None:
            self.code = code
        self.message = message
        super().__init__(message)

    @property
    def code_name(self):
        return _CODE_NAMES.get(self.code, "UNKNOWN")

    def __str__(self):
        return "%s: %s" % (self.code_name, self.message)


class Cancelled(Error):
    code = 1


class Unknown(Error):
    code = 2


class InvalidArgument(Error, ValueError):
    """A bad argument, option or state_dict entry; the message names it."""
    code = 3


class DeadlineExceeded(Error, TimeoutError):
    code = 4


class NotFound(Error, LookupError):
    """No such job, step, tensor or key."""
    code = 5


class AlreadyExists(Error):
    code = 6


class PermissionDenied(Error, PermissionError):
    code = 7


class ResourceExhausted(Error):
    code = 8


class FailedPrecondition(Error):
    code = 9


class Aborted(Error):
    code = 10


class OutOfRange(Error):
    code = 11


class Unimplemented(Error):
    code = 12


class Internal(Error):
    code = 13


class Unavailable(Error, ConnectionError):
    """The daemon cannot be reached; retrying later may succeed."""
    code = 14


class DataLoss(Error):
    code = 15


class Unauthenticated(Error):
    code = 16


class LibraryNotFound(FailedPrecondition, ImportError):
    """libckpt.so could not be loaded; the message lists every path tried."""


_BY_CODE = {cls.code: cls for cls in (
    Cancelled, Unknown, InvalidArgument, DeadlineExceeded, NotFound,
    AlreadyExists, PermissionDenied, ResourceExhausted, FailedPrecondition,
    Aborted, OutOfRange, Unimplemented, Internal, Unavailable, DataLoss,
    Unauthenticated)}


def error_for_code(code, message):
    """The Error subclass instance for a CKPT_* code (Unknown if unknown)."""
    cls = _BY_CODE.get(code)
    if cls is None:
        return Unknown("%s (status code %d)" % (message, code))
    return cls(message)
