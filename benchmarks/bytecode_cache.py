"""The environment a peer benchmark's kvtune process runs in (``vs_vidur.py``, ``fleet_vs_dynamo.py``,
``whole_process.py``).

A peer (Vidur, Dynamo) runs from a venv that ``pip install`` filled with compiled bytecode (``__pycache__``), so its
process unmarshals its modules.  kvtune runs from this checkout, whose bytecode Python writes beside the sources on
first import, unless ``PYTHONDONTWRITEBYTECODE`` is set (as in some sandboxes and CI images): then every kvtune
process compiles its ~55 modules from source again, ~0.1 CPU s that an installed kvtune never pays.
:func:`kvtune_env` gives the kvtune side the same footing: bytecode written once (by the benchmark's untimed warm-up
run) to ``cache`` and read from there, never into the checkout.  ``whole_process.py`` measures what it saves.
"""

from __future__ import annotations

from pathlib import Path


def kvtune_env(env: dict[str, str], cache: Path) -> dict[str, str]:
    """``env`` with Python's bytecode written to and read from ``cache`` (``PYTHONPYCACHEPREFIX``)."""
    out = {k: v for k, v in env.items() if k != "PYTHONDONTWRITEBYTECODE"}
    out["PYTHONPYCACHEPREFIX"] = str(cache)
    return out
