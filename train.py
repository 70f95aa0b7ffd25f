"""
Train a GPT. Runs on one device (GPU, CPU, Apple MPS) or on many GPUs with DistributedDataParallel.

One device:
$ python train.py config/train_shakespeare_char.py --batch_size=32 --compile=False

DDP on one node with 8 GPUs:
$ torchrun --standalone --nproc_per_node=8 train.py config/train_gpt2.py

On several nodes: see docs/scaling.md. Every setting is explained in docs/configuration.md."""
import time

_launch_time = time.time()  # for "N s since launch" in the log (private: not a setting)

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # for torchrun --run-path too (docs/scaling.md)
from gpt.runtime import errors  # first: a mistake, or Ctrl-C while torch loads, is one line

errors.install()
from gpt.kernels import ahead  # no torch either: Triton's compilers start now, while torch loads

compilers = ahead.start()  # where there is an NVIDIA GPU and Triton (gpt/kernels/ahead.py)

import math

with errors.ExitOnCtrlC():  # a Ctrl-C inside torch's import would abort it from C++: exit at once instead
    import numpy  # noqa: F401 - before torch, whose import of numpy swallows a Ctrl-C that lands in it
    import torch

_imported_torch = time.time()
import configurator
from gpt import checkpoint, optim
from gpt.checkpoint import rundir
from gpt.data.loader import make_loader
from gpt.data.tokenizer import get_tokenizer
from gpt.kernels import dispatch
from gpt.monitor import server
from gpt.monitor.trainlog import Startup, TrainLog, start_wandb
from gpt.optim import muon
from gpt.runtime import distributed, hardware, settings
from gpt.runtime.settings import FRACTION, MODEL, NOT_NEGATIVE, POSITIVE, SEED, TRAINING, Setting, at_least, kept
from gpt.runtime.signals import StopRequest
from gpt.training import evaluation, hellaswag_eval, plan, schedule, step, stepgraph
from model import GPTConfig

startup = Startup(_launch_time, _imported_torch)  # where the time before the first step goes, said as it starts

