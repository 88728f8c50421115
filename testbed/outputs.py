"""Output paths checked up front: a command that will write somewhere finds out before it starts, not at the end.

`check_output_dir` for directories a command creates or fills (`--out` of run/sweep/profile/report) and
`check_output_file` for single files (`--csv`). Both raise a one-line InputError naming the flag, and change nothing:
writability is tested by creating and removing a temporary file in the directory (or in its parent when the
directory does not exist yet), which also catches read-only file systems where root's permission bits do not apply.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from testbed.errors import InputError


def _reason(e: OSError) -> str:
    return e.strerror or type(e).__name__


def _probe_write(directory: Path, flag: str, shown: Path) -> None:
    try:
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=".testbed-write-check-")
    except OSError as e:
        raise InputError(f"{flag} {shown}: cannot write in {directory} ({_reason(e)})") from None
    os.close(fd)
    os.unlink(tmp)


def _existing_parent(path: Path, flag: str) -> Path:
    parent = path.absolute().parent
    if not parent.exists():
        raise InputError(f"{flag} {path}: parent directory {parent} does not exist; create it first")
    if not parent.is_dir():
        raise InputError(f"{flag} {path}: {parent} is not a directory")
    return parent


def check_output_dir(path: str | Path, flag: str, *, subdirs: tuple[str, ...] = ()) -> Path:
    """A directory the command creates (its parent must exist) or writes into. `subdirs` that exist already must be
    writable directories too (e.g. a results directory's rows/)."""
    path = Path(path)
    if str(path).strip() == "":
        raise InputError(f"{flag}: empty; expected a directory")
    if path.exists() or path.is_symlink():
        if not path.is_dir():
            raise InputError(f"{flag} {path}: is a file; expected a directory (it is created when missing)")
        _probe_write(path, flag, path)
        for name in subdirs:
            sub = path / name
            if sub.exists() or sub.is_symlink():
                if not sub.is_dir():
                    raise InputError(f"{flag} {path}: {sub} is not a directory; is {path} a results directory?")
                _probe_write(sub, flag, path)
        return path
    _probe_write(_existing_parent(path, flag), flag, path)
    return path


def check_output_file(path: str | Path, flag: str) -> Path:
    """A file the command writes (created or replaced): not a directory, its parent exists and is writable."""
    path = Path(path)
    if str(path).strip() == "":
        raise InputError(f"{flag}: empty; expected a file name")
    if path.is_dir():
        raise InputError(f"{flag} {path}: is a directory; expected a file name")
    parent = _existing_parent(path, flag)
    _probe_write(parent, flag, path)
    if path.exists():
        try:
            with open(path, "ab"):
                pass
        except OSError as e:
            raise InputError(f"{flag} {path}: cannot write ({_reason(e)})") from None
    return path
