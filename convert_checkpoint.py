"""
Turn a sharded checkpoint (written by parallelism=fsdp into out_dir/ckpt_dcp/) into one ckpt.pt that
sample.py, hellaswag.py, export and nanoGPT-style tools read. Runs in one process, no GPU needed.
$ python convert_checkpoint.py --out_dir=out
"""
import os
import sys
import tempfile

import torch
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

import configurator
import errors
import parallel
from checkpoint import model_from_checkpoint, save_checkpoint

out_dir = 'out'  # holds ckpt_dcp/; ckpt.pt is written beside it
errors.install()
configurator.apply(globals(), sys.argv[1:])

path = parallel.sharded_checkpoint(out_dir)
if path is None:
    raise errors.UserError(f"no sharded checkpoint in {out_dir} (looked for {parallel.DCP_DIR}/{parallel.TRAIN_STATE})")
state = parallel.load_train_state(path)
with tempfile.TemporaryDirectory(dir=out_dir) as tmp:
    dcp_to_torch_save(path, os.path.join(tmp, 'full.pt'))  # gathers every rank's shards
    full = torch.load(os.path.join(tmp, 'full.pt'), map_location='cpu', weights_only=True)
# the optimizer state stays behind: in DCP it is keyed by parameter name, not torch.optim's layout
ckpt = {**state, 'model': full['model']}
model_from_checkpoint(ckpt, path)  # check that the weights make the model its model_args describe
target = os.path.join(out_dir, 'ckpt.pt')
if save_checkpoint(ckpt, target):
    print(f"wrote {target} (step {state['iter_num']}; weights only, without the optimizer state)")
