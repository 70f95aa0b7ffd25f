"""Turn a sharded checkpoint (written by parallelism=fsdp into out_dir/ckpt_dcp/) into one ckpt.pt that sample.py,
hellaswag.py, export and nanoGPT-style tools read. Runs in one process, no GPU needed; a folder that is not a whole
checkpoint (shard files missing or cut short) is one line before any work.
$ python convert_checkpoint.py --out_dir=out"""
import sys

import configurator
from gpt.checkpoint import convert_sharded
from gpt.runtime import errors

out_dir = 'out'  # holds ckpt_dcp/; ckpt.pt is written beside it
errors.install()
configurator.apply(globals(), sys.argv[1:])
if not out_dir:
    raise errors.UserError("out_dir is empty: name the run folder that holds ckpt_dcp/")
sys.exit(0 if convert_sharded(out_dir) else 1)
