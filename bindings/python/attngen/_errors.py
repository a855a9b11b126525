# SPDX-License-Identifier: BSD-3-Clause
"""Python exceptions for attngen's C status codes.

Pure Python (no ctypes, no torch), so the mapping is testable anywhere. The
codes mirror `enum ag_status` in include/attngen.h; keep both in step.
"""

# enum ag_status, in header order.
AG_OK = 0
AG_ERR_SPEC = 1
AG_ERR_UNSUPPORTED = 2
AG_ERR_IO = 3
AG_ERR_NOMEM = 4
AG_ERR_TEMPLATE = 5
AG_ERR_NVRTC = 6
AG_ERR_NO_DRIVER = 7
AG_ERR_NO_DEVICE = 8
AG_ERR_CUDA = 9
AG_ERR_INVALID_ARGUMENT = 10
AG_ERR_CACHE = 11
AG_ERR_COUNT = 12

# Used only when the library cannot be asked (ag_strerror is the source of
# truth once it is loaded).
_FALLBACK_NAMES = {
    AG_OK: "ok",
    AG_ERR_SPEC: "invalid spec",
    AG_ERR_UNSUPPORTED: "not supported yet",
    AG_ERR_IO: "I/O error",
    AG_ERR_NOMEM: "out of memory",
    AG_ERR_TEMPLATE: "template error",
    AG_ERR_NVRTC: "NVRTC compilation failed",
    AG_ERR_NO_DRIVER: "CUDA driver not found",
    AG_ERR_NO_DEVICE: "no usable CUDA device",
    AG_ERR_CUDA: "CUDA error",
    AG_ERR_INVALID_ARGUMENT: "invalid argument",
    AG_ERR_CACHE: "cache error",
}


class AttngenError(Exception):
    """Base of every error raised by attngen.

    `code` is the C status (an int, AG_ERR_*), `code_name` its
    ag_strerror() text, `detail` the C error record's message (may be empty).
    """

    def __init__(self, message, code=None, code_name=None, detail=None):
        super().__init__(message)
        self.code = code
        self.code_name = code_name
        self.detail = detail


class LibraryNotFoundError(AttngenError, OSError):
    """libattngen.so could not be found or loaded."""


class SpecError(AttngenError, ValueError):
    """AG_ERR_SPEC: the spec is invalid; the message lists every error."""


class UnsupportedError(AttngenError, NotImplementedError):
    """AG_ERR_UNSUPPORTED: a valid request attngen cannot serve yet."""


class AttngenIOError(AttngenError, OSError):
    """AG_ERR_IO: a file could not be read or written."""


class AttngenMemoryError(AttngenError, MemoryError):
    """AG_ERR_NOMEM."""


class CompileError(AttngenError):
    """AG_ERR_NVRTC (message carries the NVRTC log) or AG_ERR_TEMPLATE."""


class DriverError(AttngenError):
    """AG_ERR_NO_DRIVER / AG_ERR_NO_DEVICE: no CUDA driver or device."""


class CudaError(AttngenError):
    """AG_ERR_CUDA: a Driver API call failed."""


class InvalidArgumentError(AttngenError, ValueError):
    """AG_ERR_INVALID_ARGUMENT: the C launcher rejected an argument."""


class CacheError(AttngenError):
    """AG_ERR_CACHE: the kernel cache failed in a way that was not a miss."""


_CLASSES = {
    AG_ERR_SPEC: SpecError,
    AG_ERR_UNSUPPORTED: UnsupportedError,
    AG_ERR_IO: AttngenIOError,
    AG_ERR_NOMEM: AttngenMemoryError,
    AG_ERR_TEMPLATE: CompileError,
    AG_ERR_NVRTC: CompileError,
    AG_ERR_NO_DRIVER: DriverError,
    AG_ERR_NO_DEVICE: DriverError,
    AG_ERR_CUDA: CudaError,
    AG_ERR_INVALID_ARGUMENT: InvalidArgumentError,
    AG_ERR_CACHE: CacheError,
}


def error_class(code):
    """The exception class for a C status code (AttngenError if unknown)."""
    return _CLASSES.get(code, AttngenError)


def make_error(code, detail, code_name=None, context=None):
    """Build the exception for a failed C call.

    The message reads "<context>: <code name>: <C message>", each part only
    when present, so the C text (spec diagnostics, NVRTC log, ...) is kept
    verbatim.
    """
    if code_name is None:
        code_name = _FALLBACK_NAMES.get(code, "unknown error %d" % code)
    detail = (detail or "").rstrip("\n")
    parts = [p for p in (context, code_name) if p]
    head = ": ".join(parts)
    message = "%s: %s" % (head, detail) if detail else head
    return error_class(code)(message, code=code, code_name=code_name, detail=detail)
