"""
Train a GPT. Runs on one device (GPU, CPU, Apple MPS) or on many GPUs with DistributedDataParallel.

One device:
$ python train.py config/train_shakespeare_char.py --batch_size=32 --compile=False

DDP on one node with 8 GPUs:
$ torchrun --standalone --nproc_per_node=8 train.py config/train_gpt2.py

On several nodes: see docs/scaling.md. Every setting is explained in docs/configuration.md.
"""
import time

_launch_time = time.time()  # for "N s since launch" in the log (private: not a setting)

from gpt.runtime import errors  # first: a mistake, or Ctrl-C while torch loads, is one line (gpt/runtime/errors.py)

errors.install()

import math
import sys

with errors.ExitOnCtrlC():  # a Ctrl-C inside torch's import would abort it from C++: exit at once instead
    import numpy  # noqa: F401 - before torch, whose import of numpy swallows a Ctrl-C that lands in it
    import torch

_imported_torch = time.time()
import configurator
from gpt import checkpoint, optim
from gpt.checkpoint import rundir
from gpt.config import plan
from gpt.data.loader import make_loader
from gpt.data.tokenizer import get_tokenizer
from gpt.monitor.trainlog import Startup, TrainLog, start_wandb, step_line
from gpt.optim import muon
from gpt.runtime import distributed, hardware
from gpt.runtime.signals import StopRequest
from gpt.training import schedule, step, stepgraph
from gpt.training.evaluation import all_ranks_mean, draw_samples, estimate_loss
from model import GPTConfig

startup = Startup(_launch_time, _imported_torch)  # where the time before the first step goes, said as it starts


