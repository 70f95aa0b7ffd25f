#!/usr/bin/env bash
# A config's training speed on one GPU, as train.py reports it: each argument after the config is one run
# with those extra settings, $STEPS (20) steps on synthetic GPT-2-token shards (dev/synth_data.py); prints
# the medians of tokens/s and MFU over the steps after the first five, and the peak memory.
#   $ bash dev/bench_train.sh config/train_llama_1b.py "" "--fused_loss=True"     (logs under $OUT)
# The llama config counts its run in tokens: give it --max_tokens=0 --warmup_tokens=0 --ckpt_every_tokens=0
# through ARGS (settings every run gets), with a smaller --total_batch_size for short steps.
set -uo pipefail
config=$1; shift
out=${OUT:-bench-out}; mkdir -p "$out"
[ -f data/synth/meta.json ] || python dev/synth_data.py
i=0
for extra in "$@"; do
    rm -rf "out-bench-$i"
    # shellcheck disable=SC2086
    timeout "${LIMIT:-300}" python train.py "$config" --dataset=synth --max_iters="${STEPS:-20}" --eval_interval=100000 \
        --eval_iters=1 --log_interval=1 --checkpoint_interval=-1 --out_dir="out-bench-$i" ${ARGS:-} $extra \
        > "$out/bench-train-$i.log" 2>&1
    python - "out-bench-$i/log.jsonl" "${extra:-(as is)}" <<'PY'
import json, sys
try:
    rows = [r for r in map(json.loads, open(sys.argv[1])) if r["kind"] == "train"][5:]
    med = lambda k: sorted(r[k] or 0 for r in rows)[len(rows) // 2]  # mfu is None where the peak is unknown
    print(f"{sys.argv[2]}: {med('tokens_per_s'):,.0f} tok/s, MFU {med('mfu') * 100:.1f}%, "
          f"peak {max(r['peak_mem_gib'] or 0 for r in rows):.1f} GiB ({len(rows)} steps)")
except (OSError, IndexError, KeyError, ValueError, TypeError) as e:
    print(f"{sys.argv[2]}: no result ({type(e).__name__}: {e})")
PY
    i=$((i + 1))
done
