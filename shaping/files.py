"""Files the controller and the shaping tool write: the one atomic write (a temp file beside the target, flushed and
fsynced, renamed over the target, the directory fsynced, so a reader sees the old file or the new one, never a torn
one, also after a crash), and the private, root-owned state directory of the host-side helper, whose files are opened
without following links (runners/ keeps one rank-side copy of the atomic write: ranks may not import shaping/).
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import stat
from collections.abc import Iterator
from pathlib import Path

from shaping.errors import ShapingError

NOFOLLOW = os.O_NOFOLLOW | os.O_CLOEXEC


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


def atomic_write(path: str | Path, data: str | bytes, *, mode: int = 0o644) -> Path:
    """Replace `path` with `data` (text is written as UTF-8) atomically and durably; returns the path. The temp file
    is created new (O_EXCL, never through a link someone planted) with `mode` (less the umask)."""
    with atomic_path(path) as tmp:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | NOFOLLOW, mode)
        with os.fdopen(fd, "wb") as fh:
            fh.write(data.encode() if isinstance(data, str) else data)
    return Path(path)


def private_dir(path: str | Path, *, create: bool = True, group_other_ok: int = 0) -> Path | None:
    """`path` as a directory of this process's user that nobody else can change: created with mode 0700 when missing
    (and `create`), then checked with lstat: a real directory (not a link), owned by our euid, no permission bits for
    group/other beyond `group_other_ok` (0: mode 0700; 0o055: read/search allowed, never write). Returns the path, or
    None when it is missing and not `create`; ShapingError when it exists but fails a check (nothing is used)."""
    path = Path(path)
    if create:
        with contextlib.suppress(FileExistsError):
            os.mkdir(path, 0o700)
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        if create:
            raise
        return None
    if st.st_uid == 0 and os.geteuid() != 0 and stat.S_ISDIR(st.st_mode):
        raise PermissionError(errno.EACCES, f"{path} is root's", str(path))  # a user reading root's state
    problems = []
    if not stat.S_ISDIR(st.st_mode):
        problems.append("a link" if stat.S_ISLNK(st.st_mode) else "not a directory")
    if st.st_uid != os.geteuid():
        problems.append(f"owned by uid {st.st_uid}")
    if st.st_mode & 0o077 & ~group_other_ok:
        problems.append(f"mode {stat.S_IMODE(st.st_mode):04o}")
    if problems:
        need = "0700" if not group_other_ok else "no group/other write"
        raise ShapingError(
            f"state directory {path} is {', '.join(problems)}; expected a directory of uid {os.geteuid()} with "
            f"{need}: refusing to use it (remove it if nothing of the testbed runs)"
        )
    return path


def _check_own_file(fd: int, path: Path) -> None:
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
        os.close(fd)
        raise ShapingError(f"{path} is not a regular file of uid {os.geteuid()}: refusing to use it")


def open_private(path: str | Path, flags: int, mode: int = 0o600) -> int:
    """os.open of a file in a private directory, never through a link (O_NOFOLLOW: a planted link is an error, not
    a redirect) and only when it is a regular file of our euid. Returns the fd."""
    path = Path(path)
    try:
        fd = os.open(path, flags | NOFOLLOW, mode)
    except OSError as e:
        if e.errno == errno.ELOOP:  # the last component is a symbolic link
            raise ShapingError(f"{path} is a symbolic link: refusing to follow it") from None
        raise
    _check_own_file(fd, path)
    return fd