# -----------------------------------------------------------------------------
# default config values designed to train a gpt2 (124M) on OpenWebText. A setting's comment is its --help line;
# its annotation says which values make sense, when it does nothing, and what a resumed run does with it
# (RUN, TRAINING: takes the new value; kept: refuses it). gpt/runtime/settings.py says more.
# I/O
out_dir: Setting() = 'out'  # the run's folder: checkpoints and log.jsonl
eval_interval: Setting(POSITIVE) = 2000  # evaluate (and maybe save) every N steps
log_interval: Setting(POSITIVE) = 1  # print and log the training loss every N steps
eval_iters: Setting(POSITIVE) = 200  # batches of each split an evaluation averages
eval_only: Setting() = False  # if True, script exits right after the first eval
always_save_checkpoint: Setting(unused=settings.by_interval) = True  # if True, always save a checkpoint after each eval
checkpoint_interval: Setting(schedule.CHECKPOINT_INTERVAL) = 0  # save every N steps (0: at evaluations; -1: never)
keep_checkpoints: Setting(NOT_NEGATIVE, unused=schedule.never_saves) = 0  # keep the last N as ckpt-<iter>.pt
ckpt_every_tokens: Setting(NOT_NEGATIVE) = 0  # keep ckpt-tok<tokens>-val<loss>.pt each N tokens (0: off)
async_save: Setting(unused=schedule.saves_in_step) = False  # True: saved from a copy in RAM while training goes on
init_from: Setting() = 'scratch'  # 'scratch' or 'resume' or 'gpt2*' (or a transformers GPT-2 or Llama folder)
# wandb logging
wandb_log: Setting() = False  # every row of log.jsonl to Weights & Biases too
wandb_project: Setting() = 'owt'  # the W&B project
wandb_run_name: Setting() = 'gpt2'  # the run's name there
# data
dataset: Setting((), TRAINING, settings.label_only) = 'openwebtext'  # data/<dataset>/: train.bin and val.bin, or shards
data_dir: Setting(resume=TRAINING) = ''  # '' means data/<dataset> beside this script
gradient_accumulation_steps: Setting(POSITIVE, TRAINING, schedule.batch_in_tokens) = 5 * 8  # over all processes
total_batch_size: Setting(at_least(0, "0 (gradient_accumulation_steps) or more"), TRAINING) = 0  # or tokens a step
batch_size: Setting(POSITIVE, TRAINING) = 12  # micro-batch size
block_size: Setting(POSITIVE, MODEL) = 1024  # the context: tokens a sequence
# model (GPTConfig's other fields, model.py, are settings too: family, n_kv_head, qk_norm, ...)
n_layer: Setting(POSITIVE, MODEL) = 12  # transformer blocks
n_head: Setting(POSITIVE, MODEL) = 12  # attention heads (n_embd must divide by it)
n_embd: Setting(POSITIVE, MODEL) = 768  # the width
dropout: Setting(FRACTION, TRAINING) = 0.0  # for pretraining 0 is good, for finetuning try 0.1+
bias: Setting(resume=MODEL) = False  # do we use bias inside LayerNorm and Linear layers?
# the optimizer (Muon's settings: gpt/optim/muon.py)
optimizer: Setting(resume=kept(optim.KEPT)) = 'adamw'  # 'adamw' (nanoGPT's) or 'muon' (and AdamW: gpt/optim/)
learning_rate: Setting(POSITIVE, TRAINING) = 6e-4  # max learning rate
max_iters: Setting(NOT_NEGATIVE, TRAINING) = 600000  # total number of training iterations
max_tokens: Setting(at_least(0, "0 (max_iters) or more"), TRAINING) = 0  # or a token budget, which sets max_iters
weight_decay: Setting(NOT_NEGATIVE, TRAINING) = 1e-1  # AdamW's, of matrices and embeddings only
beta1: Setting(FRACTION, TRAINING) = 0.9  # AdamW's moment decay rates
beta2: Setting(FRACTION, TRAINING) = 0.95  # 0.99 is common for small models and batches
grad_clip: Setting(at_least(0, "0 (off) or more"), TRAINING) = 1.0  # clip gradients at this value, or off if 0.0
max_nonfinite_steps: Setting(POSITIVE) = 10  # stop after N steps in a row skipped for a NaN/inf
# learning rate decay settings
decay_lr: Setting(resume=TRAINING) = True  # False: learning_rate at every step, without warm-up (as nanoGPT)
warmup_iters: Setting(NOT_NEGATIVE, TRAINING, schedule.no_warmup) = 2000  # how many steps to warm up for
lr_decay_iters: Setting(NOT_NEGATIVE, TRAINING, schedule.no_decay_iters) = 600000  # ~= max_iters per Chinchilla
warmup_tokens: Setting(at_least(0, "0 (warmup_iters) or more"), TRAINING, schedule.no_warmup) = 0  # or tokens
lr_decay_tokens: Setting(at_least(0, "0 (lr_decay_iters) or more"), TRAINING, schedule.no_decay_iters) = 0  # or tokens
min_lr: Setting(NOT_NEGATIVE, TRAINING, schedule.no_min_lr) = 6e-5  # ~= learning_rate/10 per Chinchilla
lr_schedule: Setting(resume=TRAINING, unused=schedule.no_schedule) = 'cosine'  # 'cosine', 'constant' or 'wsd'
lr_decay_frac: Setting(schedule.DECAY_FRAC, TRAINING, schedule.no_decay_frac) = 0.2  # wsd: the decay's share
# distributed settings (DDP's and FSDP2's own: gpt/runtime/distributed.py)
parallelism: Setting() = 'ddp'  # 'ddp': a whole copy per GPU; 'fsdp': FSDP2 shards weights, grads, optimizer
activation_checkpointing: Setting() = False  # recompute activations in the backward: less memory, more compute
# system
device: Setting() = 'auto'  # 'auto', 'cuda', 'cuda:1', 'cpu' or 'mps'; auto picks the best one present
dtype: Setting(resume=TRAINING) = 'auto'  # 'float32', 'bfloat16' or 'float16'; auto: bf16 where the GPU has it
init_device: Setting(hardware.INIT_DEVICES) = 'device'  # new weights drawn on 'device' or 'cpu' (nanoGPT's)
compile: Setting() = True  # use PyTorch 2.0 to compile the model to be faster
fused_loss: Setting() = False  # True: the loss a chunk at a time, without the (B, T, vocab) logits
cuda_graph: Setting() = False  # True: step and evaluations as CUDA graphs (a CUDA GPU; torchrun: ddp_sync='hooks')
cudnn_attention: Setting() = True  # False: never cuDNN's attention kernel (flash instead): a shorter cold start
seed: Setting(SEED, kept("the run's random streams go on from the checkpoint")) = 1337  # weights, data, dropout
# -----------------------------------------------------------------------------
# the settings of the model's other switches, Muon, in-training samples and HellaSwag, DDP/FSDP2 and the
# dashboard are declared with their code
config = configurator.apply(globals(), sys.argv[1:], GPTConfig.settings(), muon.SETTINGS, evaluation.SETTINGS,
                            distributed.SETTINGS, server.SETTINGS)
