#!/usr/bin/env bash
# Tuning runs for config/speedrun_gcide.py (docs/speedrun.md): each argument is one run of the recipe with
# those extra settings, its last checkpoint scored over the whole of data/gcide/val.bin; prints, per run, the
# seconds from launch to the end of training, the step time and the full val loss. No nanoGPT run: compare
# against its score from scripts/speedrun.py (the comparison itself).
#   $ bash scripts/speedrun_sweep.sh "--max_iters=120" "--max_iters=150 --compile=True"   (logs under $OUT)
# SCORE=0 skips the scoring (for timing variants only).
set -uo pipefail
out=${OUT:-bench-out}; mkdir -p "$out"
export PYTHONUNBUFFERED=1
i=0
for extra in "$@"; do
    i=$((i + 1)); dir="o-sweep-$i"; rm -rf "$dir"
    n=$(echo "$extra" | sed -n 's/.*--max_iters=\([0-9]*\).*/\1/p'); n=${n:-260}
    start=$(date +%s.%N)
    # shellcheck disable=SC2086
    python train.py config/speedrun_gcide.py --out_dir="$dir" --eval_interval="$n" \
        --checkpoint_interval="$n" $extra > "$out/sweep-$i.log" 2>&1 || { echo "run $i failed: $extra"; tail -5 "$out/sweep-$i.log"; continue; }
    wall=$(python -c "import time; print(f'{time.time() - $start:.1f}')")
    python - "$dir" "$out/sweep-$i.log" "$extra" "$wall" <<'EOF'
import re, sys
sys.path.insert(0, "scripts")
import speedrun
d, log, extra, wall = sys.argv[1:]
text = open(log).read()
steps = [float(x) for x in re.findall(r"^iter \d+: .*?time ([\d.]+)ms", text, re.M)][2:]
end = re.findall(r"step \d+: .*?([\d.]+)s since launch", text)[-1]
import os
it, tokens, loss = (speedrun.score(f"{d}/ckpt.pt", "data/gcide/val.bin", "cuda") if os.environ.get("SCORE", "1") != "0"
                    else (0, 0, float("nan")))
print(f"{extra:45s} steps {it:4d} ({tokens:,} tokens): full val {loss:.4f}; last eval at {end} s, "
      f"process {wall} s; median step {sorted(steps)[len(steps) // 2] if steps else float('nan'):.1f} ms")
EOF
    rm -rf "$dir"
done
