"""Sample from a trained model (a checkpoint in out_dir) or from OpenAI's GPT-2 weights.
$ python sample.py --out_dir=out-shakespeare-char
$ python sample.py --init_from=gpt2-xl --start="What is the answer to life?" --num_samples=3"""
from gpt.runtime import errors  # first: a mistake, or Ctrl-C while torch loads, is one line (gpt/runtime/errors.py)

errors.install()

import os
import sys

import torch
from tqdm import tqdm

import configurator
from gpt import generation
from gpt.checkpoint import load_model
from gpt.data.tokenizer import get_tokenizer
from gpt.runtime import hardware, settings
from gpt.runtime.settings import NUCLEUS, POSITIVE, SEED, Setting, at_least, greedy
from gpt.training.plan import check_init_folder

# -----------------------------------------------------------------------------
init_from: Setting() = 'resume'  # 'resume' (from an out_dir), a gpt2 variant (e.g. 'gpt2-xl') or a transformers folder
out_dir: Setting(unused=settings.not_resumed) = 'out'  # ignored if init_from is not 'resume'
start: Setting() = "\n"  # or "<|endoftext|>" or etc. Can also specify a file, use as: "FILE:prompt.txt"
num_samples: Setting(POSITIVE) = 10  # number of samples to draw
max_new_tokens: Setting(POSITIVE) = 500  # number of tokens generated in each sample
temperature: Setting(at_least(0, "0 (greedy) or more")) = 0.8  # < 1.0 less random, > 1.0 more; 0 = greedy
top_k: Setting(at_least(0, "0 (all tokens) or more"), unused=greedy) = 200  # draw from the top_k likeliest; 0 = all
top_p: Setting(NUCLEUS, unused=greedy) = 1.0  # nucleus sampling (e.g. 0.9): the likeliest tokens up to top_p; 1.0 = all
stop_at_eot: Setting() = False  # end each sample at the tokenizer's end-of-text token, where it has one
seed: Setting(SEED) = 1337
device: Setting() = 'auto'  # 'auto', 'cpu', 'cuda', 'cuda:0', 'mps'
dtype: Setting() = 'auto'  # 'float32', 'bfloat16' or 'float16'; auto: bf16 on GPUs that have it
compile: Setting() = False  # compile the one-token decode step: faster per token, once it has compiled
# -----------------------------------------------------------------------------
config = configurator.apply(globals(), sys.argv[1:])  # overrides from command line or config file
check_init_folder(config['init_from'])
settings.check(config, config.declared)
for line in settings.notes(config, config.declared):  # settings given that the others make do nothing
    print(f"note: {line}")
# -----------------------------------------------------------------------------

# the prompt, read before anything loads: a mistake in it is found at once
if start.startswith('FILE:'):
    path = os.path.expanduser(start[5:])  # FILE:~/prompt.txt: no shell expands a ~ after --start=
    if os.path.isdir(path):
        raise errors.UserError(f"prompt file {path} is a folder (from start=FILE:{path}): name a text file")
    if not os.path.isfile(path):
        raise errors.UserError(f"prompt file {path} not found (from start=FILE:{path})")
    try:
        with open(path, 'r', encoding='utf-8') as f:
            start = f.read()
    except UnicodeDecodeError as e:
        raise errors.UserError(f"prompt file {path} is not UTF-8 text (byte {e.start}): save it as UTF-8")
    except OSError as e:
        raise errors.UserError(f"prompt file {path} could not be read ({e.strerror or e})")

torch.manual_seed(seed)
# no TF32: bf16/fp16 generation does not use it, and dtype=float32 asks for float32 (whose greedy decoding
# gives exactly the uncached path's tokens; docs/benchmarks.md)
device = hardware.resolve_device(device)
device_type = device.split(':')[0]
dtype = hardware.resolve_dtype(dtype, device_type)

# model, and the tokenizer of the data it was trained on (a transformers folder's own tokenizer.json)
model, meta = load_model(init_from, out_dir)
tokenizer = get_tokenizer(meta)  # no metadata means GPT-2 BPE, as in nanoGPT
print(f"tokenizer: {tokenizer.name} ({tokenizer.vocab_size} tokens)")
eot = tokenizer.eot if stop_at_eot else None
if stop_at_eot and eot is None:
    print("stop_at_eot: this tokenizer has no end-of-text token, so each sample runs to max_new_tokens")

model.eval().to(device)
# on a GPU the weights themselves become bf16 (fp16): autocast would cast float32 ones again every token
ctx = hardware.for_generation(model, device_type, dtype)
# compile the one-token decode step (its shapes stay fixed; the prompt runs once, eagerly)
if compile_step := hardware.can_compile(compile, device_type):
    print("compiling the decode step at the first new token (~10-20 s)")

if not (start_ids := tokenizer.encode(start)):
    raise errors.UserError("the prompt is empty: give at least one token with --start=...")
x = torch.tensor(start_ids, dtype=torch.long, device=device)[None, ...]

# a progress bar over the tokens when there are many to wait for (only on a terminal: disable=None);
# generate() calls progress once per new token (on CUDA its steps are graph replays, not forward calls)
bar = tqdm(total=num_samples * max_new_tokens, unit='tok', leave=False,
           disable=None if num_samples * max_new_tokens >= 1000 else True)

with torch.no_grad(), ctx:
    for k in range(num_samples):
        y = model.generate(x, max_new_tokens, temperature=temperature, top_k=top_k or None,
                           top_p=top_p if top_p < 1 else None, eot=eot,
                           vocab_limit=tokenizer.vocab_size, progress=bar.update, compile_step=compile_step)
        ids = generation.until_eot(y[0].tolist(), eot, len(start_ids))  # up to the end of the text
        bar.update((k + 1) * max_new_tokens - bar.n)  # a sample that stopped early counts as done
        tqdm.write(tokenizer.decode(ids))  # print, but clear of the bar
        tqdm.write('---------------')
bar.close()
