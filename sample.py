"""
Sample from a trained model (a checkpoint in out_dir) or from OpenAI's GPT-2 weights.
$ python sample.py --out_dir=out-shakespeare-char
$ python sample.py --init_from=gpt2-xl --start="What is the answer to life?" --num_samples=3
"""
from gpt.runtime import errors  # first: a mistake, or Ctrl-C while torch loads, is one line (gpt/runtime/errors.py)

errors.install()

import os
import sys

import torch
from tqdm import tqdm

import configurator
from gpt import generation
from gpt.checkpoint import load_model
from gpt.config import settings
from gpt.data.tokenizer import folder_meta, get_tokenizer
from gpt.runtime import hardware

# -----------------------------------------------------------------------------
init_from = 'resume'  # either 'resume' (from an out_dir) or a gpt2 variant (e.g. 'gpt2-xl') or a transformers folder
out_dir = 'out'  # ignored if init_from is not 'resume'
start = "\n"  # or "<|endoftext|>" or etc. Can also specify a file, use as: "FILE:prompt.txt"
num_samples = 10  # number of samples to draw
max_new_tokens = 500  # number of tokens generated in each sample
temperature = 0.8  # 1.0 = no change, < 1.0 = less random, > 1.0 = more random; 0 = greedy
top_k = 200  # retain only the top_k most likely tokens, clamp others to have 0 probability; 0 = all
top_p = 1.0  # nucleus sampling: only the likeliest tokens whose probabilities sum to top_p (e.g. 0.9); 1.0 = all
stop_at_eot = False  # end each sample at the tokenizer's end-of-text token (<|endoftext|>), where it has one
seed = 1337
device = 'auto'  # 'auto', 'cpu', 'cuda', 'cuda:0', 'mps'
dtype = 'auto'  # 'float32', 'bfloat16' or 'float16'; auto: bf16 on GPUs that have it
compile = False  # compile the one-token decode step: faster per token, after compiling at the first
# -----------------------------------------------------------------------------
config = configurator.apply(globals(), sys.argv[1:])  # overrides from command line or config file
settings.check_sample(config)
for line in settings.inert_sample(config):  # settings given that the others make do nothing
    print(f"note: {line}")
# -----------------------------------------------------------------------------

# the prompt, read before anything loads: a mistake in it is found at once
if start.startswith('FILE:'):
    prompt_path = os.path.expanduser(start[5:])  # FILE:~/prompt.txt: no shell expands a ~ after --start=
    if os.path.isdir(prompt_path):
        raise errors.UserError(f"prompt file {prompt_path} is a folder (from start=FILE:{prompt_path}): name a "
                               f"text file")
    if not os.path.isfile(prompt_path):
        raise errors.UserError(f"prompt file {prompt_path} not found (from start=FILE:{prompt_path})")
    try:
        with open(prompt_path, 'r', encoding='utf-8') as f:
            start = f.read()
    except UnicodeDecodeError as e:
        raise errors.UserError(f"prompt file {prompt_path} is not UTF-8 text (byte {e.start}): save it as UTF-8")
    except OSError as e:
        raise errors.UserError(f"prompt file {prompt_path} could not be read ({e.strerror or e})")

torch.manual_seed(seed)
# no TF32: bf16/fp16 generation does not use it, and dtype=float32 asks for float32 (whose greedy decoding
# gives exactly the uncached path's tokens; docs/benchmarks.md)
device = hardware.resolve_device(device)
device_type = device.split(':')[0]
dtype = hardware.resolve_dtype(dtype, device_type)

# model, and the tokenizer of the data it was trained on
# a transformers folder's own tokenizer.json, where it has one: known (or refused) before the weights load
folder = None if init_from == 'resume' else folder_meta(init_from)
model, meta = load_model(init_from, out_dir)
meta = meta or folder
tokenizer = get_tokenizer(meta)  # no metadata means GPT-2 BPE, as in nanoGPT
print(f"tokenizer: {tokenizer.name} ({tokenizer.vocab_size} tokens)")
eot = tokenizer.eot if stop_at_eot else None
if stop_at_eot and eot is None:
    print("stop_at_eot: this tokenizer has no end-of-text token, so each sample runs to max_new_tokens")

model.eval()
model.to(device)
# on a GPU the weights themselves become bf16 (fp16): autocast would cast float32 ones again every token
ctx = hardware.for_generation(model, device_type, dtype)
# compile the one-token decode step (its shapes stay fixed; the prompt runs once, eagerly)
compile_step = hardware.can_compile(compile, device_type)
if compile_step:
    print("compiling the decode step at the first new token (~10-20 s)")

# encode the beginning of the prompt
start_ids = tokenizer.encode(start)
if not start_ids:
    raise errors.UserError("the prompt is empty: give at least one token with --start=...")
x = torch.tensor(start_ids, dtype=torch.long, device=device)[None, ...]

# a progress bar over the tokens when there are many to wait for (only on a terminal: disable=None);
# generate() calls progress once per new token (on CUDA its steps are graph replays, not forward calls)
bar = tqdm(total=num_samples * max_new_tokens, unit='tok', leave=False,
           disable=None if num_samples * max_new_tokens >= 1000 else True)

# run generation
with torch.no_grad():
    with ctx:
        for k in range(num_samples):
            y = model.generate(x, max_new_tokens, temperature=temperature, top_k=top_k or None,
                               top_p=top_p if top_p < 1 else None, eot=eot,
                               vocab_limit=tokenizer.vocab_size, progress=bar.update, compile_step=compile_step)
            ids = generation.until_eot(y[0].tolist(), eot, len(start_ids))  # up to the end of the text
            bar.update((k + 1) * max_new_tokens - bar.n)  # a sample that stopped early counts as done
            tqdm.write(tokenizer.decode(ids))  # print, but clear of the bar
            tqdm.write('---------------')
bar.close()
