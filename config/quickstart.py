# The quick start: the shakespeare_char model, sized for the machine it runs on.
# On a GPU it is config/train_shakespeare_char.py as is (docs/benchmarks.md has its time);
# on a CPU it is a smaller model on shorter contexts so that it finishes in a few minutes.
# $ python train.py config/quickstart.py
import os

import torch

# beside this file, wherever train.py is run from (the configurator gives config files their __file__)
with open(os.path.join(os.path.dirname(__file__), 'train_shakespeare_char.py')) as _f:
    exec(_f.read())

if not torch.cuda.is_available():
    print("quickstart: no GPU found, training a small model on the CPU")
    device = 'cpu'
    compile = False
    cuda_graph = False
    fused_norm = False
    eval_iters = 20
    log_interval = 50
    block_size = 64
    batch_size = 12
    total_batch_size = 12 * 64  # one micro-batch of 12 a step
    n_layer = 4
    n_head = 4
    n_embd = 128
    max_iters = 2000
    lr_decay_iters = 2000
    dropout = 0.0
