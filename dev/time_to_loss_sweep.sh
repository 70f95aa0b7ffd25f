#!/usr/bin/env bash
# Time-to-loss sweep for the small recipes (docs/benchmarks.md): each argument is one run of $CONFIG
# (default config/train_shakespeare_char.py) with those extra settings, through dev/time_to_loss.py (cold
# caches, the target $TARGET, default 1.47); prints each run's time to the target and its best val loss.
# GPUS=4 runs the list four at a time, run i on GPU i mod 4 (a tuning shortcut: runs side by side share the
# host's CPUs and disk; time the chosen recipe alone).
#   $ GPUS=4 bash dev/time_to_loss_sweep.sh "" "--learning_rate=2e-3"     (logs under $OUT)
set -uo pipefail
out=${OUT:-bench-out}; mkdir -p "$out"
config=${CONFIG:-config/train_shakespeare_char.py}
gpus=${GPUS:-1}
i=0
for extra in "$@"; do
    rm -rf "out-ttl-$i"  # this script's own run folder, from an earlier call
    # shellcheck disable=SC2086
    CUDA_VISIBLE_DEVICES=$((i % gpus)) python dev/time_to_loss.py --target="${TARGET:-1.47}" --out="$out/ttl-$i" \
        -- "$config" --out_dir="out-ttl-$i" $extra > "$out/ttl-$i.txt" 2>&1 &
    i=$((i + 1))
    [ $((i % gpus)) = 0 ] && wait
done
wait
i=0
for extra in "$@"; do
    echo "[$i] ${extra:-(as is)}: $(tail -1 "$out/ttl-$i.txt")"
    i=$((i + 1))
done
