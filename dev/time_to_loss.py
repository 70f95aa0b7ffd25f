"""
Time to a loss: run train.py with the given arguments and report when its evaluations first reach a val loss
at or below --target (seconds since launch, by train.py's own clock), and its best val loss. The small
recipes' goal (docs/benchmarks.md): config/train_shakespeare_char.py to val <= 1.47.

    python dev/time_to_loss.py --target=1.47 --out=bench-out/char -- config/train_shakespeare_char.py --seed=1

Each run gets its own empty Triton, inductor and CUDA-driver caches (cold) unless --warm; the log (every line
with its arrival time) and a JSON summary go to --out, the summary with where the time went (speedrun.breakdown:
the first step's start, the median step, each evaluation and each save).
"""
import argparse
import json
import os
import sys

import speedrun


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target", type=float, required=True, help="the val loss to reach")
    p.add_argument("--out", default="bench-out/time-to-loss", help="folder for the log and the summary")
    p.add_argument("--warm", action="store_true", help="keep this machine's compile caches (default: cold)")
    p.add_argument("args", nargs="+", help="train.py's arguments (after --)")
    a = p.parse_args()
    os.makedirs(a.out, exist_ok=True)
    name = "run"
    env = {} if a.warm else speedrun.fresh_caches(a.out, name)
    lines = speedrun.run_timestamped([sys.executable, "train.py", *a.args], speedrun.ROOT,
                                     os.path.join(a.out, f"{name}.jsonl"), env=env)
    evals = speedrun.parse_evals(lines)
    reached = next((e for e in evals if e["val"] <= a.target), None)
    best = min(evals, key=lambda e: e["val"]) if evals else None
    summary = dict(args=a.args, target=a.target, cold=not a.warm, reached=reached, best=best, end=lines[-1][0],
                   **speedrun.breakdown(lines))
    with open(os.path.join(a.out, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1)
    print(f"time to val <= {a.target}: " + (f"{reached['since_launch']:.1f} s (step {reached['step']}, "
          f"{reached['val']:.4f})" if reached else "not reached") +
          (f"; best {best['val']:.4f} at step {best['step']}, {best['since_launch']:.1f} s" if best else ""))
    print(f"first step at {summary['first_step']} s, median step {summary['step_ms']} ms, evaluations "
          f"{summary['evals']} s, saves {summary['saves']} s, steps after saves {summary['after_save_ms']} ms")


if __name__ == "__main__":
    main()
