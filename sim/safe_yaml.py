"""Reading YAML that users hand kvtune (study specs, workload specs, profiles): text only, no aliases, bounded
nesting, bounded size.

YAML aliases let 1 KB of text expand to gigabytes (the "billion laughs"); specs never need them, so an alias is
refused where it appears.  Nesting deeper than :data:`MAX_DEPTH` is refused before PyYAML's recursive composer
overflows the stack.  Every problem is a :class:`~sim.errors.ConfigError` on ``field`` naming the file and line.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from sim.errors import ConfigError

__all__ = ["MAX_BYTES", "MAX_DEPTH", "load_yaml", "read_yaml"]

MAX_DEPTH = 64
MAX_BYTES = 16 * 2**20


class _Loader(yaml.SafeLoader):
    """SafeLoader that refuses aliases and deep nesting."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise yaml.MarkedYAMLError(None, None, "aliases (*name) are not allowed in kvtune files; write the "
                                                   "values out", event.start_mark)
        self._depth += 1
        if self._depth > MAX_DEPTH:
            event = self.peek_event()
            raise yaml.MarkedYAMLError(None, None, f"nested deeper than {MAX_DEPTH} levels", event.start_mark)
        try:
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


def load_yaml(text: str, source: str = "<text>", field: str = "spec") -> Any:
    """``text`` parsed as YAML (safe types only); a ConfigError on ``field`` naming ``source`` and the line."""
    if "\x00" in text:
        raise ConfigError(field, f"{source} is not a text file (it holds NUL bytes)")
    try:
        return yaml.load(text, Loader=_Loader)  # noqa: S506 (a SafeLoader subclass)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark
        where = f"{source}:{mark.line + 1}" if mark is not None else source
        problem = " ".join(str(exc.problem or exc).split())[:200]
        raise ConfigError(field, f"{where}: not valid YAML: {problem}") from None
    except (yaml.YAMLError, RecursionError) as exc:
        raise ConfigError(field, f"{source}: not valid YAML: {' '.join(str(exc).split())[:200]}") from None


def read_yaml(path: str | Path, field: str = "spec") -> Any:
    """The YAML file at ``path`` (UTF-8 text, at most :data:`MAX_BYTES`), parsed by :func:`load_yaml`."""
    path = Path(path)
    try:
        size = path.stat().st_size
        if size > MAX_BYTES:
            raise ConfigError(field, f"{path} is {size} bytes; a kvtune YAML file is at most {MAX_BYTES}")
        data = path.read_bytes()
    except OSError as exc:
        raise ConfigError(field, f"cannot read {path}: {exc.strerror or exc}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(field, f"{path} is not UTF-8 text (byte {exc.start}: {data[exc.start:exc.start + 1]!r})") from None
    return load_yaml(text, str(path), field)