# -----------------------------------------------------------------------------
# The run is decided before anything is touched (gpt/training/plan.py): every check that can fail runs, and from
# here on the script reads the run from the plan: run.X, each setting as the run uses it and what follows from it
run, source = plan.make(config)
dispatch.compile_ahead(compilers, GPTConfig(**run.model), (run.micro_batch, run.eval_batch), run.dtype, run.device,
                       run.compile)  # the kernels the run will call, sent to the compilers
startup.part('plan')
distributed.init_process(run.device, run.backend, run.dist_timeout_minutes)  # torchrun: join the group
if run.torchrun:
    startup.part('process group')


def loader(split, stream):
    """Sequential over shards or random windows of train.bin/val.bin, every id checked to be in the vocabulary."""
    train = stream == 0  # an evaluation's batches are one process's on every rank (gpt/training/evaluation.py)
    return make_loader(run.data_dir, split, run.micro_batch if train else run.eval_batch, run.block_size, run.device,
                       run.vocab_size, run.token_dtype, run.seed, run.rank * train, run.world_size if train else 1,
                       stream, run.prepare_hint, run.micro_steps if train else 1)


train_loader = loader('train', stream=0)
loader('val', stream=1)  # check the val split now, not at the first evaluation
startup.part('data')
tokenizer = get_tokenizer(run.meta) if (run.sample_interval or run.hellaswag_interval) else None
if run.master:
    if not run.writes:
        print(f"eval_only: the losses are printed; nothing is written to {run.out_dir}")
    print(f"tokens per iteration will be: {run.tokens_per_iter:,}")
serve = run.dashboard and run.writes and run.master  # the port is taken now: one in use is refused here
dashboard = server.make_server(run.out_dir, run.dashboard_port, training=True) if serve else None

# -----------------------------------------------------------------------------
# side effects, now that nothing can be refused: out_dir claimed (an earlier run's files moved aside), downloads
claim = None
if run.master and run.writes:
    claim = rundir.claim(run.out_dir, fresh=run.init != 'resume')
    errors.on_failure(claim.undo)  # a run that fails before its first step leaves out_dir as it found it
if run.hellaswag_interval:
    hellaswag_examples = distributed.rank_zero_first(hellaswag_eval.load_examples)  # rank 0 downloads the file
torch.manual_seed(run.seed + run.rank)  # each process gets a different seed
torch.set_float32_matmul_precision('high')  # allow tf32 on matmul (a no-op on CPUs)
hardware.attention_kernels(cudnn=run.cudnn_attention)
ctx = hardware.autocast(run.device_type, run.dtype)
print({'scratch': "Initializing a new model from scratch", 'resume': f"Resuming training from {source.name}",
       'pretrained': f"Initializing from pretrained weights: {run.init_from}"}[run.init])
