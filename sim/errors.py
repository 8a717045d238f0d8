"""User-facing errors: each names the file, line or field at fault.

The CLI prints ``str(error)`` as one line and exits non-zero; nothing below the CLI prints tracebacks
for these.  Everything else is a bug and keeps its traceback.
"""

from __future__ import annotations


def short_repr(value: object, limit: int = 80) -> str:
    """``repr(value)`` cut to ``limit`` characters, for error messages: a hostile value (a huge list, a YAML
    expansion) must not flood the one error line."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


class KvtuneError(Exception):
    """Base class for errors caused by the user's input (a file, a flag, a spec)."""


class ConfigError(KvtuneError):
    """An invalid configuration value; ``field`` names the offending key."""

    def __init__(self, field: str, message: str):
        self.field = field
        self.message = message
        super().__init__(f"{field}: {message}")

    def __reduce__(self):
        # Rebuilt from the constructor's own arguments, so a Ray worker's error reaches the driver intact.
        return type(self), (self.field, self.message)


class TraceError(KvtuneError):
    """A malformed trace; ``path`` and ``line`` (1-based, header is line 1) locate it."""

    def __init__(self, path: str, line: int | None, message: str):
        self.path = str(path)
        self.line = line
        self.message = message
        where = f"{self.path}:{line}" if line is not None else self.path
        super().__init__(f"{where}: {message}")

    def __reduce__(self):
        return type(self), (self.path, self.line, self.message)


class EngineAborted(KvtuneError):
    """The simulated engine died, as vLLM does (e.g. V0 swap preemption with no CPU blocks left)."""
