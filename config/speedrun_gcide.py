# Time to quality (docs/speedrun.md): reach nanoGPT's GPT-2 124M val loss on the gcide corpus
# (shared/bench/gcide_nanogpt.py: 400 steps of 65,536 tokens) in a quarter of its wall-clock time from launch,
# on one GPU, cold. Same model size, data and tokenizer; what changes is the optimizer, a few architecture
# switches, the batch and the schedule, each one taken from the modded-nanogpt speedrun
# (github.com/KellerJordan/modded-nanogpt) or a paper, i.e. chosen because it has transferred across models
# and data, not tuned to this dictionary (only the batch and the step count were chosen from runs on it).
# Any other corpus: --dataset=techdocs (data/techdocs, built by dev/techdocs.py), measured there too.
# dev/speedrun.py runs it against nanoGPT, back to back; docs/speedrun.md has the measured table.
out_dir = 'out-speedrun'
dataset = 'gcide'

# the model: GPT-2 124M's shape, as nanoGPT's run
n_layer, n_head, n_embd, block_size = 12, 12, 768, 1024
dropout = 0.0
bias = False  # no biases: fewer parameters and kernels, no loss in quality (nanoGPT's own advice)
# switches (model.py), each one in modded-nanogpt's record runs since Oct 2024:
qk_norm = True  # RMSNorm on queries and keys: bounded attention logits, stable at high learning rates
# (Dehghani et al. 2023, "Scaling Vision Transformers to 22B"; Wortsman et al. 2023, "Small-scale proxies")
# mlp_act = 'relu2' (ReLU squared, So et al. 2021) is a little better per step, but uncompiled it costs more
# time than it saves (two kernels and their backward, against GELU's one): off here
zero_init_proj = True  # every block starts as the identity (muP-like; modded-nanogpt, Oct 2024 record)
tie_embeddings = False  # separate input and output embeddings (modded-nanogpt; every LLaMA)
# logit_softcap = 30.0 (Gemma 2; modded-nanogpt, Nov 2024): uncompiled, fp32 logits through tanh cost more
# time than the cap saves: off here
# rotary positions (RoFormer, Su et al. 2021) instead of GPT-2's learned table: part of modded-nanogpt's
# "modernized architecture" (with QK-norm and ReLU squared) since its early records; rope_theta stays 10000
pos_emb = 'rope'
# value embeddings: 3 more token tables, table i mixed into the attention values of layers i and 9 + i (the
# first 3 and the last 3 of 12), with learned weights starting at 0.5 and 0.5 (modded-nanogpt's records of
# Dec 2024)
value_embeds = 3
# U-net skips: the output of each of the first 6 blocks, times a learned weight starting at 1, added to the
# input of its mirror block (block j feeds block 11 - j; modded-nanogpt's record of Nov 10 2024)
skip_connections = True

# the optimizer: Muon for the blocks' matrices (gpt/optim/muon.py: Jordan et al. 2024, modded-nanogpt's optimizer
# since its first records; Liu et al. 2025 "Muon is scalable for LLM training" at 16B), AdamW for the rest
optimizer = 'muon'
muon_lr = 0.02  # Muon's reference rate (KellerJordan/Muon's default); its updates have unit spectral scale
# Nesterov momentum 0.9, not KellerJordan/Muon's 0.95: modded-nanogpt warms its momentum from 0.85 up to 0.95
# over its first 300 steps, so a run this short would sit at 0.85-0.9 throughout; at the same steps 0.9 reached
# a lower loss than 0.95, 0.85 or 0.8 on gcide (docs/records/2026-11-27-speedrun.md)
muon_momentum = 0.9
muon_weight_decay = 0.0  # modded-nanogpt's short runs use none
learning_rate = 6e-3  # AdamW's, for embeddings, head and norm gains only: modded-nanogpt's head rate is 8e-3
# the value-embedding and skip weights (learned scalars near 1) at modded-nanogpt's scalar rate, not
# learning_rate, at which they barely move in a run this short; at 0.04 every seed ended lower on both
# corpora (docs/records/2026-11-27-speedrun.md). The value tables themselves train at learning_rate, as the
# token embedding does (in modded-nanogpt too both share one rate)
scalar_lr = 0.04
weight_decay = 0.0  # nothing to regularise in a run of one or two epochs (modded-nanogpt: none)
beta1, beta2 = 0.9, 0.95
grad_clip = 0.0  # no clipping (modded-nanogpt); Muon normalises its updates, the norm is still logged
# schedule: warm-up/stable/decay (trapezoid), linear decay over the last 40% (modded-nanogpt's cooldown_frac;
# Hägele et al. 2024, "Scaling laws and compute-optimal training beyond fixed training durations")
lr_schedule = 'wsd'
lr_decay_frac = 0.4
min_lr = 0.0  # both rates decay to zero (Muon's is muon_lr / learning_rate times AdamW's at every step)
decay_lr = True

# batch: 16 sequences of 1024 tokens a step (16,384 tokens, a quarter of nanoGPT's 65,536), one micro-step.
# Muon makes more of a token in smaller steps (at the same tokens, 16,384 a step reached a lower loss than
# 32,768 and 65,536), and a step of 16 sequences is still large enough to keep the GPU busy. On two
# or four GPUs the same 16 sequences are split between them (gpt/training/schedule.py's split_batch). The run's length
# is the knob that trades time against loss: 190 steps = 3.1M tokens (12% of nanoGPT's 26.2M). The WSD decay
# ends with the run, so the best checkpoint is the last one: change max_iters, not where to stop reading (and
# warmup_iters with it, about a sixth of the run).
total_batch_size = 16_384
batch_size = 16
max_iters = 190
warmup_iters = 32

# the clock starts at launch, so evaluate as little as gives a reading: at step 0 (always) and at the end,
# on 5 batches; the verdict is dev/speedrun.py's pass over the whole of val.bin on the saved checkpoint
eval_interval = 190
eval_iters = 5
log_interval = 40
always_save_checkpoint = False
checkpoint_interval = 190  # one checkpoint, at the end
wandb_log = False

# speed: the clock starts at launch, and a cold compile delays the first step by more than it saves in a run
# this short. Uncompiled, QK-norm and the rotary embedding are a chain of float32 elementwise kernels; fused_qk
# runs them as one Triton kernel each way (gpt/kernels/fused_qk.py, the same math, one read and one write of q
# and k instead of one per kernel). At 16 sequences a step the kernels are small enough that launching them shows:
# the CUDA graph replays the whole step (gpt/training/stepgraph.py; one GPU only, torchrun runs without it). The fused
# loss takes the loss and its gradient from the logits in one Triton kernel (gpt/kernels/cross_entropy.py),
# in place of F.cross_entropy's several float32 passes over them. Attention takes flash attention's kernel,
# not cuDNN's: cuDNN's is a little faster a step but builds its kernels at the first calls, and a cold launch
# reaches its last step sooner without it (docs/records/2026-11-27-speedrun.md).
compile = False
fused_qk = True
fused_loss = True
cuda_graph = True
cudnn_attention = False
