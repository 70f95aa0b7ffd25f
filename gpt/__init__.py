"""
The library behind the scripts at the top of the repository (train.py, sample.py, bench.py, export.py, ...),
one module per concern. model.py, the model itself, stays at the top, as in nanoGPT.

    errors       UserError and the one-line `error:` hook every script installs
    atomic       files written whole or not at all
    plan         the run plan: settings, machine, data and weights make every decision once, checked
    hardware     device and dtype choice, autocast, compile, peak FLOP/s for MFU
    distributed  torchrun's process group, DDP and FSDP2 wrapping, gradient sync
    checkpoint   ckpt.pt save/load (atomic, weights_only, checksums), sharded saves, resume, conversion
    rundir       out_dir: writable, locked for one run, an earlier run's files kept aside
    settings     checks of values that have the right type but make no sense
    data         token files (train.bin/val.bin, shards), dataset metadata, the prepare scripts' helpers
    loader       batches from the token files, with resumable positions
    tokenizer    GPT-2 BPE (tiktoken), characters, tokenizers-JSON files
    hf           the bridge to Hugging Face transformers, both directions, GPT-2 and Llama
    exportdir    export folders: never a user's folder overwritten, written whole or not at all
    generation   the KV cache and the (CUDA-graphed) one-token decode step
    schedule     learning-rate schedule, token budgets, a step's batch split over the processes
    optim        the optimizer a run names (AdamW, Muon), checked, built and resumed
    adamw        torch's AdamW without torch._dynamo's import (a second or more of a run's start-up)
    muon         the Muon optimizer for the blocks' matrices (AdamW for the rest), as one optimizer
    step         the training step: forward, backward, clip, update (skipped on a NaN), one function
    stepgraph    that step replayed from one CUDA graph
    evaluation   loss estimates and samples during training
    hellaswag    HellaSwag scoring (hellaswag.py and train.py use it)
    trainlog     the run's log.jsonl, and wandb
    dashboard    the live web page over log.jsonl (dashboard.py and train.py use it)
    preemption   SIGTERM / SIGINT / SIGHUP: checkpoint and exit
"""
