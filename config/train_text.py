# a small model for your own text, prepared by data/text/prepare.py:
# $ python data/text/prepare.py --input my_texts/ --name mytext
# $ python train.py config/train_text.py --dataset=mytext --out_dir=out-mytext
# $ python sample.py --out_dir=out-mytext
# With a GPU, the shakespeare_char model (6 layers, 384 wide, context 256, dropout against overfitting a small
# corpus); on a CPU, config/quickstart.py's small model, which trains in minutes rather than hours.
import torch

out_dir = 'out-text'
dataset = 'text'  # set it to your --name: --dataset=mytext
eval_interval = 250
eval_iters = 50
log_interval = 10
always_save_checkpoint = False  # a small corpus overfits: keep the checkpoint of the best val loss

total_batch_size = 16_384  # 64 sequences of 256 a step, on any number of GPUs (two: 32 each)
batch_size = 64
block_size = 256  # at most prepare.py's --block_size (val holds one window of it)

n_layer = 6
n_head = 6
n_embd = 384
dropout = 0.2

learning_rate = 1e-3
max_iters = 2000
lr_decay_iters = 2000
min_lr = 1e-4
beta2 = 0.99
warmup_iters = 100

# a model this small is bound by launching kernels: replay each step from a CUDA graph (one CUDA GPU only)
# rather than compile (as config/train_shakespeare_char.py)
cuda_graph = True
compile = False

if not torch.cuda.is_available():  # config/quickstart.py's CPU model (tests/test_batch.py holds them equal)
    print("train_text: no GPU found, training a small model on the CPU")
    device = 'cpu'
    cuda_graph = False
    eval_iters = 20
    log_interval = 50
    block_size = 64
    batch_size = 12
    total_batch_size = 12 * 64  # one micro-batch of 12 a step
    n_layer = 4
    n_head = 4
    n_embd = 128
    dropout = 0.0
