"""SSH to lab hosts with paramiko: verified host keys, quoted commands, detached process groups, SFTP.

Security rules:
- Host keys are checked against known_hosts. An unknown key is refused with a message that says how to add it; only
  the explicit opt-in `accept_new_host_keys=True` (CLI `--accept-new-host-keys`) records a new key, and a *changed*
  key is refused even then.
- Every remote command is built from an argv list with `shlex.quote` on each word (`command_line()`), so an
  inventory value such as ``eth0;touch /tmp/pwned`` reaches the remote program as one literal argument and is never
  interpreted by the remote shell. Environment names are validated; values are quoted.
- A detached process (a rank) gets its environment over the SSH channel's stdin, into a 0600 file of a private
  directory, sourced and deleted before it starts (`detached_command_line`): secrets named with `--env` never appear
  on a command line, which every user of the host can read in `ps`. Its log, pid and status files live in that
  directory: fresh (never reused), mode 0700, owned by the login user, checked with lstat (`private_dir_line`).
- No password or agent fallback: the key named in the inventory (or the user's default keys) only.
"""

from __future__ import annotations

import dataclasses
import re
import select
import shlex
import stat
import subprocess
import threading
import time
from pathlib import Path, PurePosixPath

import paramiko

from testbed.errors import ClusterError, InputError

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def command_line(argv: list[str], *, env: dict[str, str] | None = None, cwd: str | PurePosixPath | None = None) -> str:
    """One POSIX shell command line that runs `argv` literally (in `cwd`, with `env` added)."""
    if not argv:
        raise InputError("empty command")
    words = []
    if env:
        for name in env:
            if not _ENV_NAME.match(name):
                raise InputError(f"environment variable name {name!r} is not valid; expected [A-Za-z_][A-Za-z0-9_]*")
        words = ["env"] + [shlex.quote(f"{k}={v}") for k, v in env.items()]
    words += [shlex.quote(str(a)) for a in argv]
    line = " ".join(words)
    if cwd is not None:
        line = f"cd {shlex.quote(str(cwd))} && {line}"
    return line


def env_file_text(env: dict[str, str]) -> bytes:
    """A POSIX shell fragment that exports `env` (names validated, values quoted): what `detached_command_line`'s
    script sources from a 0600 file. It travels over the command's stdin, never on a command line (which every user
    of the host can read in `ps` for the whole life of the rank)."""
    lines = []
    for name, value in env.items():
        if not _ENV_NAME.match(name):
            raise InputError(f"environment variable name {name!r} is not valid; expected [A-Za-z_][A-Za-z0-9_]*")
        lines.append(f"export {name}={shlex.quote(str(value))}\n")
    return "".join(lines).encode()


def private_dir_line(parent: str | PurePosixPath, name: str, *, reuse_own: bool = False) -> str:
    """Remote shell: create `parent/name` as a fresh private directory of the running user, or fail (exit 3, one line
    on stderr). `parent` must be owned by root or the user (a link to it too) and writable by nobody else unless it is
    sticky (/tmp); `name` must not exist yet (never reused: another user may have planted it) and is checked after
    `mkdir` with lstat: a directory, not a link, owned by the user, mode 0700. `reuse_own`: an existing `name` that
    passes that check is used (hosts that share a filesystem make the same attempt directory; no other user can
    make a directory that is the login user's)."""
    if not name or "/" in name or name in (".", ".."):
        raise InputError(f"private directory name {name!r}: expected one path component")
    p, d = shlex.quote(str(parent)), shlex.quote(f"{str(parent).rstrip('/')}/{name}")

    def fail(msg: str) -> str:
        return f"{{ echo {shlex.quote(msg)} >&2; exit 3; }}"

    mkdir = f"mkdir -m 700 {d} 2>/dev/null"
    if not reuse_own:
        mkdir += f" || {fail(f'{parent}/{name} exists already (planted?); refusing to use it')}"
    return (
        f"u=$(id -u); [ -e {p} ] || mkdir -p {p} || {fail(f'run directory {parent} (testbed_run_dir) cannot be made')}; "
        f"[ -d {p} ] || {fail(f'run directory {parent} (testbed_run_dir) is not a directory')}; "
        f'[ ! -L {p} ] || {{ o=$(stat -c %u {p}); [ "$o" = 0 ] || [ "$o" = "$u" ]; }} || '
        f"{fail(f'run directory {parent} (testbed_run_dir) is a link made by another user; refusing')}; "
        f'o=$(stat -L -c %u {p}); [ "$o" = 0 ] || [ "$o" = "$u" ] || '
        f"{fail(f'run directory {parent} (testbed_run_dir) belongs to another user; refusing (expected root or you)')}; "
        f"[ -k {p} ] || [ $((0$(stat -L -c %a {p}) & 022)) -eq 0 ] || "
        f"{fail(f'run directory {parent} (testbed_run_dir) is writable by others and not sticky; refusing')}; "
        f"{mkdir}; "
        f'[ -d {d} ] && [ ! -L {d} ] && [ "$(stat -c %u {d})" = "$u" ] && [ "$(stat -c %a {d})" = 700 ] || '
        f"{fail(f'{parent}/{name} is not a private directory of the login user; refusing to use it')}"
    )


