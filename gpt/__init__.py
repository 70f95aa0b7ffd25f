"""
The library behind the scripts at the top of the repository (train.py, sample.py, bench.py, export.py, ...),
one package per concern. model.py, the model itself, stays at the top, as in nanoGPT.

    config       each setting's declaration and checks, and the run plan that decides a run once
    runtime      errors (the one-line `error:`), signals, files written safely, hardware, distributed
    data         token files and dataset metadata, loaders with resumable positions, tokenizers
    kernels      Triton kernels: the fused loss and the QK-norm + rotary kernel
    optim        the optimizers (AdamW, Muon) and how they group the parameters
    training     one training step (and its CUDA graph), the schedule, evaluation and HellaSwag
    checkpoint   ckpt.pt save/load (atomic, checksummed), the save policy, sharded saves, out_dir's claim
    generation   the KV cache and the (CUDA-graphed) one-token decode step
    hf           the bridge to Hugging Face transformers, both directions, and export folders
    monitor      the run's log.jsonl, wandb, and the live dashboard
"""
