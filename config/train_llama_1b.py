# A 1.3B LLaMA-style model (rotary positions, RMSNorm, SwiGLU, untied embeddings, no biases), trained on a
# token budget with its own BPE tokenizer. 24 layers, 2048 wide, 32 heads of 64, context 2048: 1.35B parameters
# with a 32,768-token vocabulary. Full multi-head attention (n_kv_head = n_head), as in the 1.3B reference;
# set n_kv_head=8 for grouped-query attention (a 4x smaller KV cache, ~0.15B fewer parameters).
# $ python data/openwebtext/prepare.py --tokenizer=train --vocab_size=32768   # or leave GPT-2's BPE
# $ torchrun --standalone --nproc_per_node=8 train.py config/train_llama_1b.py

dataset = 'openwebtext'  # train.py takes the vocabulary (and tokenizer.json) from its meta.json
out_dir = 'out-llama-1b'

family = 'llama'
n_layer = 24
n_embd = 2048
n_head = 32
n_kv_head = 32
mlp_hidden = 0  # 8/3 x 2048 rounded up to a multiple of 64: 5504
tie_embeddings = False
bias = False
dropout = 0.0
rope_theta = 10000.0

# 524,288 tokens (~0.5M) per step: 32 micro-steps of 8 sequences of 2048, divided among the GPUs
# (8 GPUs: 4 micro-steps each). bf16 weights, gradients and AdamW state take ~21 GB per GPU under DDP;
# parallelism='fsdp' shards them, activation_checkpointing=True trades compute for activation memory.
total_batch_size = 524_288
batch_size = 8
block_size = 2048
fused_loss = True  # the head and loss a chunk at a time, no (B, T, vocab) logits: 3 GiB less, ~1% faster

# the budget: 26B tokens (~20 per parameter, Chinchilla-optimal) = 49,592 steps; warm-up over 1B tokens
# (1,908 steps), then cosine decay to min_lr at the end of the budget
max_tokens = 26_000_000_000
warmup_tokens = 1_000_000_000
learning_rate = 3e-4
min_lr = 3e-5
weight_decay = 0.1
beta1 = 0.9
beta2 = 0.95
grad_clip = 1.0

# validation every ~0.5B tokens; besides ckpt.pt, a checkpoint kept every 1B tokens (the last 5)
eval_interval = 1000
eval_iters = 50
log_interval = 10
ckpt_every_tokens = 1_000_000_000
keep_checkpoints = 5  # also of the ckpt_every_tokens checkpoints
# each 16 GB checkpoint written from a thread: the steps wait ~2 s for its copy into RAM (16 GB of it, held for the
# run on rank 0), not the ~35 s of writing it (docs/benchmarks.md)
async_save = True

wandb_log = False
wandb_project = 'llama-1b'
wandb_run_name = 'llama-1.3b-26B'
