"""User-facing errors: each carries a one-line message that says how to fix the problem."""


class LocalsError(Exception):
    """An error whose message is shown to the user as is (no traceback)."""


class ModelNotFound(LocalsError):
    """A model name, path or repo id that cannot be resolved to weights."""


class UnsupportedModel(LocalsError):
    """Weights that exist but that locals cannot run (e.g. a GGUF of an unsupported kind)."""


class OfflineError(LocalsError):
    """A download was needed but the network (or the hub) is unreachable."""


class RequestError(LocalsError):
    """A malformed or impossible request; the server maps it to a 4xx JSON body."""

    status = 400


class TooLarge(RequestError):
    """A request that can never fit the memory budget."""

    status = 413


class DaemonNotRunning(LocalsError):
    """The daemon is not reachable; the message names `locals start`."""


class ServerStopping(LocalsError):
    """The server stopped under a request before its reply was finished: a 503, send it again."""


class UnusableFolder(LocalsError, OSError):
    """A data folder locals cannot create or write: a one-line message for the CLI, and still an
    OSError to the code that falls back without the folder (a cache left off)."""
