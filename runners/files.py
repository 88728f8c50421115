"""The rank side's one atomic write (temp file, fsync, rename). runners/ may not import shaping (whose
shaping/files.py is the controller's), so ranks keep this copy: records are never seen half-written."""

from __future__ import annotations

import os


def atomic_write(path: str, text: str) -> None:
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
