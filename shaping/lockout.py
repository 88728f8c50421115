"""Lockout protection: which interfaces carry the management connection, so shaping them could cut the controller
off. `python -m shaping apply` refuses those unless --force-mgmt-iface.
"""

from __future__ import annotations

import ipaddress
import os

from shaping.errors import InputError


def ssh_client_addresses(environ: dict[str, str] | None = None) -> list[str]:
    """Client addresses of the SSH session this process runs in (SSH_CONNECTION / SSH_CLIENT)."""
    env = os.environ if environ is None else environ
    out = []
    for var in ("SSH_CONNECTION", "SSH_CLIENT"):
        parts = env.get(var, "").split()
        if parts:
            addr = parts[0].split("%")[0]
            try:
                ip = ipaddress.ip_address(addr)
            except ValueError:
                continue
            if getattr(ip, "ipv4_mapped", None):
                ip = ip.ipv4_mapped
            if str(ip) not in out:
                out.append(str(ip))
    return out


def _sshd_peer_addresses() -> list[str]:
    """Remote addresses of established TCP connections to a port an sshd listens on (any user's SSH session)."""
    try:
        import psutil

        conns = psutil.net_connections(kind="tcp")
    except Exception:  # noqa: BLE001 - best effort: SSH_CONNECTION is the primary source
        return []
    ports = {22}
    for c in conns:
        if c.status == "LISTEN" and c.pid:
            try:
                if psutil.Process(c.pid).name().startswith("sshd"):
                    ports.add(c.laddr.port)
            except Exception:  # noqa: BLE001
                continue
    return sorted({c.raddr.ip for c in conns if c.status == "ESTABLISHED" and c.raddr and c.laddr.port in ports})


def management_interfaces(extra_addresses: list[str] = (), netns: str | None = None) -> dict[str, str]:
    """Interfaces whose shaping could cut off the controller: {ifname: why}. Routes each SSH client address (and
    `extra_addresses`) to its output device, then adds that device's lower devices (VLAN parent, bridge/bond ports)."""
    from shaping.netns_route import open_route

    addresses = [(a, "SSH session from") for a in ssh_client_addresses()]
    addresses += [(a, "SSH session from") for a in _sshd_peer_addresses() if a not in ssh_client_addresses()]
    addresses += [(a, "--mgmt-addr") for a in extra_addresses]
    out: dict[str, str] = {}
    with open_route(netns) as ipr:
        names = {link["index"]: link.get_attr("IFLA_IFNAME") for link in ipr.get_links()}
        links = {link["index"]: link for link in ipr.get_links()}
        for addr, why in addresses:
            try:
                ip = ipaddress.ip_address(addr)
                route = ipr.route("get", dst=str(ip), family=10 if ip.version == 6 else 2)[0]
            except Exception:  # noqa: BLE001 - unroutable: it cannot be carried by any interface here
                continue
            oif = route.get_attr("RTA_OIF")
            todo = [oif]
            while todo:
                index = todo.pop()
                if index not in names or names[index] in out:
                    continue
                out[names[index]] = f"{why} {addr}" if index == oif else f"lower device of {names[oif]} ({why} {addr})"
                lower = links[index].get_attr("IFLA_LINK")
                if lower and lower != index:
                    todo.append(lower)
                todo += [i for i, link in links.items() if link.get_attr("IFLA_MASTER") == index]
    return out


def check_mgmt_addresses(addresses: list[str]) -> list[str]:
    """The --mgmt-addr values as IP addresses; InputError for anything else (a protection that silently guards
    nothing is worse than none)."""
    out = []
    for a in addresses:
        try:
            out.append(str(ipaddress.ip_address(str(a).strip())))
        except ValueError:
            raise InputError(f"--mgmt-addr {a!r}: not an IP address; expected e.g. 192.0.2.10 or 2001:db8::10") from None
    return out


def check_lockout(
    dev: str, *, netns: str | None = None, force_mgmt_iface: bool = False, mgmt_addresses: list[str] = ()
) -> None:
    """InputError when shaping `dev` could cut off the controller (it carries an SSH session or routes to one of
    `mgmt_addresses`), unless `force_mgmt_iface`."""
    if force_mgmt_iface or netns:
        return  # --netns: an emulated host's interface never carries this machine's SSH session
    mgmt = management_interfaces(mgmt_addresses)
    if dev in mgmt:
        raise InputError(
            f"refusing to shape {dev}: it carries the management connection ({mgmt[dev]}); shaping it can lock the "
            "controller out. Shape the data interface instead, or pass --force-mgmt-iface if you mean it"
        )
