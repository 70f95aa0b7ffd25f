# train a miniature character-level shakespeare model
# good for debugging and playing on macbooks and such

out_dir = 'out-shakespeare-char'
eval_interval = 250  # keep frequent because we'll overfit
eval_iters = 50  # 50 batches of 64 x 256 characters: 7x the 111K-character val split, a quarter of 200's cost
log_interval = 10  # don't print too too often

# we expect to overfit on this small dataset, so only save when val improves
always_save_checkpoint = False
# each such save (128 MB with AdamW's moments) is written from a thread: the steps wait only for its copy to RAM
async_save = True

wandb_log = False  # override via command line if you like
wandb_project = 'shakespeare-char'
wandb_run_name = 'mini-gpt'

dataset = 'shakespeare_char'
total_batch_size = 16_384  # 64 sequences of 256 a step, on any number of GPUs (two: 32 each)
batch_size = 64
block_size = 256  # context of up to 256 previous characters

# baby GPT model :)
n_layer = 6
n_head = 6
n_embd = 384
dropout = 0.2

learning_rate = 1e-3  # with baby networks can afford to go a bit higher
max_iters = 2000  # nanoGPT's 5000 overfit: decaying over 2000 reaches a lower best val loss, in 40% of the steps
lr_decay_iters = 2000  # make equal to max_iters usually
min_lr = 1e-4  # learning_rate / 10 usually
beta2 = 0.99  # make a bit bigger because number of tokens per iter is small

warmup_iters = 100  # not super necessary potentially

# a model this small is bound by launching kernels, not by the GPU. Replaying each step from a CUDA graph
# removes that (used only on one CUDA GPU); a cold compile would take longer than it can win back over 2000
# steps, and cuDNN's attention builds its kernels at the first calls, which flash's does not (docs/benchmarks.md)
cuda_graph = True
compile = False
cudnn_attention = False
# LayerNorm as a Triton kernel (a CUDA GPU): a sixth off the step, compiled while torch loads; over a dozen seeds
# best val ended a little higher with it, for no cause found (docs/benchmarks.md): --fused_norm=False for the lowest
fused_norm = True
