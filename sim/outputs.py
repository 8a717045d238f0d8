"""Writing outputs safely: probe an output folder before the work, write each file atomically.

- :func:`probe_out_dir` creates the folder and proves it writable (a temporary file created and removed), so a
  read-only or impossible path fails in a second with one line instead of after the work.
- :func:`atomic_write` yields a temporary path in the target's folder; on success it is renamed over the target
  (``os.replace``, atomic on POSIX), on failure removed -- a full disk never leaves a truncated file behind.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path
from typing import Iterator

from sim.errors import ConfigError

__all__ = ["atomic_write", "atomic_write_text", "probe_out_dir"]


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def probe_out_dir(path: str | Path, field: str = "--out") -> Path:
    """``path`` created (with parents) and shown writable; else a ConfigError on ``field``."""
    path = Path(path)
    try:
        path.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".kvtune-probe-", dir=path)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise ConfigError(field, f"cannot write to {path}: {exc.strerror or exc}") from None
    return path


@contextlib.contextmanager
def atomic_write(target: str | Path, field: str = "--out") -> Iterator[Path]:
    """A temporary path beside ``target`` to write to; renamed onto ``target`` when the block ends without error."""
    target = Path(target)
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
        os.fchmod(fd, 0o666 & ~_umask())  # as open() would create it, not mkstemp's 0600
        os.close(fd)
    except OSError as exc:
        raise ConfigError(field, f"cannot write {target}: {exc.strerror or exc}") from None
    tmp_path = Path(tmp)
    try:
        yield tmp_path
        os.replace(tmp_path, target)
    except OSError as exc:
        raise ConfigError(field, f"cannot write {target}: {exc.strerror or exc}") from None
    finally:
        with contextlib.suppress(OSError):
            tmp_path.unlink()


def atomic_write_text(target: str | Path, text: str, field: str = "--out", encoding: str = "utf-8") -> None:
    with atomic_write(target, field) as tmp:
        tmp.write_text(text, encoding=encoding)
