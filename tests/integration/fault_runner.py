"""A stand-in rank program for the launcher's failure tests (run as `python -m tests.integration.fault_runner`).

It takes the real runner's command line (and ignores it) and misbehaves as $TESTBED_FAULT says:
  crash:R   rank R prints a marker line and exits 3; the other ranks block as if waiting in a collective
  hang      every rank blocks forever (the trial timeout must end it)
  ok        every rank writes a minimal summary.json (rank 0) and exits 0
  dumpenv   like ok, and every rank first writes its whole environment to env-rank{R}.json in the output directory
  tcshow    like ok, and every rank first writes `tc class show dev eth0` (its host's link as the trial ran) to
            tc-rank{R}.txt in the output directory
  gate:P    every rank prints its marker line, waits until file P exists (the test opens the gate), then acts as ok
Blocking is a wait on an Event nobody sets: that is the fault under test, not synchronisation.
"""

import json
import os
import sys
import threading
from pathlib import Path

from runners.contract import SUMMARY_METRICS  # the summary keys the launcher reads

fault = os.environ.get("TESTBED_FAULT", "ok")
rank = int(os.environ["RANK"])
out = Path(sys.argv[sys.argv.index("--out") + 1])
print(f"fault runner rank {rank} pid {os.getpid()} fault {fault}", flush=True)
if fault.startswith("crash:") and rank == int(fault.split(":")[1]):
    print(f"FAULT-MARKER rank {rank} crashing on purpose", flush=True)
    sys.exit(3)
if fault == "dumpenv":
    out.mkdir(parents=True, exist_ok=True)
    (out / f"env-rank{rank}.json").write_text(json.dumps(dict(os.environ)))
if fault == "tcshow":
    import subprocess

    shown = subprocess.run(["tc", "class", "show", "dev", "eth0"], capture_output=True, text=True, check=True)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"tc-rank{rank}.txt").write_text(shown.stdout)
if fault.startswith("gate:"):
    import time

    gate = Path(fault.split(":", 1)[1])
    while not gate.exists():  # a rank waiting for its input: the test opens the gate when it has done its part
        time.sleep(0.05)
if fault.startswith("crash:") or fault == "hang":
    threading.Event().wait()
if rank == 0:
    (out / "summary.json").write_text(json.dumps({m: 1.0 for m in SUMMARY_METRICS} | {"env": {"backend": "gloo"}}))