# -----------------------------------------------------------------------------
# default config values designed to train a gpt2 (124M) on OpenWebText
# I/O
out_dir = 'out'
eval_interval = 2000
log_interval = 1
eval_iters = 200
eval_only = False  # if True, script exits right after the first eval
always_save_checkpoint = True  # if True, always save a checkpoint after each eval
checkpoint_interval = 0  # 0: save at evaluations (see always_save_checkpoint); N: every N steps and the end; -1 never
keep_checkpoints = 0  # keep the last N as ckpt-<iter>.pt beside ckpt.pt, and N of the token ones (0: none / all)
ckpt_every_tokens = 0  # N: also keep ckpt-tok<tokens>-val<val loss>.pt each time N more tokens are seen (0: off)
# in-training HellaSwag ($HELLASWAG_DIR or ~/.cache/nanogpt/hellaswag) and samples, every N steps and at the end
hellaswag_interval = 0
sample_interval = 0
num_samples_train = 4
sample_prompt = "Hello, I'm a language model,"
sample_max_tokens = 32  # each sample also ends at the tokenizer's end-of-text token, where it has one
sample_top_p = 1.0  # nucleus sampling for the samples (e.g. 0.9); 1.0 = off (top_k 50 either way)
init_from = 'scratch'  # 'scratch' or 'resume' or 'gpt2*' (or a transformers GPT-2 or Llama folder)
# wandb logging
wandb_log = False
wandb_project = 'owt'
wandb_run_name = 'gpt2'
# a live web page of the run's log on 127.0.0.1 (`python dashboard.py --out_dir=...` serves one for any run)
dashboard = False
dashboard_port = 8000  # 0: any free port
# data
dataset = 'openwebtext'
data_dir = ''  # '' means data/<dataset> beside this script
gradient_accumulation_steps = 5 * 8  # used to simulate larger batch sizes (divided by the number of processes)
total_batch_size = 0  # or tokens per optimizer step: gradient_accumulation_steps from batch_size, block_size, GPUs
batch_size = 12  # micro-batch size
block_size = 1024
# model
n_layer = 12
n_head = 12
n_embd = 768
dropout = 0.0  # for pretraining 0 is good, for finetuning try 0.1+
bias = False  # do we use bias inside LayerNorm and Linear layers?
# the model's other switches are GPTConfig's fields (model.py), settings here too, with its defaults: family
# ('gpt2' or 'llama'), n_kv_head, mlp_hidden, rope_theta, tie_embeddings, qk_norm, mlp_act, logit_softcap, ...
model_options = GPTConfig.options()
# the optimizer
optimizer = 'adamw'  # 'adamw' (nanoGPT's), or 'muon': Muon for the blocks' matrices, AdamW the rest (gpt/optim/)
learning_rate = 6e-4  # max learning rate
max_iters = 600000  # total number of training iterations
max_tokens = 0  # or a token budget: when set, max_iters = ceil(max_tokens / tokens per iteration)
weight_decay = 1e-1
beta1 = 0.9
beta2 = 0.95
grad_clip = 1.0  # clip gradients at this value, or disable if == 0.0
max_nonfinite_steps = 10  # stop after this many updates in a row skipped for a NaN/inf loss or gradient
# learning rate decay settings
decay_lr = True  # False: learning_rate at every step, without warm-up (as nanoGPT)
warmup_iters = 2000  # how many steps to warm up for
lr_decay_iters = 600000  # should be ~= max_iters per Chinchilla
warmup_tokens = 0  # or warm up over this many tokens (0: warmup_iters)
lr_decay_tokens = 0  # or decay over this many tokens (0: lr_decay_iters, or with max_tokens the budget's end)
min_lr = 6e-5  # minimum learning rate, should be ~= learning_rate/10 per Chinchilla
lr_schedule = 'cosine'  # after the warm-up: 'cosine' (to min_lr), 'constant', or 'wsd' (stable, then linear decay)
lr_decay_frac = 0.2  # wsd: decay to min_lr over this last fraction of max_iters
muon_options = dict(muon.OPTIONS)  # optimizer='muon': its rate muon_lr, momentum, ... (gpt/optim/muon.py)
# distributed settings
parallelism = 'ddp'  # 'ddp': a whole copy per GPU; 'fsdp': FSDP2 shards weights, gradients and optimizer state
activation_checkpointing = False  # recompute activations in the backward pass: less memory, more compute
parallel_options = dict(distributed.OPTIONS)  # backend, ddp_bucket_mb, compile_scope, ... (gpt/runtime/distributed.py)
# system
device = 'auto'  # 'auto', 'cuda', 'cuda:1', 'cpu' or 'mps'; auto picks the best one present and says so
dtype = 'auto'  # 'float32', 'bfloat16' or 'float16' (float16 uses a GradScaler); auto: bf16 on GPUs that have it
init_device = 'device'  # where a new model's weights are drawn: 'device' (the run's: on a GPU milliseconds, not
# seconds, but other weights for a seed than the CPU's) or 'cpu' (nanoGPT's weights for a seed, on any machine)
compile = True  # use PyTorch 2.0 to compile the model to be faster
fused_loss = False  # True: the loss a chunk at a time, never the (B, T, vocab) logits: less memory, often faster
cuda_graph = False  # True: replay the whole training step from a CUDA graph (one CUDA GPU: gpt/training/stepgraph.py)
cudnn_attention = True  # False: attention never takes cuDNN's kernel (flash instead): a shorter cold start
seed = 1337
# -----------------------------------------------------------------------------
config = configurator.apply(globals(), sys.argv[1:], model_options, muon_options, parallel_options)
# -----------------------------------------------------------------------------
# The run is decided before anything is touched: the settings, the machine (torchrun's processes), the data
# and the weights it starts from make one frozen plan (gpt/config/plan.py), every check that can fail runs, and from
# here on the script reads the plan. Only then is out_dir claimed (an earlier run moved aside), are weights
# downloaded and the model built.
run, source = plan.make(config)
config = dict(run.settings)  # every setting as the run uses it: what checkpoints and log.jsonl record
globals().update({k: v for k, v in config.items() if k in globals()})  # from here on, every setting is the plan's
device_type, master_process = run.device_type, run.master
startup.part('plan')
distributed.init_process(device, config['backend'], config['dist_timeout_minutes'])  # torchrun: join the group
if run.torchrun:
    startup.part('process group')


