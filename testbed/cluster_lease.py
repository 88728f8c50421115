"""A command's hold on a cluster: take its lease, and first finish what a killed command left in flight.

`run`, `sweep`, `calibrate`, `probe`, `shape`, `down` and `profile --on` work inside `hold(name)`: one command at a
time per cluster (registry.lease: wait up to --wait seconds, else refuse naming the holder's pid and command). A
command killed with SIGKILL cannot clean up after itself; its trial stays noted in the lease directory
(registry.record_trial). The next command that takes the lease finds that note, and before it starts:
  1. ends the noted processes (ranks, iperf3 servers) still running: each one only if it is still the same process
     (its start time, or its lab token, matches), so a reused pid is never signalled;
  2. puts back the shaping the links had before the trial;
  3. stores the trial's row with status "interrupted" (at the attempt number it had reserved);
  4. says so in one line on stderr.
Each step runs even when one before it failed (an unreachable host must not keep the row from being stored).
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator
from typing import Any

from testbed.cluster import backends, registry
from testbed.errors import TestbedError

Say = Callable[[str], None]


def say_stderr(line: str) -> None:
    sys.stderr.write(line + "\n")


@contextlib.contextmanager
def hold(name: str, *, wait_s: float = 0.0, force: bool = False, say: Say = say_stderr,
         restore_shaping: bool = True) -> Iterator[None]:  # fmt: skip
    """Hold cluster `name`'s lease for the block, after finishing a dead holder's trial (see the module's doc)."""
    with registry.lease(name, wait_s=wait_s, force=force):
        finish_dead_trial(name, say=say, restore_shaping=restore_shaping)
        yield


@contextlib.contextmanager
def links_cleared(cluster, what: str) -> Iterator[Callable[[Any], None]]:
    """For work measured on a cluster's links with nothing shaping them (`testbed profile --on NAME`); the caller
    holds the lease. Notes `what` as the cluster's work in flight, clears the shaping of every host and yields
    `remember(proc)`, which notes a process started (so that the next command ends it and restores the shaping after
    a SIGKILL of this one, as for a trial); on the way out, however left, puts the recorded shaping back and clears
    the note. A failure to restore is raised (after the note is cleared), naming the command that restores it."""
    hosts = cluster.hosts()
    configured = cluster.recorded_shape()
    note, remember = registry.note_work(cluster, hosts, configured, what=what)
    try:
        if configured is not None:
            cluster.clear_shaping(hosts)
        yield remember
    finally:
        try:
            if configured is not None:
                _restore(cluster, note)
        except Exception as e:  # noqa: BLE001 - said in one line; never hides the error that ended the work
            if sys.exc_info()[0] is None:
                raise TestbedError(f"cluster {cluster.name}: putting its shaping ({configured.describe()}) back after "
                                   f"the {what} failed ({e}); `testbed shape --name {cluster.name} --bw RATE` sets it "
                                   "again") from None  # fmt: skip
        finally:
            registry.clear_trial(cluster.name)


def finish_dead_trial(name: str, *, say: Say = say_stderr, restore_shaping: bool = True) -> dict[str, Any] | None:
    """Finish the trial a killed command left noted on cluster `name` (the caller holds the lease); returns the
    note, or None when there was none."""
    note = registry.trial_in_flight(name)
    if note is None or registry.holder_alive(note.get("writer")):
        return None  # nothing in flight, or its writer still runs (a bench calling run_trial without the lease)
    problems: list[str] = []
    ended = 0
    cluster = None
    try:
        cluster = backends.open_cluster(name) if registry.load_record(name) is not None else None
    except TestbedError as e:
        problems.append(f"cluster not readable ({e})")
    if cluster is not None:
        for handle in note.get("processes", []):
            try:
                ended += bool(cluster.end_leftover(handle))
            except Exception as e:  # noqa: BLE001 - one unreachable host must not keep the others' kills or the row
                problems.append(f"{handle.get('host')}: {e}")
        if restore_shaping:
            try:
                _restore(cluster, note)
            except Exception as e:  # noqa: BLE001 - the row is stored whatever happens here
                problems.append(f"restoring shaping: {e}")
    stored = _store_row(note, problems) if note.get("row") else None  # a calibration has no row
    registry.clear_trial(name)
    killed_by = note.get("holder") or {}
    what = f"the trial {note['row']['trial_id']}" if note.get("row") else f"the {note.get('what', 'work')}"
    say(
        f"cluster {name}: {what} of pid {killed_by.get('pid')} (`{killed_by.get('command')}`)"
        f" was killed; ended {ended} leftover process{'es' if ended != 1 else ''}"
        + (", restored its shaping" if restore_shaping and cluster is not None else "")
        + (f", stored its row as interrupted in {stored}" if stored else "")
        + (f"; problems: {'; '.join(problems)}" if problems else "")
    )
    return note


def _restore(cluster, note: dict[str, Any]) -> None:
    from shaping.plan import LinkShape

    hosts = [h for h in cluster.hosts() if h.name in set(note.get("hosts") or [])] or None
    before = note.get("shape_before")
    if before:
        cluster.apply_shaping(LinkShape.from_dict(before), hosts)
    else:
        cluster.clear_shaping(hosts)


def _store_row(note: dict[str, Any], problems: list[str]) -> str | None:
    from testbed.results import ResultsStore  # pandas/pyarrow only when there is a row to store

    row = dict(note["row"])
    killed_by = note.get("holder") or {}
    row["status"] = "interrupted"
    row["error"] = (
        f"the controller (pid {killed_by.get('pid')}) was killed during the trial; its leftovers were ended by the "
        "next command on the cluster; rerunning the same command measures it again"
    )
    try:
        store = ResultsStore(note["out"])
        store.append(row, attempt=note.get("attempt"))
    except (OSError, TestbedError) as e:
        problems.append(f"row not stored in {note['out']} ({e})")
        return None
    return str(store.root)