def private_dir_check_line(path: str | PurePosixPath) -> str:
    """Remote shell: exit 0 only if `path` is a directory (not a link) of the running user with mode 0700 (lstat)."""
    q = shlex.quote(str(path))
    return (
        f'[ -d {q} ] && [ ! -L {q} ] && [ "$(stat -c %u {q})" = "$(id -u)" ] && [ "$(stat -c %a {q})" = 700 ] || '
        f"{{ echo {shlex.quote(f'{path} is not a private directory of the login user; refusing to read it')} >&2; "
        "exit 3; }"
    )


def detached_command_line(
    argv: list[str],
    *,
    run_dir: str | PurePosixPath,
    cwd: str | PurePosixPath | None,
    marker: str | None = None,
) -> str:
    """Start `argv` in a new session/process group (setsid) and return at once. Everything it leaves lives in
    `run_dir`, a private directory the caller made just before (`private_dir_line`): its output goes to `log`, its
    group id to `pid` and, when it ends on its own, its exit status to `rc`. Its environment is read from stdin into
    `env` (mode 0600, written with `env_file_text`), sourced by the detached shell and deleted before `argv` starts:
    no variable value appears on any command line. `marker` (NAME=value) is put in the group leader's environment so a
    later kill can check /proc/PGID/environ before signalling (pid reuse)."""
    d = PurePosixPath(run_dir)
    inner = command_line(argv, cwd=cwd)
    q = shlex.quote
    env_path, rc_path, rc_tmp = q(str(d / "env")), q(str(d / "rc")), q(str(d / "rc.tmp"))
    # the status is renamed into place: a poll never reads a created but not yet written file
    script = (
        f"echo $$ > {q(str(d / 'pid'))}; . {env_path} && rm -f {env_path} || "
        f"{{ echo 126 > {rc_tmp} && mv -f {rc_tmp} {rc_path}; exit 126; }}; {inner}; "
        f"echo $? > {rc_tmp} && mv -f {rc_tmp} {rc_path}"
    )
    return (
        f"(umask 077 && set -C && cat > {env_path}) && "  # the rank keeps the login's umask
        f"setsid -f {'env ' + q(marker) + ' ' if marker else ''}sh -c {q(script)} < /dev/null > {q(str(d / 'log'))} 2>&1"
    )


@dataclasses.dataclass(frozen=True)
class SSHTarget:
    """Where and how to log in to one host."""

    name: str
    address: str
    port: int = 22
    user: str = "root"
    key_file: str | None = None
    known_hosts: str | None = None  # default: ~/.ssh/known_hosts
    connect_timeout_s: float = 10.0

    @property
    def where(self) -> str:
        return f"{self.user}@{self.address}:{self.port}"


class _AcceptAndRecord(paramiko.MissingHostKeyPolicy):
    """Opt-in trust on first use: record the unknown key in known_hosts, then go on."""

    def __init__(self, path: Path):
        self.path = path

    def missing_host_key(self, client, hostname, key):
        client.get_host_keys().add(hostname, key.get_name(), key)
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        with open(self.path, "a") as fh:
            fh.write(f"{hostname} {key.get_name()} {key.get_base64()}\n")


class _Refuse(paramiko.MissingHostKeyPolicy):
    def __init__(self, target: SSHTarget, path: Path):
        self.target, self.path = target, path

    def missing_host_key(self, client, hostname, key):
        raise ClusterError(
            f"host {self.target.name} ({self.target.address}:{self.target.port}): its SSH host key "
            f"({key.get_name()} {key.get_fingerprint().hex()[:16]}...) is not in {self.path}; check it and add it "
            f"(ssh-keyscan -p {self.target.port} {self.target.address} >> {self.path}), or pass "
            "--accept-new-host-keys to trust it on first use"
        )


