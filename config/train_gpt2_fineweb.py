# Reproduce GPT-2 (124M) the build-nanogpt way (docs/fineweb.md): 10B tokens of FineWeb-Edu, one epoch, ~0.5M a step.
# $ python data/fineweb/prepare.py        # sample-10BT, ~100 shards of 100M tokens
# $ torchrun --standalone --nproc_per_node=8 train.py config/train_gpt2_fineweb.py

dataset = 'fineweb'
out_dir = 'out-gpt2-fineweb'

# 524,288 tokens per step, on any number of GPUs: micro-steps of 64 x 1024, divided among the GPUs
# (8 GPUs: 1 micro-step each; 1 GPU: 8 micro-steps)
total_batch_size = 524_288
batch_size = 64
block_size = 1024

# GPT-2 124M (vocab 50304: GPT-2's 50257 rounded up)
n_layer = 12
n_head = 12
n_embd = 768
dropout = 0.0
bias = False

# AdamW and the schedule of GPT-3 Small, as in build-nanogpt: 10e9 / 524288 = 19,073 steps, one epoch
learning_rate = 6e-4
min_lr = 6e-5
warmup_iters = 715
max_iters = 19073
lr_decay_iters = 19073
weight_decay = 0.1
beta1 = 0.9
beta2 = 0.95
grad_clip = 1.0

# validation loss (20 batches per GPU, averaged over GPUs), HellaSwag and samples every 250 steps
eval_interval = 250
eval_iters = 20
hellaswag_interval = 250
sample_interval = 250
log_interval = 10

# a checkpoint every 5,000 steps and at the end (each kept as ckpt-<step>.pt too)
checkpoint_interval = 5000
keep_checkpoints = 5

wandb_log = False
wandb_project = 'gpt2-fineweb'
wandb_run_name = 'gpt2-124M-10B'