model = plan.build_model(run, source, run.seed)  # downloads GPT-2's weights for init_from=gpt2*
model.to(run.device)
dispatch.precompile(model, (run.micro_batch, run.eval_batch), run.dtype, run.compile, compilers)  # loaded, or compiled
scaler = torch.amp.GradScaler(run.device_type, enabled=(run.dtype == 'float16'))  # a no-op but for float16

# compile the model, and spread it over the processes: DDP or FSDP2
raw_model = model  # the unwrapped model: its state dict has no prefixes, and it estimates MFU
if run.activation_checkpointing:
    distributed.checkpoint_activations(raw_model)
startup.part('model')
model = distributed.wrap(model, run.parallelism if run.torchrun else 'ddp', run.device_type, run.local_rank,
                         run.dtype, run.compile, **distributed.wrap_args(run.settings))
if run.compile or run.torchrun:  # compile imports torch._dynamo; DDP broadcasts the weights (and imports it too)
    startup.part(' and '.join(['torch.compile'] * run.compile + [run.parallelism.upper()] * run.torchrun) + ' set-up')
eval_model = distributed.unwrap(model)  # HellaSwag calls the compiled model directly (no gradient sync needed)

# the optimizer the plan names: made after sharding, since FSDP2 replaces the parameters with sharded ones
opt = optim.build(raw_model, run.optimizer, run.device_type)

# the rest of the training state (a resumed run's is where its checkpoint left it), and the log
log = TrainLog(run.out_dir, enabled=run.master and run.writes)
state = checkpoint.restore(source.checkpoint, model, opt, scaler, train_loader, log, run.rank, run.world_size)
saver = checkpoint.Saver(run.out_dir, claim, source.checkpoint,  # the last good checkpoint, divergence, ownership
                         keep_best=not (run.always_save_checkpoint or run.checkpoint_interval or run.sharded),
                         background=run.async_save and not run.sharded)
iter_num, best_val_loss = state['iter_num'], state['best_val_loss']
nonfinite = step.NonFinite(run.max_nonfinite_steps, state['skipped_steps'])  # updates skipped for a NaN/inf
if iter_num >= run.max_iters and not run.eval_only:
    print(f"nothing to train: the checkpoint is at step {iter_num:,}, max_iters={run.max_iters:,} (raise --max_iters "
          f"or --max_tokens to train on)")
source = None  # free up memory (a checkpoint's tensors)

# the whole training step as one CUDA graph (gpt/training/stepgraph.py), where the plan says it can be
step_graph = stepgraph.StepGraph(model, opt, ctx, run.grad_clip, run.micro_steps, run.micro_batch, run.block_size,
                                 run.device, scaler=scaler, warmups=3 if run.compile else 1) if run.cuda_graph else None
startup.part('optimizer and state')


def elapsed():
    """Seconds of training so far, the earlier launches of a resumed run included."""
    return state['elapsed'] + time.time() - _launch_time


def save(name=None):
    """out_dir/ckpt.pt (or, under fsdp, the sharded ckpt_dcp/): everything a resumed run needs to go on
    exactly as this one would. With a name: that file instead, kept beside ckpt.pt. Returns whether it wrote it
    (async_save: whether it is writing it)."""
    return saver.save(raw_model if not run.sharded else model, opt, run.sharded, name, run.keep_checkpoints,
                      model_args=raw_model.config.checkpoint_args(), iter_num=iter_num, tokens=run.tokens_at(iter_num),
                      best_val_loss=best_val_loss, config=dict(run.settings), scaler=scaler.state_dict(),
                      train_loader=train_loader.state_dict(), dataset_meta=dict(run.meta) if run.meta else None,
                      log_position=log.position(), elapsed=elapsed(), skipped_steps=nonfinite.skipped,
                      wandb_run_id=state['wandb_run_id'], plan=run.record())