class SSHConnection:
    """One paramiko connection to a host, opened on first use; thread-safe for concurrent commands."""

    def __init__(self, target: SSHTarget, *, accept_new_host_keys: bool = False):
        self.target = target
        self.accept_new_host_keys = accept_new_host_keys
        self._client: paramiko.SSHClient | None = None
        self._lock = threading.Lock()

    @property
    def known_hosts_path(self) -> Path:
        return Path(self.target.known_hosts or "~/.ssh/known_hosts").expanduser()

    def connect(self) -> paramiko.SSHClient:
        with self._lock:
            if self._client is not None and self._client.get_transport() and self._client.get_transport().is_active():
                return self._client
            self._client = self._open()
            return self._client

    def _open(self) -> paramiko.SSHClient:
        t = self.target
        client = paramiko.SSHClient()
        path = self.known_hosts_path
        if path.exists():
            try:
                client.load_host_keys(str(path))
            except (OSError, paramiko.SSHException) as e:
                raise ClusterError(f"cannot read known_hosts {path}: {e}") from None
        client.set_missing_host_key_policy(_AcceptAndRecord(path) if self.accept_new_host_keys else _Refuse(t, path))
        if t.key_file and not Path(t.key_file).expanduser().is_file():
            raise InputError(f"host {t.name}: SSH key {t.key_file} (ansible_ssh_private_key_file) does not exist")
        try:
            client.connect(
                t.address,
                port=t.port,
                username=t.user,
                key_filename=str(Path(t.key_file).expanduser()) if t.key_file else None,
                timeout=t.connect_timeout_s,
                banner_timeout=t.connect_timeout_s,
                auth_timeout=t.connect_timeout_s,
                allow_agent=t.key_file is None,
                look_for_keys=t.key_file is None,
            )
        except ClusterError:
            client.close()
            raise
        except paramiko.BadHostKeyException as e:
            client.close()
            raise ClusterError(
                f"host {t.name} ({t.address}:{t.port}): host key CHANGED (got {e.key.get_name()}, known_hosts "
                f"{path} has another); possible man-in-the-middle. Refusing; fix known_hosts if the host was "
                "reinstalled"
            ) from None
        except paramiko.AuthenticationException:
            client.close()
            raise ClusterError(
                f"host {t.name}: authentication failed for {t.where} with key {t.key_file or '(default keys)'}; "
                "check ansible_user and ansible_ssh_private_key_file"
            ) from None
        except (OSError, paramiko.SSHException, EOFError) as e:
            client.close()
            reason = getattr(e, "strerror", None) or str(e) or type(e).__name__
            raise ClusterError(f"host {t.name}: cannot reach {t.where}: {reason}") from None
        return client

    def close(self) -> None:
        with self._lock:
            if self._client is not None:
                self._client.close()
                self._client = None

    def run_line(
        self, line: str, *, timeout_s: float = 60.0, stdin: bytes | None = None
    ) -> subprocess.CompletedProcess:
        """Run a shell command line; returns exit code and text output. Raises subprocess.TimeoutExpired."""
        client = self.connect()
        try:
            chan = client.get_transport().open_session(timeout=self.target.connect_timeout_s)
            chan.exec_command(line)
        except (paramiko.SSHException, OSError, EOFError) as e:
            self.close()
            raise ClusterError(f"host {self.target.name}: running a command over SSH failed: {e}") from None
        if stdin:
            chan.sendall(stdin)
        chan.shutdown_write()
        out, err = bytearray(), bytearray()
        deadline = time.monotonic() + timeout_s
        while True:
            while chan.recv_ready():
                out += chan.recv(65536)
            while chan.recv_stderr_ready():
                err += chan.recv_stderr(65536)
            if chan.exit_status_ready() and not chan.recv_ready() and not chan.recv_stderr_ready():
                break
            left = deadline - time.monotonic()
            if left <= 0:
                chan.close()
                raise subprocess.TimeoutExpired(line, timeout_s, bytes(out), bytes(err))
            select.select([chan], [], [], min(left, 0.5))
        rc = chan.recv_exit_status()
        chan.close()
        return subprocess.CompletedProcess(line, rc, out.decode(errors="replace"), err.decode(errors="replace"))

    def run(
        self,
        argv: list[str],
        *,
        env: dict[str, str] | None = None,
        cwd: str | None = None,
        timeout_s: float = 60.0,
    ) -> subprocess.CompletedProcess:
        """Run argv literally on the host (see `command_line`)."""
        res = self.run_line(command_line(argv, env=env, cwd=cwd), timeout_s=timeout_s)
        res.args = list(argv)
        return res

    # ------------------------------------------------------------------------------------------------------ SFTP
    def get_file(self, remote: str, local: Path) -> None:
        sftp = self.connect().open_sftp()
        try:
            local.parent.mkdir(parents=True, exist_ok=True)
            sftp.get(remote, str(local))
        finally:
            sftp.close()

    def put_file(self, local: Path, remote: str) -> None:
        sftp = self.connect().open_sftp()
        try:
            sftp.put(str(local), remote)
        finally:
            sftp.close()

    def get_tree(self, remote_dir: str, local_dir: Path) -> int:
        """Copy a remote directory recursively; returns the number of files copied."""
        sftp = self.connect().open_sftp()
        count = 0
        try:
            try:
                sftp.stat(remote_dir)
            except OSError:
                raise ClusterError(f"host {self.target.name}: no directory {remote_dir} to fetch") from None
            todo = [(remote_dir, local_dir)]
            while todo:
                rdir, ldir = todo.pop()
                ldir.mkdir(parents=True, exist_ok=True)
                for entry in sftp.listdir_attr(rdir):
                    rpath = f"{rdir.rstrip('/')}/{entry.filename}"
                    if stat.S_ISDIR(entry.st_mode):
                        todo.append((rpath, ldir / entry.filename))
                    elif stat.S_ISREG(entry.st_mode):
                        sftp.get(rpath, str(ldir / entry.filename))
                        count += 1
        finally:
            sftp.close()
        return count
