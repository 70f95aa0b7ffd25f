#!/usr/bin/env bash
# The scaling measurements of docs/benchmarks.md, on one host with 2 GPUs:
# GPT-2 124M with config/train_gpt2.py on 1 GPU vs DDP on 2 (and FSDP on 2), gpt2-xl (1.5B) under DDP and
# FSDP, and a ~5B model that only FSDP fits. Synthetic GPT-2-token shards; logs under $OUT (or ./bench-out).
set -uo pipefail
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
OUT=${OUT:-bench-out}; mkdir -p "$OUT"
python dev/synth_data.py
RUN="--dataset=synth --eval_interval=100000 --eval_iters=2 --log_interval=1 --checkpoint_interval=-1"
TR="torchrun --standalone --nproc_per_node=2 train.py"
summary() { python - "$@" <<'PY'
import json, sys
for out in sys.argv[1:]:
    rows = [json.loads(l) for l in open(f'{out}/log.jsonl') if '"train"' in l]
    late = rows[len(rows) // 2:]  # past compilation and warm-up
    tps = sorted(r['tokens_per_s'] for r in late)[len(late) // 2]
    print(f"{out}: median tok/s {tps:,.0f}, peak mem {max(r['peak_mem_gib'] or 0 for r in rows):.1f} GiB (rank 0), "
          f"first losses {[round(r['loss'], 4) for r in rows[:4]]}")
PY
}
# GPT-2 124M, config/train_gpt2.py (12 x 1024 x 40 micro-steps), 12 steps each
timeout 300 python train.py config/train_gpt2.py $RUN --max_iters=12 --out_dir=o-124m-1gpu > $OUT/124m_1gpu.log 2>&1
timeout 300 $TR config/train_gpt2.py $RUN --max_iters=12 --out_dir=o-124m-ddp > $OUT/124m_ddp.log 2>&1
timeout 300 $TR config/train_gpt2.py $RUN --max_iters=12 --out_dir=o-124m-fsdp --parallelism=fsdp --checkpoint_interval=12 > $OUT/124m_fsdp.log 2>&1
summary o-124m-1gpu o-124m-ddp o-124m-fsdp
ls o-124m-fsdp/ckpt_dcp | head -3
# gpt2-xl shape (1.56B), eager, B=4, 2 micro-steps (1 per GPU), 10 steps
XL="--n_layer=48 --n_head=25 --n_embd=1600 --batch_size=4 --gradient_accumulation_steps=2 --max_iters=10 --compile=False"
timeout 300 $TR $RUN $XL --out_dir=o-xl-ddp > $OUT/xl_ddp.log 2>&1
timeout 300 $TR $RUN $XL --out_dir=o-xl-fsdp --parallelism=fsdp > $OUT/xl_fsdp.log 2>&1
summary o-xl-ddp o-xl-fsdp
# ~5B (24 layers, 4096 wide, 32 heads, block 2048): 80 GB of fp32 weights, grads and AdamW state alone
BIG="--n_layer=24 --n_head=32 --n_embd=4096 --block_size=2048 --batch_size=1 --gradient_accumulation_steps=2 --max_iters=8 --compile=False --activation_checkpointing=True"
timeout 400 $TR $RUN $BIG --out_dir=o-5b-fsdp --parallelism=fsdp > $OUT/5b_fsdp.log 2>&1
grep -m1 "number of parameters\|num decayed" $OUT/5b_fsdp.log
summary o-5b-fsdp
grep -h "error\|Error" $OUT/*.log | head -5
