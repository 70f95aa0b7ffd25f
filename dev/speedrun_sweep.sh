#!/usr/bin/env bash
# Tuning runs for the speedrun recipes (docs/speedrun.md): each argument is one run of the recipe with those
# extra settings, its last checkpoint scored over the whole of data/<dataset>/val.bin; prints, per run, the
# seconds from launch to the end of training, the step time and the full val loss. No nanoGPT run: compare
# against its score from dev/speedrun.py (the comparison itself).
#   $ bash dev/speedrun_sweep.sh "--max_iters=120" "--max_iters=150 --compile=True"   (logs under $OUT)
# CONFIG=config/other.py picks another recipe (default config/speedrun_gcide.py); DATASET=techdocs
# another corpus (built by dev/techdocs.py); SCORE=0 skips the scoring (for timing variants only); GPUS=4
# runs the list four at a time, one run per GPU (run i on GPU i mod 4, each GPU's runs in turn: a tuning
# shortcut, since runs beside each other share the host's CPUs and disk; time the final recipe alone), from
# GPU FIRST_GPU on (default 0).
set -uo pipefail
out=${OUT:-bench-out}; mkdir -p "$out"
config=${CONFIG:-config/speedrun_gcide.py}
dataset=${DATASET:-gcide}
gpus=${GPUS:-1}
first_gpu=${FIRST_GPU:-0}
export PYTHONUNBUFFERED=1

run_one() {  # index, extra settings
    local i=$1 extra=$2 dir="o-sweep-$dataset-$1" n start wall
    rm -rf "$dir"
    n=$(echo "$extra" | sed -n 's/.*--max_iters=\([0-9]*\).*/\1/p'); n=${n:-260}
    start=$(date +%s.%N)
    # shellcheck disable=SC2086
    python train.py "$config" --dataset="$dataset" --out_dir="$dir" --eval_interval="$n" \
        --checkpoint_interval="$n" $extra > "$out/sweep-$i.log" 2>&1 ||
        { echo "run $i failed: $extra" > "$out/sweep-$i.result"; tail -5 "$out/sweep-$i.log" >> "$out/sweep-$i.result"; return; }
    wall=$(python -c "import time; print(f'{time.time() - $start:.1f}')")
    python - "$dir" "$out/sweep-$i.log" "$extra" "$wall" "$dataset" > "$out/sweep-$i.result" <<'EOF'
import os, re, sys
sys.path.insert(0, "dev")
import speedrun
d, log, extra, wall, dataset = sys.argv[1:]
text = open(log).read()
steps = [float(x) for x in re.findall(r"^iter \d+: .*?time ([\d.]+)ms", text, re.M)][2:]
end = re.findall(r"step \d+: .*?([\d.]+)s since launch", text)[-1]
first = re.findall(r"startup: first step at ([\d.]+)s", text)
it, tokens, loss = (speedrun.score(f"{d}/ckpt.pt", f"data/{dataset}/val.bin", "cuda")
                    if os.environ.get("SCORE", "1") != "0" else (0, 0, float("nan")))
print(f"{extra:45s} steps {it:4d} ({tokens:,} tokens): full val {loss:.4f}; first step at "
      f"{first[0] if first else '?'} s, last eval at {end} s, process {wall} s; "
      f"median step {sorted(steps)[len(steps) // 2] if steps else float('nan'):.1f} ms")
EOF
    rm -rf "$dir"
}

args=("$@")
for ((g = 0; g < gpus; g++)); do
    (
        [ "$gpus" -gt 1 ] && export CUDA_VISIBLE_DEVICES=$((g + first_gpu))
        for ((i = g; i < ${#args[@]}; i += gpus)); do run_one "$((i + 1))" "${args[$i]}"; done
    ) &
done
wait
for ((i = 1; i <= ${#args[@]}; i++)); do cat "$out/sweep-$i.result"; done