def loader(split, stream):
    """Sequential over shards, or random windows of train.bin/val.bin; checks the files first: every id within
    the dataset's vocabulary (which the model's holds)."""
    return make_loader(run.data_dir, split, run.micro_batch, run.block_size, device,
                       run.meta['vocab_size'] if run.meta else run.model['vocab_size'],
                       run.meta['dtype'] if run.meta else 'uint16', seed, run.rank, run.world_size, stream,
                       run.prepare_hint, micro_steps=run.micro_steps if stream == 0 else 1)


train_loader = loader('train', stream=0)
loader('val', stream=1)  # check the val split now, not at the first evaluation
startup.part('data')
tokenizer = get_tokenizer(run.meta) if (sample_interval or hellaswag_interval) else None  # for in-training samples
if master_process:
    if not run.writes:
        print(f"eval_only: the losses are printed; nothing is written to {out_dir}")
    print(f"tokens per iteration will be: {run.tokens_per_iter:,}")
dashboard_server = None
if dashboard and master_process and run.writes:  # the port is taken now: one in use is refused here
    from gpt.monitor import server as live_page
    dashboard_server = live_page.make_server(out_dir, dashboard_port, training=True)

# -----------------------------------------------------------------------------
# side effects, now that nothing can be refused: out_dir claimed (an earlier run's files moved aside), downloads
claim = None  # out_dir: locked for this run, an earlier run's files moved aside by a new one
if master_process and run.writes:
    claim = rundir.claim(out_dir, fresh=run.init != 'resume')
    errors.on_failure(claim.undo)  # a run that fails before its first step leaves out_dir as it found it
if hellaswag_interval:
    from gpt.training import hellaswag_eval as hellaswag
    hellaswag_examples = distributed.rank_zero_first(hellaswag.load_examples)  # rank 0 downloads the file
torch.manual_seed(seed + run.rank)  # each process gets a different seed
torch.set_float32_matmul_precision('high')  # allow tf32 on matmul (a no-op on CPUs)
hardware.attention_kernels(cudnn=cudnn_attention)
ctx = hardware.autocast(device_type, run.dtype)
print({'scratch': "Initializing a new model from scratch", 'resume': f"Resuming training from {source.name}",
       'pretrained': f"Initializing from pretrained weights: {init_from}"}[run.init])
model = plan.build_model(run, source, seed)  # downloads GPT-2's weights for init_from=gpt2*
model_args = model.config.checkpoint_args()  # what checkpoints record: nanoGPT's keys, plus the family's
model.to(device)

# initialize a GradScaler. If enabled=False scaler is a no-op
scaler = torch.amp.GradScaler(device_type, enabled=(run.dtype == 'float16'))

# compile the model, and spread it over the processes: DDP or FSDP2
raw_model = model  # the unwrapped model: its state dict has no prefixes, and it estimates MFU
if activation_checkpointing:
    distributed.checkpoint_activations(raw_model)
startup.part('model')
model = distributed.wrap(model, run.parallelism if run.torchrun else 'ddp', device_type, run.local_rank, run.dtype,
                         run.compile, **distributed.wrap_args(config))  # the plan's options (and compile scope)
if run.compile or run.torchrun:  # compile imports torch._dynamo; DDP broadcasts the weights (and imports it too)
    startup.part(' and '.join(['torch.compile'] * run.compile + [run.parallelism.upper()] * run.torchrun) + ' set-up')
eval_model = distributed.unwrap(model)  # HellaSwag calls the compiled model directly (no gradient sync needed)

# the optimizer the plan names: made after sharding, since FSDP2 replaces the parameters with sharded ones
optimizer = optim.build(raw_model, run.optimizer, device_type)

