"""bench/first_model_faults.py: page faults a step in the first model a process trains and in a later one (why the
co-located profile measures each compressor in processes of its own). Counts, not times: nothing here is timed."""

import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
SCRIPT = str(REPO / "bench" / "first_model_faults.py")


def test_it_counts_each_model_of_one_process_apart():
    done = subprocess.run([sys.executable, SCRIPT, "--model", "mlp", "--batch-size", "4", "--compressors", "fp16",
                           "--models", "2", "--steps", "3", "--skip", "1"],
                          capture_output=True, text=True, cwd=REPO, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "| compressor | model 1 | model 2 |" in done.stdout
    assert re.search(r"^\| fp16 \| \d+ \| \d+ \| at most \d+ \|$", done.stdout, re.M), done.stdout


def test_bad_input_is_one_line_and_exit_2():
    done = subprocess.run([sys.executable, SCRIPT, "--models", "1"], capture_output=True, text=True, cwd=REPO,
                          timeout=60)  # fmt: skip
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.count("\n") == 1 and "--models must be >= 2" in done.stderr