def evaluate(due):
    """The losses (and HellaSwag) that are due, printed and logged; returns them."""
    row = {}
    if due.loss:
        losses = evaluation.estimate_loss(model, lambda split: loader(split, stream=1), run.eval_iters, ctx, run.device,
                                          stop.check, step_graph and step_graph.eval_loss)  # a signal abandons it
        row.update(train_loss=losses['train'], val_loss=losses['val'], perplexity=math.exp(min(losses['val'], 700)))
    if due.hellaswag:
        hs = hellaswag_eval.evaluate(eval_model, hellaswag_examples, tokenizer, run.device, ctx, run.rank,
                                     run.world_size, progress=True, stop=stop.check)  # a bar on rank 0
        row.update(hellaswag=hs['acc_norm'], hellaswag_acc=hs['acc'])
    if run.master:
        print(f"step {iter_num}: " + ", ".join(f"{k.replace('_', ' ')} {v:.4f}" for k, v in row.items())
              + f", {time.time() - _launch_time:.1f}s since launch")
        log.write(kind='eval', step=iter_num, tokens=run.tokens_at(iter_num), time=elapsed(),
                  percent=100 * iter_num / max(run.max_iters, 1), **row)
    return row


def micro_batches():
    """This step's micro-batches; the next is read (and copied to the GPU) once the GPU has work: after the one
    handed over is queued, the next step's after the last backward (or the graph's replay)."""
    global X, Y
    for _ in range(run.micro_steps):
        yield X, Y
        X, Y = train_loader.next_batch()


def finish(stopped=False):
    """The end of a run, done or stopped by a signal (between steps or in an evaluation, abandoned: iter_num's state
    saved as it is, then exit): the totals, the page reads the last rows, the process group goes."""
    saved = stopped and run.writes and save()  # eval_only writes nothing
    saved = saver.wait() is not False and saved  # async_save: the last save ends (written or failed) before the end
    good = saver.good if saver.good and (saved or not stopped) else None  # a failed save is not resumed from
    then = (f"the same command plus --init_from=resume (and --out_dir={run.out_dir})" if stopped else
            f"python sample.py --out_dir={run.out_dir}") if good else None
    log.end(iter_num, run.tokens_at(iter_num), run.start_iter, run.start_tokens, elapsed(), time.time() - _launch_time,
            stopped, best_val_loss=best_val_loss if best_val_loss < 1e9 else None, checkpoint=good,
            best=saver.best_file(), next_command=then)
    if stopped and run.master and run.writes:
        print(f"stopped at iteration {iter_num}; " + (f"continue with {then}" if saved else
              f"its checkpoint was not written, so --init_from=resume would not start here: {saver.last_good()}"))
    if dashboard is not None:
        dashboard.finish()  # a page that is open reads the run's last rows before the server ends
    if run.torchrun:  # the DDP wrapper and the step's graph (its NCCL calls) go before the process group
        global model, step_graph
        del model, step_graph  # gpt/runtime/distributed.py's finish says why
        distributed.finish()
    if stopped:
        sys.exit(stop.exit_code)


# logging
if run.master:
    print(plan.config_line(run, config))  # what the plan decided; configurator said what files and flags set
    for line in run.notes:
        print(f"note: {line}")
log.write(kind='plan', step=iter_num, **run.record())  # each launch's plan, as its checkpoints record it
if run.wandb_log and run.master:
    log.wandb = start_wandb(run.wandb_project, run.wandb_run_name, dict(run.settings), state['wandb_run_id'])
    state['wandb_run_id'] = log.wandb.id
if dashboard is not None:
    server.start(dashboard)

# training loop
if claim is not None:
    claim.settle()  # the run starts: from here on a failure leaves its files (and the earlier run's aside) be