# the rest of the training state (a resumed run's is where its checkpoint left it), and the log
log = TrainLog(out_dir, enabled=master_process and run.writes)
state = checkpoint.restore(source.checkpoint, model, optimizer, scaler, train_loader, log, run.rank, run.world_size)
saver = checkpoint.Saver(out_dir, claim, source.checkpoint)  # the last good checkpoint, divergence, whose out_dir
iter_num, best_val_loss, skipped_steps = state['iter_num'], state['best_val_loss'], state['skipped_steps']
if iter_num >= run.max_iters and not eval_only:
    print(f"nothing to train: the checkpoint is at step {iter_num:,}, max_iters={run.max_iters:,} (raise --max_iters "
          f"or --max_tokens to train on)")
source = None  # free up memory (a checkpoint's tensors)

# the whole training step as one CUDA graph (gpt/training/stepgraph.py), where the plan says it can be
step_graph = None
if run.cuda_graph:
    # eager steps before the capture set up cuBLAS and the optimizer's state: one does it uncompiled; a compiled
    # model may recompile on its next calls, so 3 there, as torch's CUDA graph docs do
    step_graph = stepgraph.StepGraph(model, optimizer, ctx, grad_clip, run.micro_steps, run.micro_batch,
                                     run.block_size, device, scaler=scaler, warmups=3 if run.compile else 1)
startup.part('optimizer and state')


def elapsed():
    """Seconds of training so far, the earlier launches of a resumed run included."""
    return state['elapsed'] + time.time() - _launch_time


def save(name=None):
    """out_dir/ckpt.pt (or, under fsdp, the sharded ckpt_dcp/): everything a resumed run needs to go on
    exactly as this one would. With a name: that file instead, kept beside ckpt.pt. Returns whether it wrote it."""
    return saver.save(raw_model if not run.sharded else model, optimizer, run.sharded, name, keep_checkpoints,
                      model_args=model_args, iter_num=iter_num, tokens=run.tokens_at(iter_num),
                      best_val_loss=best_val_loss, config=config, scaler=scaler.state_dict(),
                      train_loader=train_loader.state_dict(), dataset_meta=dict(run.meta) if run.meta else None,
                      log_position=log.position(), elapsed=elapsed(), skipped_steps=skipped_steps,
                      wandb_run_id=state['wandb_run_id'], plan=run.record())


def evaluate(due):
    """The losses (and HellaSwag) that are due, printed and logged; returns them."""
    row = {}
    if due.loss:
        losses = estimate_loss(model, lambda split: loader(split, stream=1), eval_iters, ctx, device)
        row.update(train_loss=losses['train'], val_loss=losses['val'], perplexity=math.exp(min(losses['val'], 700)))
    if due.hellaswag:
        hs = hellaswag.evaluate(eval_model, hellaswag_examples, tokenizer, device, ctx, run.rank, run.world_size,
                                progress=True)  # a bar on rank 0, when it writes to a terminal
        row.update(hellaswag=hs['acc_norm'], hellaswag_acc=hs['acc'])
    if master_process:
        print(f"step {iter_num}: " + ", ".join(f"{k.replace('_', ' ')} {v:.4f}" for k, v in row.items())
              + f", {time.time() - _launch_time:.1f}s since launch")
        log.write(kind='eval', step=iter_num, tokens=run.tokens_at(iter_num), time=elapsed(),
                  percent=100 * iter_num / max(run.max_iters, 1), **row)
    return row


def print_samples():
    """Samples of sample_prompt. The master alone samples, except under fsdp, where every rank must take
    part in each forward pass (they draw the same tokens)."""
    texts = draw_samples(raw_model, tokenizer, tokenizer.encode(sample_prompt), num_samples_train,
                         sample_max_tokens, ctx, device, seed + iter_num, top_p=sample_top_p)
    for text in texts if master_process else []:
        print(f"sample {iter_num}: {text!r}")
    log.write(kind='sample', step=iter_num, tokens=run.tokens_at(iter_num), time=elapsed(), samples=texts)


