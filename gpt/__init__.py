"""
The library behind the scripts at the top of the repository (train.py, sample.py, bench.py, export.py, ...),
one package per concern. model.py, the model itself, stays at the top, as in nanoGPT.

    runtime      one-line errors, the settings' declarations and checks, signals, safe files, hardware, distributed
    data         token files and dataset metadata, loaders with resumable positions, tokenizers
    kernels      Triton kernels: the fused loss and the QK-norm + rotary kernel
    optim        the optimizers (AdamW, Muon) and how they group the parameters
    training     the run plan, the training step (and its CUDA graphs), the schedule, evaluation and HellaSwag
    checkpoint   ckpt.pt save/load (atomic, checksummed), the save policy, sharded saves, out_dir's claim
    generation   the KV cache and the (CUDA-graphed) one-token decode step
    hf           the bridge to Hugging Face transformers, both directions, and export folders
    monitor      the run's log.jsonl, wandb, and the live dashboard"""