stop = StopRequest(run.device, then=lambda: finish(stopped=True))  # SIGTERM/SIGINT/SIGHUP: checkpoint and exit
X, Y = train_loader.next_batch()  # fetch the very first batch
t0 = time.time()
local_iter_num = 0  # number of iterations in the lifetime of this process
meter = step.StepMeter(log, raw_model, run)  # the step line and log row
while True:

    # determine and set the learning rate for this iteration
    lr = schedule.get_lr(iter_num, run.learning_rate, run.min_lr, run.warmup_iters, run.lr_decay_iters,
                         run.lr_schedule, run.lr_decay_frac, run.max_iters)
    step.set_lr(opt, lr)

    # evaluate the loss on train/val sets (and HellaSwag), draw samples, write checkpoints: whatever is due at
    # this step (at the end too, so the last model counts). A resumed run skips what its first step has done.
    due = schedule.due(iter_num, run.max_iters, run.eval_only, run.init == 'resume' and iter_num == run.start_iter,
                       run.eval_interval, run.hellaswag_interval, run.sample_interval, run.tokens_per_iter,
                       run.ckpt_every_tokens, run.checkpoint_interval, run.tokens_at(iter_num), run.eval_at_start)
    eval_start = time.time()
    row = evaluate(due) if due.loss or due.hellaswag else {}
    if 'val_loss' in row:  # a NaN, or a loss far above the best and the untrained model's: nothing is saved
        saver.record_eval(iter_num, row['val_loss'], best_val_loss)
    saves = saver.to_save(iter_num, due, row.get('val_loss'), best_val_loss, run.eval_only,
                          run.always_save_checkpoint, run.checkpoint_interval)
    best_val_loss = min(best_val_loss, row.get('val_loss', best_val_loss))
    for name in saves:
        save(name)
    if due.samples and (run.master or run.sharded):  # under fsdp every rank takes part in each forward pass
        texts = evaluation.draw_samples(raw_model, tokenizer, tokenizer.encode(run.sample_prompt),
                                        run.num_samples_train, run.sample_max_tokens, ctx, run.device,
                                        run.seed + iter_num, top_p=run.sample_top_p)
        for text in texts if run.master else []:
            print(f"sample {iter_num}: {text!r}")
        log.write(kind='sample', step=iter_num, tokens=run.tokens_at(iter_num), time=elapsed(), samples=texts)
    if run.eval_only or due.last:
        break

    step_start = time.time()
    if local_iter_num == 0:  # where the time from launch to here went, on one line
        startup.part('first evaluation')  # and whatever else step 0 does before it trains (a save, samples)
        log.write(kind='startup', step=iter_num, **startup.row())
        print(startup.line(run.compile))  # rank 0's: the others print nothing (gpt/runtime/errors.py)
    # forward, backward and update over the micro-batches (gpt/training/step.py), the same function replayed
    # from a CUDA graph where the plan says so; a NaN/inf loss or gradient skips the update
    if step_graph is not None:
        loss_sum, grad_norm = step_graph.run(micro_batches())
    else:
        loss_sum, grad_norm = step.train_step(model, opt, scaler, micro_batches(), run.micro_steps, ctx, run.grad_clip)
    grad_norm = float(grad_norm)  # the same on every rank
    nonfinite.check(grad_norm, iter_num, saver.last_good, run.master)

    # timing and logging: the step's time (tok/s, eta) leaves out this iteration's evaluation, saves and samples
    t1 = time.time()
    dt, t0 = t1 - t0 - (step_start - eval_start), t1
    if iter_num % run.log_interval == 0:  # every rank: the loss is averaged over them (a CPU-GPU sync point)
        meter.step(iter_num, local_iter_num, float(loss_sum), lr, grad_norm, dt, nonfinite.skipped, elapsed())
    if local_iter_num == 0 and run.master and (  # a config far too big for this device: say so at once
            warning := hardware.pace_warning(time.time() - step_start, run.max_iters - iter_num - 1, run.device_type)):
        print(warning, flush=True)
    iter_num += 1
    local_iter_num += 1

    stop.check()  # preemption: the step is done; checkpoint it and leave

finish()
saver.check_end()  # a run whose last save failed, or that ended diverged, does not end with status 0
