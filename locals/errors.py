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
    code: str | None = None  # OpenAI's machine-readable `error.code`

    def message_for(self, api: str) -> str:
        """The message as `api`'s clients ("openai", "anthropic", "ollama") read it."""
        return str(self)


class ContextOverflow(RequestError):
    """A prompt longer than the model's context, worded as each API's own servers word it, so
    agents recognise it and compact their conversation (OpenCode, Codex and litellm match
    OpenAI's code or wording; Anthropic's clients match "prompt is too long")."""

    code = "context_length_exceeded"

    def __init__(self, prompt: int, context: int, advice: str):
        self.prompt, self.context, self.advice = prompt, context, advice
        super().__init__(self.message_for("openai"))

    def message_for(self, api: str) -> str:
        if api == "anthropic":
            return f"prompt is too long: {self.prompt} tokens > {self.context} maximum; {self.advice}"
        return (f"This model's maximum context length is {self.context} tokens. However, your messages "
                f"resulted in {self.prompt} tokens; {self.advice}")


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
