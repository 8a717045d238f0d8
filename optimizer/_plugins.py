"""kvtune's plugins: packages that add trial backends and subcommands without the optimizer importing them.

A plugin is a module with a ``register()`` function, named in the ``kvtune.plugins`` entry-point group (see
``pyproject.toml``: the replay package registers the ``replay`` backend and the ``twin``/``replay``/``calibrate``
subcommands).  :func:`load_plugins` imports each once.  A source checkout whose installed metadata predates the
group (an editable install made from an older ``pyproject.toml``) falls back to the plugins kvtune ships,
imported by name and skipped when absent, so the arrows sim <- objectives <- optimizer <- replay hold either way.
"""

from __future__ import annotations

import importlib
import logging
from importlib import metadata
from typing import Callable

log = logging.getLogger("kvtune")

GROUP = "kvtune.plugins"
#: The plugins of kvtune's own distribution, for a checkout whose entry points are not installed.
_SHIPPED = ("replay.plugin",)
_loaded = False
#: ``add(subparsers)`` callables that add subcommands to kvtune's CLI.
_COMMANDS: list[Callable] = []


def register_commands(add: Callable) -> None:
    """Have kvtune's CLI call ``add(subparsers)`` when it builds its parser."""
    if add not in _COMMANDS:
        _COMMANDS.append(add)


def command_adders() -> list[Callable]:
    load_plugins()
    return list(_COMMANDS)


def load_plugins() -> None:
    """Import every plugin and call its ``register()`` (once per process)."""
    global _loaded
    if _loaded:
        return
    _loaded = True
    modules = [ep.value.split(":", 1)[0] for ep in metadata.entry_points(group=GROUP)]
    for name in modules or _SHIPPED:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if modules:
                raise
            log.debug("kvtune plugin %s not available: %s", name, exc)
            continue
        module.register()


__all__ = ["GROUP", "command_adders", "load_plugins", "register_commands"]
