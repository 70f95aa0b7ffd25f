#!/usr/bin/env bash
# DDP's scaling: GPT-2 124M with config/train_gpt2.py (bf16, compile) on 1 GPU, then under DDP on N GPUs of
# the same host, $STEPS (60) steps each on synthetic GPT-2-token shards; tokens/s and MFU are the medians of
# the last STEPS-20 steps. The global batch is the same (40 micro-steps of 12 x 1024, split over the GPUs), so
# the first losses must agree. Each further argument is one more N-GPU run with those train.py settings, run
# back to back after the default one (e.g. torch's own DDP options against ours):
#   $ bash dev/bench_ddp.sh 8        (logs under $OUT, or ./bench-out)
#   $ STEPS=40 bash dev/bench_ddp.sh 4 "--ddp_reduce_dtype=bfloat16" "--ddp_bucket_mb=100 --ddp_bucket_view=True"
# REUSE_1GPU=1 keeps an earlier call's one-GPU run (o-ddp-1, same STEPS) as the baseline: e.g. N=4, then N=2
# on CUDA_VISIBLE_DEVICES=0,1 of the same machine. ARGS are settings every run gets, the one-GPU run included
# (e.g. ARGS="--cuda_graph=True --ddp_sync=hooks": the step as one CUDA graph on 1 and on N GPUs).
set -uo pipefail
N=${1:-8}; shift
STEPS=${STEPS:-60}
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
OUT=${OUT:-bench-out}; mkdir -p "$OUT"
[ -f data/synth/meta.json ] || python dev/synth_data.py
[ "${REUSE_1GPU:-0}" = 1 ] && [ -f o-ddp-1/log.jsonl ] || rm -rf o-ddp-1
rm -rf o-ddp-$N o-ddp-$N-*   # this script's own run folders, from an earlier call
RUN="config/train_gpt2.py --dataset=synth --eval_interval=100000 --eval_iters=2 --log_interval=1 --checkpoint_interval=-1 --max_iters=$STEPS ${ARGS:-}"
nvidia-smi --query-gpu=name --format=csv,noheader | head -1; python -c "import torch; print('torch', torch.__version__)"
[ -f o-ddp-1/log.jsonl ] || timeout 280 python train.py $RUN --out_dir=o-ddp-1 > $OUT/ddp_1gpu.log 2>&1
NAMES=("o-ddp-1|1 GPU|1" "o-ddp-$N|$N GPUs, defaults|$N")
i=0
for extra in "" "$@"; do
  dir=o-ddp-$N-$i; [ $i = 0 ] && dir=o-ddp-$N
  [ $i != 0 ] && NAMES+=("$dir|$N GPUs, $extra|$N")
  timeout 280 torchrun --standalone --nproc_per_node=$N train.py $RUN $extra --out_dir=$dir > $OUT/ddp_${N}gpu_$i.log 2>&1
  i=$((i + 1))
done
python - $STEPS "${NAMES[@]}" <<'PY'
import json, sys
steps, runs = int(sys.argv[1]), [a.split("|") for a in sys.argv[2:]]
def stats(out):
    rows = [json.loads(l) for l in open(f'{out}/log.jsonl') if '"train"' in l]
    last = rows[20:] if len(rows) > 20 else rows[len(rows) // 2:]
    med = lambda k: sorted(r[k] for r in last)[len(last) // 2]
    return rows, med('tokens_per_s'), med('mfu'), max(r['peak_mem_gib'] or 0 for r in rows)
tps1 = None
for out, name, n in runs:
    try:
        rows, tps, mfu, mem = stats(out)
    except (OSError, IndexError, ValueError, TypeError) as e:
        print(f"{name}: no result ({type(e).__name__}: {e})"); continue
    tps1 = tps if n == "1" else tps1
    eff = f", scaling efficiency {tps / (int(n) * tps1):.3f}" if n != "1" and tps1 else ""
    print(f"{name}: {tps:,.0f} tok/s, MFU/GPU {mfu * 100:.1f}%, peak {mem:.1f} GiB{eff}")
    print("  first losses:", [round(r['loss'], 4) for r in rows[:5]])
PY
grep -h "rror" $OUT/ddp_*.log | head -5
