"""Shaping lab hosts: each host's data NIC shaped by the host tool (`python -m shaping`, or with `ansible_become` the
root-owned helper through `sudo -n`), commit-confirmed across every host: applied host by host with a dead-man timer,
then confirmed over fresh connections; any failure rolls every host back. The interface carrying the SSH session is
refused by the host tool unless forced.

`LabShaping` is the shaping half of `LabCluster` (and so of `SlurmCluster`, which runs the same argv in job steps);
it uses the cluster's primitives: `specs`, `run`, `hosts`, `_spec`, `_each`, `_fresh_conn`, `transport`, `record`."""

from __future__ import annotations

import json
import subprocess
from typing import Any

from shaping.plan import LinkShape
from testbed.cluster import registry
from testbed.cluster.base import Host
from testbed.cluster.lab.inventory import LabHostSpec
from testbed.errors import InputError, ShapingError, TestbedError

DEFAULT_CONFIRM_WITHIN_S = 60.0


class LabShaping:
    """Shaping through the host tool on every host of a lab cluster (see the module docstring)."""

    name: str
    specs: dict[str, LabHostSpec]
    record: dict[str, Any] | None
    transport: str

    def shaping_peers(self, host: Host | str) -> tuple[str, ...]:
        """What this host's shaping classifies as the cluster's data traffic: `testbed_shaping_peers` when the
        inventory sets it, else the other hosts' data addresses (storage, the scheduler, other tenants on the same
        NIC pass unshaped)."""
        from shaping.classify import parse_peers

        spec = self._spec(host)
        if spec.shaping_peers is not None:
            return spec.shaping_peers
        others = [h.address for h in self.hosts() if h.name != spec.name]
        return parse_peers(others) if others else ()

    def _peer_flags(self, name: str) -> list[str]:
        """The per-host flags of `python -m shaping apply`: the classifier and, when the inventory asks, offload."""
        peers = self.shaping_peers(name)
        spec = self._spec(name)
        offload = ["--offload", spec.shaping_offload] if spec.shaping_offload != "off" else []
        return (["--peers", ",".join(peers)] if peers else []) + offload

    def _shaping_argv(self, spec: LabHostSpec, *args: str) -> list[str]:
        """`python -m shaping ARGS` as the login user (root), or with `ansible_become` the root-owned helper through
        `sudo -n` (never a password prompt: a missing sudoers rule fails at once, naming sudo)."""
        if spec.become:
            return ["sudo", "-n", spec.shaping_helper, *args]
        return [spec.python, "-m", "shaping", *args]

    def _names(self, hosts: list[Host] | list[str] | None) -> list[str]:
        if hosts is None:
            return list(self.specs)
        return [self._spec(h).name for h in hosts]

    def apply_shaping(
        self,
        shape: LinkShape,
        hosts: list[Host] | None = None,
        *,
        force: bool = False,
        force_mgmt_iface: bool = False,
        ingress: bool = True,
        confirm_within_s: float = DEFAULT_CONFIRM_WITHIN_S,
    ) -> list[dict]:
        """Shape each host's data NIC (egress, and ingress via ifb unless ingress=False), commit-confirmed: applied
        host by host with a dead-man timer, then confirmed over fresh SSH connections. Any failure rolls every host
        back to its previous shaping and raises. Returns the applied plan of each host."""
        names = self._names(hosts)
        args = [*shape.to_flags(), "--confirm-within", f"{confirm_within_s:g}", "--json"]
        args += ["--ingress"] * ingress + ["--force"] * force + ["--force-mgmt-iface"] * force_mgmt_iface
        applied: list[str] = []
        results = []
        try:
            for n in names:
                spec = self.specs[n]
                host_args = args if spec.shaping_ingress else [a for a in args if a != "--ingress"]
                argv = self._shaping_argv(spec, "apply", "--dev", spec.data_iface, *host_args, *self._peer_flags(n))
                res = self.run(n, argv, timeout_s=120)
                if res.returncode != 0:
                    msg = f"host {n}: {(res.stderr.strip().splitlines() or ['shaping failed'])[-1].removeprefix('error: ')}"
                    raise (InputError if res.returncode == 2 else ShapingError)(msg)
                applied.append(n)
                results.append({"host": n, **json.loads(res.stdout.strip().splitlines()[-1])})
            for n in names:  # a *new* connection proves the host is still reachable with the new shaping
                spec = self.specs[n]
                fresh = self._fresh_conn(n)
                try:
                    res = fresh.run(
                        self._shaping_argv(spec, "confirm", "--dev", spec.data_iface, "--json"),
                        cwd=spec.project_dir,
                        timeout_s=60,
                    )
                except (TestbedError, subprocess.TimeoutExpired) as e:
                    raise ShapingError(
                        f"host {n}: unreachable over a new {self.transport} connection after shaping ({e}); rolled back"
                    ) from None
                finally:
                    fresh.close()
                if res.returncode != 0:
                    raise ShapingError(f"host {n}: confirming shaping failed: {res.stderr.strip()}")
                applied.remove(n)
        except BaseException:
            for n in applied:  # still pending: restore now rather than wait for the timer
                spec = self.specs[n]
                try:
                    self.run(n, self._shaping_argv(spec, "rollback", "--dev", spec.data_iface), timeout_s=60)
                except (TestbedError, subprocess.TimeoutExpired):
                    pass  # the host's own timer restores it at the deadline
            raise
        if hosts is None:
            self._record_shape(shape.to_dict())
        return results

    def _record_shape(self, shape: dict[str, Any] | None) -> None:
        """Shaping put on (or cleared from) every host becomes the cluster's recorded shaping, as on the local
        backend: what `status` reports and each trial restores. Nothing is recorded while `up` builds the record."""
        if self.record is not None and registry.load_record(self.name) is not None:
            self.record["shape"] = shape
            registry.save_record(self.name, self.record)

    def clear_shaping(self, hosts: list[Host] | None = None) -> None:
        def clear(n: str) -> None:
            spec = self.specs[n]
            res = self.run(n, self._shaping_argv(spec, "clear", "--dev", spec.data_iface, "--json"), timeout_s=60)
            if res.returncode != 0:
                raise ShapingError(f"host {n}: clearing shaping failed: {res.stderr.strip()}")

        errors = [str(r) for r in self._each(clear, self._names(hosts)).values() if isinstance(r, TestbedError)]
        if errors:
            raise ShapingError("; ".join(errors))
        if hosts is None:
            self._record_shape(None)

    def shaping(self, host: Host | str) -> dict[str, Any]:
        spec = self._spec(host)
        res = self.run(spec.name, self._shaping_argv(spec, "show", "--dev", spec.data_iface, "--json"), timeout_s=60)
        if res.returncode != 0:
            raise ShapingError(f"host {spec.name}: reading shaping failed: {res.stderr.strip()}")
        return json.loads(res.stdout.strip().splitlines()[-1])
