# Time to quality (docs/speedrun.md): reach nanoGPT's GPT-2 124M val loss on the gcide corpus in a quarter of its
# wall-clock time from launch, on one GPU, cold, with the same model size, data and tokenizer. Each setting below
# comes from the modded-nanogpt speedrun or a paper: docs/speedrun.md's table gives its source and reason.
# --dataset=techdocs for the other corpus; dev/speedrun.py runs it against nanoGPT, back to back.
out_dir = 'out-speedrun'
dataset = 'gcide'

# the model: GPT-2 124M's shape, as nanoGPT's run
n_layer, n_head, n_embd, block_size = 12, 12, 768, 1024
dropout = 0.0
bias = False  # no biases: fewer parameters and kernels, no loss in quality (nanoGPT's own advice)
# switches (model.py), each one in modded-nanogpt's record runs; mlp_act='relu2' and logit_softcap=30 are off:
# uncompiled they cost more time than they save
qk_norm = True  # RMSNorm on queries and keys: bounded attention logits, stable at high learning rates
zero_init_proj = True  # every block starts as the identity (muP-like)
tie_embeddings = False  # separate input and output embeddings (every LLaMA)
pos_emb = 'rope'  # rotary positions instead of GPT-2's learned table; rope_theta stays 10000
value_embeds = 3  # 3 more token tables, table i mixed into the attention values of layers i and 9 + i
skip_connections = True  # U-net skips: block j's output, times a learned weight, added to block 11 - j's input

# the optimizer: Muon for the blocks' matrices (gpt/optim/muon.py), AdamW for the rest
optimizer = 'muon'
muon_lr = 0.02  # Muon's reference rate (KellerJordan/Muon's default); its updates have unit spectral scale
muon_momentum = 0.9  # not KellerJordan/Muon's 0.95: modded-nanogpt's early steps run at 0.85-0.9
muon_weight_decay = 0.0  # modded-nanogpt's short runs use none
learning_rate = 6e-3  # AdamW's, for embeddings, head and norm gains only: modded-nanogpt's head rate is 8e-3
scalar_lr = 0.04  # the skip and value-embedding weights' (modded-nanogpt's): at learning_rate they barely move
weight_decay = 0.0  # nothing to regularise in a run of one or two epochs (modded-nanogpt: none)
beta1, beta2 = 0.9, 0.95
grad_clip = 0.0  # no clipping (modded-nanogpt); Muon normalises its updates, the norm is still logged
# schedule: warm-up/stable/decay, linear decay over the last 40% (modded-nanogpt's cooldown_frac)
lr_schedule = 'wsd'
lr_decay_frac = 0.4
min_lr = 0.0  # both rates decay to zero (Muon's is muon_lr / learning_rate times AdamW's at every step)
decay_lr = True

# batch: 16 sequences of 1024 tokens a step, one micro-step: Muon makes more of a token in smaller steps.
# 190 steps = 3.1M tokens; the WSD decay ends with the run, so trade time against loss with max_iters (and
# warmup_iters, about a sixth of it), not by stopping early.
total_batch_size = 16_384
batch_size = 16
max_iters = 190
warmup_iters = 32

# the clock starts at launch, so evaluate as little as gives a reading: at step 0 and at the end, on 5
# batches; the verdict is dev/speedrun.py's pass over the whole of val.bin on the saved checkpoint.
# (eval_at_start=False saves no time here: the kernels' cold start-up moves into the first step)
eval_interval = 190
eval_iters = 5
log_interval = 40
always_save_checkpoint = False
checkpoint_interval = 190  # one checkpoint, at the end
wandb_log = False

# speed, as the clock starts at launch: a cold compile costs more than it saves in a run this short; the
# Triton kernels (QK-norm with the rotation, LayerNorm, the loss) and the CUDA graph (one GPU only) cut what small
# kernels' launches cost; cuDNN's attention builds its kernels at the first calls, so flash's is quicker cold
compile = False
fused_qk = True
fused_norm = True  # LayerNorm too: its backward's weight-gradient sums are slow uncompiled
fused_loss = True
cuda_graph = True
cudnn_attention = False
ddp_sync = 'hooks'  # under torchrun: no DDP wrapper, so the step stays one CUDA graph (docs/scaling.md#ddp_sync)
bf16_residual = True  # the residual stream in bf16, not float32: half the bytes its additions and norms move
