"""Exception types of the public API. Every message is one line naming the problem."""


class K3Error(Exception):
    """Base class of k3compile's errors."""


class SpecError(K3Error, ValueError):
    """A layer spec file is missing, malformed, or describes an impossible layer."""


class IRError(K3Error, ValueError):
    """IR text did not parse or verify, or a pass/pipeline name is unknown."""


class UnsupportedError(K3Error):
    """The request is valid but k3compile has no lowering for it (yet)."""


class VerificationError(K3Error):
    """Compiled kernels disagreed with the reference semantics."""


class OutputError(K3Error, OSError):
    """The compiled module could not be written where asked."""


class ArgumentError(K3Error, ValueError):
    """An argument of a command or function is invalid (e.g. a device this machine lacks)."""
