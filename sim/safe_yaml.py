"""Reading YAML that users hand kvtune (study specs, workload specs, profiles): text only, no aliases, bounded
nesting, bounded size.  Every YAML file kvtune reads goes through here; the files it ships inside its packages
(``sim/data/*.yaml``, ``optimizer/data/*.yaml``, the bundled device YAMLs) through :func:`read_package_yaml`,
the one trusted path: maintainers write those, so aliases are allowed there, and the other checks still hold.

YAML aliases let 1 KB of text expand to gigabytes (the "billion laughs"); specs never need them, so an alias is
refused where it appears.  Nesting deeper than :data:`MAX_DEPTH` is refused before PyYAML's recursive composer
overflows the stack.  Every problem is an error of the whole file in the one form of :func:`sim.fields.file_error`,
``<file>[:<line>]: <problem>`` (``spec.yaml:3: not valid YAML: ...``, ``p.yaml: cannot read: No such file or
directory``): it names its file, so a document that points at this one (a latency profile a study spec names)
leaves it as it is.  An unreadable file's error has the ``OSError`` as its ``__cause__``: there the path that
named it may be at fault rather than the file.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from sim.fields import file_error

__all__ = ["MAX_BYTES", "MAX_DEPTH", "load_yaml", "read_package_yaml", "read_yaml"]

MAX_DEPTH = 64
MAX_BYTES = 16 * 2**20


class _Loader(yaml.SafeLoader):
    """SafeLoader that refuses aliases and deep nesting."""

    allow_aliases = False

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        if not self.allow_aliases and self.check_event(yaml.AliasEvent):
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


class _TrustedLoader(_Loader):
    """The same for kvtune's own package data: aliases allowed (see :func:`read_package_yaml`)."""

    allow_aliases = True


if getattr(yaml, "__with_libyaml__", False):
    from yaml.composer import Composer
    from yaml.constructor import SafeConstructor
    from yaml.cyaml import CParser
    from yaml.resolver import Resolver

    class _TrustedCLoader(CParser, _TrustedLoader):  # type: ignore[misc]
        """:class:`_TrustedLoader` on libyaml's parser (PyYAML's ``CParser``): the text is scanned and parsed in C,
        ~7x faster than PyYAML's pure-Python scanner on the package YAMLs (a ``kvtune simulate`` reads four of them
        at start-up, issue 34); the nodes are still composed by PyYAML's Python composer, so the nesting check of
        :meth:`_Loader.compose_node` holds (libyaml's own composer, ``CSafeLoader``'s, has none) and the values are
        built by the same safe constructor and resolver.  Only the trusted path uses it: libyaml words some syntax
        errors differently from PyYAML, and a user's file keeps PyYAML's messages."""

        get_single_node = Composer.get_single_node  # CParser's composer (in C) replaced by the Python one
        check_node = Composer.check_node
        get_node = Composer.get_node

        def __init__(self, stream: str) -> None:
            CParser.__init__(self, stream)
            Composer.__init__(self)
            SafeConstructor.__init__(self)
            Resolver.__init__(self)
            self._depth = 0

    _TRUSTED: type = _TrustedCLoader
else:  # PyYAML without libyaml: the pure-Python loader, the same values
    _TRUSTED = _TrustedLoader


def load_yaml(text: str, source: str = "<text>", *, aliases: bool = False) -> Any:
    """``text`` parsed as YAML (safe types only; aliases only with ``aliases``, for trusted text); a problem is
    :func:`sim.fields.file_error` naming ``source`` and the line."""
    if "\x00" in text:
        raise file_error(source, "not a text file (it holds NUL bytes)")
    try:
        return yaml.load(text, Loader=_TRUSTED if aliases else _Loader)  # noqa: S506 (SafeLoader subclasses)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark
        problem = " ".join(str(exc.problem or exc).split())[:200]
        raise file_error(source, f"not valid YAML: {problem}", mark.line + 1 if mark is not None else None) from None
    except (yaml.YAMLError, RecursionError) as exc:
        raise file_error(source, f"not valid YAML: {' '.join(str(exc).split())[:200]}") from None


def read_yaml(path: str | Path, *, aliases: bool = False) -> Any:
    """The YAML file at ``path`` (UTF-8 text, at most :data:`MAX_BYTES`), parsed by :func:`load_yaml` (``aliases``:
    trusted, a file kvtune's maintainers write); every problem is :func:`sim.fields.file_error` naming ``path``."""
    path = Path(path)
    try:
        size = path.stat().st_size
        data = path.read_bytes() if size <= MAX_BYTES else b""
    except OSError as exc:
        # ``from exc``: the OSError cause tells a caller the file is unreadable (the path naming it may be at fault)
        raise file_error(path, f"cannot read: {exc.strerror or exc}") from exc
    if size > MAX_BYTES:
        raise file_error(path, f"too large: {size} bytes; a kvtune YAML file is at most {MAX_BYTES}")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise file_error(path, f"not UTF-8 text (byte {exc.start}: {data[exc.start:exc.start + 1]!r})") from None
    return load_yaml(text, str(path), aliases=aliases)


def read_package_yaml(package: str, *parts: str) -> Any:
    """The YAML file ``parts`` inside ``package`` (``read_package_yaml("sim", "data", "hardware.yaml")``): data
    kvtune ships, read by :func:`read_yaml` with aliases allowed; size, nesting and text are checked as for any
    file, and a problem names the file."""
    with resources.as_file(resources.files(package).joinpath(*parts)) as path:
        return read_yaml(path, aliases=True)
