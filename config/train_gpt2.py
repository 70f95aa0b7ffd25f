# config for training GPT-2 (124M) down to very nice loss of ~2.85 on 1 node of 8X A100 40GB
# launch as the following (e.g. in a screen session) and wait ~5 days:
# $ torchrun --standalone --nproc_per_node=8 train.py config/train_gpt2.py

wandb_log = False  # set True (and `wandb login`) to follow the run on wandb
wandb_project = 'owt'
wandb_run_name = 'gpt2-124M'

# the total batch size, ~0.5M tokens a step: 12 batch size * 1024 block size * 5 gradaccum * 8 GPUs = 491,520.
# Stated in tokens, it is the same on any number of GPUs: 40 micro-steps of 12 on one, 5 on eight, 10 on four
# (batch_size is the most sequences a micro-step takes: gpt/training/schedule.py's split_batch)
total_batch_size = 491_520
batch_size = 12
block_size = 1024

# this makes total number of tokens be 300B
max_iters = 600000
lr_decay_iters = 600000

# eval stuff
eval_interval = 1000
eval_iters = 200
log_interval = 10

# weight decay
weight_decay = 1e-1

# on a CUDA GPU the whole step is replayed from one CUDA graph, under torchrun too: 'hooks' averages the gradients
# without torch's DDP wrapper, which a graph cannot hold (docs/scaling.md#ddp_sync: the speeds)
cuda_graph, ddp_sync = True, 'hooks'
