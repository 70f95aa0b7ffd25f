#!/usr/bin/env python3
"""
Where a run's start-up goes (issue 23: launch to the first training step): runs train.py with the given
arguments, timestamps every line of its output from launch, and prints the first time each stage shows up,
then the import time of the heaviest modules (python -X importtime).

    python scripts/startup.py config/speedrun_gcide.py --max_iters=3 --out_dir=/tmp/startup
"""
import os
import re
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from scripts.speedrun import run_timestamped  # noqa: E402

STAGES = [("config parsed", r"^config "), ("data found", r"^data: "), ("model building", r"^(Initializing|Resuming)"),
          ("step 0 evaluated", r"^step 0:"), ("first step done", r"^iter 0:"), ("second step done", r"^iter 1:")]


def main(args):
    with tempfile.TemporaryDirectory() as tmp:
        lines = run_timestamped([sys.executable, "-X", "importtime", "train.py", *args], ROOT,
                                os.path.join(tmp, "lines.jsonl"), echo=False)
    for t, line in lines:
        if not line.startswith("import time:"):
            print(f"[{t:6.2f}s] {line}")
    print("\nstage                  seconds since launch")
    for name, pattern in STAGES:
        t = next((t for t, line in lines if re.search(pattern, line)), None)
        print(f"{name:22s} {'-' if t is None else f'{t:6.2f}'}")
    # python -X importtime writes to stderr, which run_timestamped merged: cumulative microseconds per module
    imports = []
    for _, line in lines:
        m = re.match(r"import time:\s+\d+ \|\s+(\d+) \|( *)(\S+)", line)
        if m and len(m.group(2)) <= 2:  # top-level imports (and their first level)
            imports.append((int(m.group(1)) / 1e6, m.group(3)))
    print("\nheaviest top-level imports (s, cumulative)")
    for seconds, name in sorted(imports, reverse=True)[:15]:
        print(f"{seconds:7.3f}  {name}")


if __name__ == "__main__":
    main(sys.argv[1:])
