"""The one atomic file write of the controller and the shaping tool: a temp file beside the target, flushed and
fsynced, renamed over the target, and the directory fsynced, so a reader sees the old file or the new one, never a
torn one, also after a crash. (runners/ keeps one rank-side copy: ranks may not import shaping/.)
"""

from __future__ import annotations

import contextlib
import os
import secrets
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """Yield a temp path beside `path` for the caller to write (e.g. a Parquet writer); on a clean exit it is
    fsynced and renamed over `path`, on an exception it is removed and `path` is left as it was."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    try:
        yield tmp
        with open(tmp, "rb") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    with contextlib.suppress(OSError):  # make the rename itself durable; some filesystems refuse a dir fsync
        fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def atomic_write(path: str | Path, data: str | bytes) -> Path:
    """Replace `path` with `data` (text is written as UTF-8) atomically and durably; returns the path."""
    with atomic_path(path) as tmp:
        tmp.write_bytes(data.encode() if isinstance(data, str) else data)
    return Path(path)
