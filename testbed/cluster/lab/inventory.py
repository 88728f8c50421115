"""The lab inventory: the hosts of a lab cluster, read from a YAML Ansible inventory into `LabHostSpec`s.

Inventory (YAML, Ansible layout; see ansible/inventory.example.yml). Per host, after merging group vars:
  ansible_ssh_common_args "-o UserKnownHostsFile=F"  or testbed_known_hosts: the known_hosts to verify against
  testbed_data_iface (required)   the NIC that carries training traffic and gets shaped
  testbed_data_address            its IPv4 address (default: read from the interface)
  testbed_gpus_per_host           GPUs each host must show (nvidia-smi), unless allow_cpu
  testbed_python                  Python on the host with the project importable (default /opt/testbed/venv/bin/python)
  testbed_project_dir             the project's source on the host (default /opt/testbed/src)
  testbed_run_dir                 where each started process and each trial attempt gets a fresh private directory
                                  (mode 0700, checked with lstat) on the host (default /tmp; it must belong to root or
                                  the login user and be writable by nobody else unless sticky)
  testbed_shaping_offload         HTB hardware offload: off (default), auto or on (see docs/lab-guide.md, High rates)
  testbed_shaping_ingress         also shape what arrives, via an ifb (default true; false with offload: egress only)
  ansible_become                  true: shaping commands run as `sudo -n testbed_shaping_helper ...` (no root SSH);
                                  the provision playbook installs the helper and a sudoers rule for it
  testbed_shaping_helper          the root-owned shaping wrapper sudo may run (default /usr/local/sbin/testbed-shaping)
  testbed_shaping_peers           CIDRs whose traffic is shaped (default: the other hosts' data addresses; `all`:
                                  every packet on the data NIC); the rest of the NIC's traffic passes unshaped
Values are used literally (never through a shell: every remote command is an argv quoted word by word); Jinja
templates are not evaluated here and are refused in the values this backend reads.
"""

from __future__ import annotations

import dataclasses
import re
import shlex
from pathlib import Path
from typing import Any

from testbed.cluster.ssh import SSHTarget
from testbed.errors import InputError

DEFAULT_PYTHON = "/opt/testbed/venv/bin/python"
DEFAULT_PROJECT_DIR = "/opt/testbed/src"
DEFAULT_RUN_DIR = "/tmp"  # parent of the private per-process and per-attempt directories
DEFAULT_SHAPING_HELPER = "/usr/local/sbin/testbed-shaping"  # installed by the testbed_host role (sudoers rule)


@dataclasses.dataclass(frozen=True)
class LabHostSpec:
    name: str
    ssh: SSHTarget
    data_iface: str
    data_address: str | None
    gpus: int
    python: str
    project_dir: str
    run_dir: str
    shaping_peers: tuple[str, ...] | None = None  # testbed_shaping_peers; None: the other hosts' data addresses
    shaping_offload: str = "off"  # testbed_shaping_offload: off | auto | on
    shaping_ingress: bool = True  # testbed_shaping_ingress
    become: bool = False  # ansible_become: shaping through `sudo -n` and the helper, not as the login user
    shaping_helper: str = DEFAULT_SHAPING_HELPER  # testbed_shaping_helper


def _literal(host: str, key: str, value: Any) -> str:
    text = str(value)
    if "{{" in text or "{%" in text:
        raise InputError(
            f"inventory host {host}: {key} is a Jinja template ({text!r}); the lab backend reads values "
            "literally, give a plain value"
        )
    return text


def _known_hosts_from_args(args: str) -> str | None:
    words = shlex.split(args or "")
    for i, w in enumerate(words):
        opt = None
        if w == "-o" and i + 1 < len(words):
            opt = words[i + 1]
        elif w.startswith("-o") and len(w) > 2:
            opt = w[2:]
        if opt and re.match(r"(?i)^userknownhostsfile[ =]", opt):
            return re.split(r"[ =]", opt, maxsplit=1)[1].strip().split()[0]
    return None


def _walk(group: dict | None, inherited: dict, out: dict[str, dict]) -> None:
    group = group or {}
    if not isinstance(group, dict):
        raise InputError(f"inventory: expected a mapping of hosts/vars/children, got {type(group).__name__}")
    merged = {**inherited, **(group.get("vars") or {})}
    for name, hvars in (group.get("hosts") or {}).items():
        out[str(name)] = {**out.get(str(name), {}), **merged, **(hvars or {})}
    for child in (group.get("children") or {}).values():
        _walk(child, merged, out)


