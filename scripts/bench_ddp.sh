#!/usr/bin/env bash
# Issue 9's run: GPT-2 124M with config/train_gpt2.py (bf16, compile) on 1 GPU, then under DDP on N GPUs of
# the same host, 60 steps each on synthetic GPT-2-token shards; tokens/s and MFU are the medians of the last
# 40 steps. The global batch is the same (40 micro-steps of 12 x 1024, split over the GPUs), so the first
# losses must agree.    $ bash scripts/bench_ddp.sh 8        (logs under $OUT, or ./bench-out)
set -uo pipefail
N=${1:-8}
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
OUT=${OUT:-bench-out}; mkdir -p "$OUT"
python scripts/synth_data.py
RUN="config/train_gpt2.py --dataset=synth --eval_interval=100000 --eval_iters=2 --log_interval=1 --checkpoint_interval=-1 --max_iters=60"
nvidia-smi --query-gpu=name --format=csv,noheader | head -1; python -c "import torch; print('torch', torch.__version__)"
timeout 280 python train.py $RUN --out_dir=o-ddp-1 > $OUT/ddp_1gpu.log 2>&1
timeout 280 torchrun --standalone --nproc_per_node=$N train.py $RUN --out_dir=o-ddp-$N > $OUT/ddp_${N}gpu.log 2>&1
python - $N <<'PY'
import json, sys
n = int(sys.argv[1])
def run(out):
    rows = [json.loads(l) for l in open(f'{out}/log.jsonl') if '"train"' in l]
    last = rows[-40:]
    med = lambda k: sorted(r[k] for r in last)[len(last) // 2]
    return rows, med('tokens_per_s'), med('mfu'), max(r['peak_mem_gib'] or 0 for r in rows)
one, tps1, mfu1, mem1 = run('o-ddp-1')
many, tpsn, mfun, memn = run(f'o-ddp-{n}')
print(f"1 GPU: {tps1:,.0f} tok/s, MFU {mfu1 * 100:.1f}%, peak {mem1:.1f} GiB")
print(f"{n} GPUs: {tpsn:,.0f} tok/s, MFU/GPU {mfun * 100:.1f}%, peak {memn:.1f} GiB (rank 0), "
      f"scaling efficiency {tpsn / (n * tps1):.3f}")
print("first losses, 1 GPU:", [round(r['loss'], 4) for r in one[:5]])
print(f"first losses, {n} GPUs:", [round(r['loss'], 4) for r in many[:5]])
PY
grep -h "rror" $OUT/ddp_*.log | head -5