def best():
    """The best val loss of the run, None before its first evaluation."""
    return best_val_loss if best_val_loss < 1e9 else None


def micro_batches():
    """This step's micro-batches. The loop always holds the next batch: each is read (and copied to the GPU,
    asynchronously) while the GPU still runs the work before it."""
    global X, Y
    for _ in range(run.micro_steps):
        batch = X, Y
        X, Y = train_loader.next_batch()
        yield batch


# logging
if master_process:
    print("config:", " ".join(f"{k}={v!r}" for k, v in config.items()))
    for line in run.notes:
        print(f"note: {line}")
log.write(kind='plan', step=iter_num, **run.record())  # each launch's plan, as its checkpoints record it
if wandb_log and master_process:
    log.wandb = start_wandb(wandb_project, wandb_run_name, config, state['wandb_run_id'])  # gets every log row
    state['wandb_run_id'] = log.wandb.id
if dashboard_server is not None:
    live_page.start(dashboard_server)

# training loop
if claim is not None:
    claim.settle()  # the run starts: from here on a failure leaves its files (and the earlier run's aside) be
stop = StopRequest()  # SIGTERM / SIGINT / SIGHUP: finish the step, checkpoint, exit
X, Y = train_loader.next_batch()  # fetch the very first batch
t0 = time.time()
local_iter_num = 0  # number of iterations in the lifetime of this process
running_mfu = -1.0
nonfinite_in_a_row = 0
while True:

    # determine and set the learning rate for this iteration
    lr = schedule.get_lr(iter_num, learning_rate, min_lr, run.warmup_iters, run.lr_decay_iters, run.lr_schedule,
                         lr_decay_frac, run.max_iters)
    step.set_lr(optimizer, lr)

    # evaluate the loss on train/val sets (and HellaSwag), draw samples, write checkpoints: whatever is due at
    # this step (at the end too, so the last model counts). A resumed run skips what its first step has done.
    due = schedule.due(iter_num, run.max_iters, eval_only, run.init == 'resume' and iter_num == run.start_iter,
                       eval_interval, hellaswag_interval, sample_interval, run.tokens_per_iter, ckpt_every_tokens,
                       checkpoint_interval, tokens=run.tokens_at(iter_num))
    row = evaluate(due) if due.loss or due.hellaswag else {}
    if 'val_loss' in row:  # a NaN, or a loss far above the best and the untrained model's: nothing is saved
        saver.record_eval(iter_num, row['val_loss'], best_val_loss)
    saves = saver.to_save(iter_num, due, row.get('val_loss'), best_val_loss, eval_only, always_save_checkpoint,
                          checkpoint_interval)
    best_val_loss = min(best_val_loss, row.get('val_loss', best_val_loss))
    for name in saves:
        save(name)
    if due.samples and (master_process or run.sharded):
        print_samples()
    if eval_only or due.last:
        break

    step_start = time.time()  # the step alone, without this iteration's evaluation (t0 counts both)
    if local_iter_num == 0:  # where the time from launch to here went, on one line
        startup.part('first evaluation')  # and whatever else step 0 does before it trains (a save, samples)
        log.write(kind='startup', step=iter_num, **startup.row())
        print(startup.line(run.compile))  # rank 0's: the others print nothing (gpt/runtime/errors.py)
    # forward, backward and update over the micro-batches (gpt/training/step.py), the same function replayed from a
    # CUDA graph where the plan says so; a NaN/inf loss or gradient skips the update
    if step_graph is not None:
        loss_sum, grad_norm = step_graph.run(micro_batches())
    else:
        loss_sum, grad_norm = step.train_step(model, optimizer, scaler, micro_batches(), run.micro_steps, ctx,
                                              grad_clip)
    grad_norm = float(grad_norm)  # the same on every rank
    if math.isfinite(grad_norm):
        nonfinite_in_a_row = 0
    else:
        skipped_steps += 1
        nonfinite_in_a_row += 1
        if master_process:
            print(f"iter {iter_num}: non-finite gradient norm, update skipped ({nonfinite_in_a_row} in a row)")
        if nonfinite_in_a_row >= max_nonfinite_steps:
            raise errors.UserError(
                f"stopping: {nonfinite_in_a_row} steps in a row had a non-finite loss or gradient "
                f"(max_nonfinite_steps={max_nonfinite_steps}); {saver.last_good()}. "
                f"Try a lower learning_rate, dtype=bfloat16, or check the data")

    # timing and logging
    t1 = time.time()
    dt = t1 - t0
    t0 = t1
    # the loss of the whole batch, every rank's micro-steps (a CPU-GPU sync point, so only when logging)
    lossf = all_ranks_mean(float(loss_sum), device) if iter_num % log_interval == 0 else None
    if iter_num % log_interval == 0 and master_process:
        if local_iter_num >= 5:  # let the training loop settle a bit
            mfu = raw_model.estimate_mfu(run.micro_batch * run.micro_steps, dt, hardware.peak_flops(device))
            if mfu is not None:
                running_mfu = mfu if running_mfu == -1.0 else 0.9 * running_mfu + 0.1 * mfu
        mem = torch.cuda.max_memory_allocated(device) / 2**30 if device_type == 'cuda' else None  # peak so far
        percent = 100 * (iter_num + 1) / max(run.max_iters, 1)  # of the run, once this step is done
        tokens = run.tokens_at(iter_num + 1)
        print(step_line(iter_num, lossf, lr, grad_norm, dt, run.tokens_per_iter, running_mfu, mem, tokens, percent))
        log.write(kind='train', step=iter_num, tokens=tokens, time=elapsed(), percent=percent, loss=lossf, lr=lr,
                  grad_norm=grad_norm, ms_per_step=dt * 1000, tokens_per_s=run.tokens_per_iter / dt,
                  mfu=running_mfu if running_mfu >= 0 else None, skipped_steps=skipped_steps, peak_mem_gib=mem)
    if local_iter_num == 0 and master_process:  # a config far too big for this device: say so at once
        hardware.warn_if_slow(time.time() - step_start, run.max_iters - iter_num - 1, device_type)
    iter_num += 1
    local_iter_num += 1

    # preemption: the step is done; checkpoint it and leave
    if stop.requested(device):
        saved = save()
        log.end(iter_num, run.tokens_at(iter_num), run.start_iter, run.start_tokens, elapsed(),
                time.time() - _launch_time, stopped=True, best_val_loss=best(),
                checkpoint=saver.good[0] if saved else None)
        if master_process:  # a skipped or failed save must not be taken for one that can be resumed
            print(f"stopped at iteration {iter_num}; " + (
                f"continue with the same command plus --init_from=resume (and --out_dir={out_dir})" if saved else
                f"its checkpoint was not written, so --init_from=resume would not start here: {saver.last_good()}"))
        if dashboard_server is not None:
            dashboard_server.finish()
        if run.torchrun:
            del model  # the DDP wrapper goes before the process group (gpt/runtime/distributed.py's finish says why)
            distributed.finish()
        sys.exit(stop.exit_code)

log.end(iter_num, run.tokens_at(iter_num), run.start_iter, run.start_tokens, elapsed(), time.time() - _launch_time,
        best_val_loss=best(), checkpoint=saver.good[0] if saver.good else None,
        next_command=f"python sample.py --out_dir={out_dir}" if saver.good else None)
if dashboard_server is not None:
    dashboard_server.finish()  # a page that is open reads the run's last rows before the server ends
if run.torchrun:
    del model  # the DDP wrapper goes before the process group (gpt/runtime/distributed.py's finish says why)
    distributed.finish()
saver.check_end()  # a run whose last save failed, or that ended diverged, does not end with status 0