def load_inventory(path: str | Path) -> list[LabHostSpec]:
    """Read a YAML Ansible inventory into host specs. InputError on anything missing or malformed."""
    import yaml

    p = Path(path)
    try:
        data = yaml.safe_load(p.read_text())
    except FileNotFoundError:
        raise InputError(f"--inventory {path}: no such file") from None
    except yaml.YAMLError as e:
        raise InputError(
            f"--inventory {path}: not valid YAML ({str(e).splitlines()[0]}); the lab backend reads YAML inventories "
            f"(convert an INI one: ansible-inventory -i {path} -y --list > inventory.yml)"
        ) from None
    if not isinstance(data, dict) or not data:
        raise InputError(f"--inventory {path}: expected a YAML Ansible inventory (all: hosts: ...)")
    raw: dict[str, dict] = {}
    for group in data.values():
        _walk(group, {}, raw)
    if not raw:
        raise InputError(f"--inventory {path}: lists no hosts")
    specs = []
    for name, v in raw.items():
        if "testbed_data_iface" not in v:
            raise InputError(f"inventory host {name}: testbed_data_iface is missing (the NIC to shape, e.g. ens1f0)")
        kh = v.get("testbed_known_hosts") or _known_hosts_from_args(str(v.get("ansible_ssh_common_args", "")))
        key = v.get("ansible_ssh_private_key_file") or v.get("ansible_private_key_file")
        try:
            port = int(v.get("ansible_port", v.get("ansible_ssh_port", 22)))
            gpus = int(v.get("testbed_gpus_per_host", 0))
        except (TypeError, ValueError):
            raise InputError(
                f"inventory host {name}: ansible_port and testbed_gpus_per_host must be integers"
            ) from None
        if gpus < 0 or not 0 < port < 65536:
            raise InputError(f"inventory host {name}: port {port} or testbed_gpus_per_host {gpus} out of range")
        specs.append(
            LabHostSpec(
                name=name,
                ssh=SSHTarget(
                    name=name,
                    address=_literal(name, "ansible_host", v.get("ansible_host", name)),
                    port=port,
                    user=_literal(name, "ansible_user", v.get("ansible_user", "root")),
                    key_file=_literal(name, "ansible_ssh_private_key_file", key) if key else None,
                    known_hosts=_literal(name, "known_hosts", kh) if kh else None,
                ),
                data_iface=_literal(name, "testbed_data_iface", v["testbed_data_iface"]),
                data_address=_literal(name, "testbed_data_address", v["testbed_data_address"])
                if v.get("testbed_data_address")
                else None,
                gpus=gpus,
                python=_literal(name, "testbed_python", v.get("testbed_python", DEFAULT_PYTHON)),
                project_dir=_literal(name, "testbed_project_dir", v.get("testbed_project_dir", DEFAULT_PROJECT_DIR)),
                run_dir=_literal(name, "testbed_run_dir", v.get("testbed_run_dir", DEFAULT_RUN_DIR)),
                shaping_peers=inventory_peers(name, v.get("testbed_shaping_peers")),
                shaping_offload=_offload_mode(name, v.get("testbed_shaping_offload", "off")),
                shaping_ingress=_flag(name, "testbed_shaping_ingress", v.get("testbed_shaping_ingress", True)),
                become=_flag(name, "ansible_become", v.get("ansible_become", False)),
                shaping_helper=_literal(
                    name, "testbed_shaping_helper", v.get("testbed_shaping_helper", DEFAULT_SHAPING_HELPER)
                ),
            )
        )
    return specs


def _offload_mode(host: str, value: Any) -> str:
    from shaping.highrate import OFFLOAD_MODES

    mode = "off" if value is False else "on" if value is True else str(value).strip().lower()
    if mode not in OFFLOAD_MODES:
        raise InputError(f"inventory host {host}: testbed_shaping_offload {value!r}; expected off, auto or on")
    return mode


def _flag(host: str, key: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if str(value).strip().lower() in ("true", "yes", "on", "1", "false", "no", "off", "0"):
        return str(value).strip().lower() in ("true", "yes", "on", "1")
    raise InputError(f"inventory host {host}: {key} {value!r}; expected true or false")


def inventory_peers(host: str, value: Any) -> tuple[str, ...] | None:
    """`testbed_shaping_peers` of a host: None when unset (default peers), () for `all` (shape every packet), else
    normalised CIDRs (a list or a comma-separated string)."""
    from shaping.classify import parse_peers

    if value is None:
        return None
    if isinstance(value, str) and value.strip().lower() == "all":
        return ()
    if not isinstance(value, str | list):
        raise InputError(f"inventory host {host}: testbed_shaping_peers must be a list of CIDRs, a string or all")
    return parse_peers(value, f"inventory host {host}: testbed_shaping_peers")
