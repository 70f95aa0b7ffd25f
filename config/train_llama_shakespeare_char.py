# a miniature character-level shakespeare model, LLaMA-style: rotary positions, RMSNorm, SwiGLU, grouped-query
# attention, untied embeddings, no biases; the same size and batch as config/train_shakespeare_char.py, and a
# shorter schedule: this model learns faster and overfits sooner (docs/records/2026-11-27-speedrun.md, "The
# llama config")
# $ python train.py config/train_llama_shakespeare_char.py

out_dir = 'out-llama-shakespeare-char'
eval_interval = 250  # keep frequent because we'll overfit
eval_iters = 50  # 50 batches of 64 x 256 characters: 7x the 111K-character val split
log_interval = 10

# we expect to overfit on this small dataset, so only save when val improves
always_save_checkpoint = False

wandb_log = False
wandb_project = 'shakespeare-char'
wandb_run_name = 'mini-llama'

dataset = 'shakespeare_char'
total_batch_size = 16_384  # 64 sequences of 256 a step, on any number of GPUs (two: 32 each)
batch_size = 64
block_size = 256  # context of up to 256 previous characters

family = 'llama'
n_layer = 6
n_head = 6
n_kv_head = 2  # each key/value head serves 3 query heads
n_embd = 384  # SwiGLU hidden size: 8/3 x 384 = 1024
tie_embeddings = False
bias = False
dropout = 0.2

# a token budget instead of an iteration count: 1250 steps of 16,384 tokens; warm up over the first 100,
# and the cosine decay ends with the budget. Its val loss bottoms out at step 1000-1250 where the GPT-2
# config's does at 2000: a longer decay only overfits
learning_rate = 1e-3
max_tokens = 20_480_000
warmup_tokens = 1_638_400
min_lr = 1e-4
beta2 = 0.99  # make a bit bigger because number of tokens per iter is small

# as config/train_shakespeare_char.py: each step replayed from a CUDA graph (one CUDA GPU), no cold compile
cuda_graph = True
compile = False
