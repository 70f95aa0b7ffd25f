# The time-to-quality benchmark's reference recipe on its second corpus: nanoGPT's GPT-2 (124M) settings on
# techdocs (python dev/techdocs.py writes data/techdocs/train.bin and val.bin), the settings of the
# gcide recipe (gcide_nanogpt.py) with its length scaled to this corpus, for one GPU:
# 16 x 1024 tokens x 4 micro-steps = 65,536 tokens a step, as for gcide. gcide's 400 steps are 26,214,400
# tokens, 1.703 epochs of its 15,390,185 train tokens; 1.703 epochs of techdocs' 13,102,599 are 22.3M tokens,
# 340.5 steps: 340 steps (22,282,240 tokens, 1.70 epochs), warm-up 10% of them, the decay over all of them.
# nanoGPT saves its checkpoint only at evaluations, so eval_interval divides max_iters: every 68 steps (gcide's
# recipe evaluates every 50 of 400) keeps the last evaluation, and the checkpoint scored, at the end.
# It is a plain config file: karpathy/nanoGPT's train.py and this project's both run it.
out_dir = 'out-techdocs'
dataset = 'techdocs'
eval_interval = 68
eval_iters = 20
log_interval = 10
always_save_checkpoint = False
wandb_log = False
batch_size = 16
block_size = 1024
gradient_accumulation_steps = 4
n_layer = 12
n_head = 12
n_embd = 768
dropout = 0.0
bias = False
learning_rate = 6e-4
max_iters = 340
lr_decay_iters = 340
warmup_iters = 34
min_lr = 6e-5
weight_decay = 0.1
beta1 = 0.9
beta2 = 0.95
grad_clip = 1.0
compile = True
