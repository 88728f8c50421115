"""`testbed profile --colocated N`: the profile is measured while N - 1 companion processes train the same model
beside it (the ranks that share the machine in a trial), and every companion is gone when it returns."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from labhosts import wait_for


def _companions(batch_size: int) -> list[int]:
    """PIDs of companion processes of a profile at this (test-unique) batch size."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"--companion" in argv and b"runners.profile" in argv and str(batch_size).encode() in argv:
            found.append(int(entry.name))
    return found


def test_colocated_profile_runs_companions_and_ends_them(testbed_cli, tmp_path):
    out = tmp_path / "profiles"
    done = testbed_cli("profile", "--model", "mlp", "--batch-size", "7", "--threads", "1", "--colocated", "3",
                       "--iters", "2", "--compressors", "syncsgd,fp16", "--out", str(out), "--json", timeout_s=300)  # fmt: skip
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert data["colocated_ranks"] == 3 and data["forward_s"] > 0
    assert data["compressors"]["fp16"]["buckets"][0]["encode_s"] > 0  # codecs timed alone, then scaled
    stored = json.loads((out / "mlp-bs7-cpu-colocated3.json").read_text())
    assert stored["colocated_ranks"] == 3
    assert _companions(7) == [], "a companion process outlived the profile"


def test_companion_exits_with_its_parent(tmp_path):
    """A companion whose parent is gone stops on its own (nothing left training if the profile is killed)."""
    # the parent starts a companion, waits for 'ready', prints its pid and exits without ending it
    code = (
        "import subprocess,sys\n"
        "p=subprocess.Popen([sys.executable,'-m','runners.profile','--companion','--model','mlp','--batch-size','9',"
        "'--threads','1'],stdout=subprocess.PIPE,text=True,start_new_session=True)\n"
        "assert p.stdout.readline().strip()=='ready'\n"
        "print(p.pid,flush=True)\n"
    )
    repo = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=repo, timeout=120)
    assert done.returncode == 0, done.stderr
    pid = int(done.stdout.strip())
    try:  # the orphan notices after its current step that its parent is gone
        wait_for(lambda: not _alive(pid), 60.0, "the orphaned companion to stop training")
    finally:
        if _alive(pid):
            os.kill(pid, 9)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_companion_load_check_refuses_idle_companions():
    """A co-located profile whose companions did not compute (stopped, starved, gone) is refused, not stored as one."""
    from testbed.errors import TestbedError
    from testbed.modelling import CompanionLoad, check_companion_load

    check_companion_load(CompanionLoad(wall_s=4.0, cpu_s=[1.9, 2.1, 1.8]), share_cores=0.5)  # fair: ~2 s each
    try:
        check_companion_load(CompanionLoad(wall_s=4.0, cpu_s=[1.9, 0.1, 1.8]), share_cores=0.5)
    except TestbedError as exc:
        assert "0.03" in str(exc) and "not stored" in str(exc)
    else:
        raise AssertionError("an idle companion went unnoticed")
    check_companion_load(CompanionLoad(wall_s=0.2, cpu_s=[0.0]), share_cores=0.5)  # too short to tell: not checked


def test_process_cpu_s_counts_a_busy_child(tmp_path):
    """CPU seconds read from /proc grow while a process computes and are 0.0 once it is gone."""
    from testbed.modelling import process_cpu_s

    proc = subprocess.Popen([sys.executable, "-c", "import time\nt=time.process_time()\nwhile time.process_time()-t<0.5: pass\nprint('done',flush=True)\ninput()"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert proc.stdout.readline().strip() == "done"
        assert process_cpu_s(proc.pid) >= 0.45
    finally:
        proc.kill()
        proc.wait()
    assert process_cpu_s(proc.pid) == 0.0
