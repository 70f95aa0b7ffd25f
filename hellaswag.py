"""
HellaSwag accuracy of a checkpoint or a pretrained model, scored as in build-nanogpt (docs/fineweb.md#hellaswag).
The scoring is gpt/training/hellaswag_eval.py's, which train.py also uses during training.

$ python hellaswag.py --init_from=gpt2
$ torchrun --standalone --nproc_per_node=8 hellaswag.py --init_from=gpt2-xl"""
import sys

import torch
import torch.distributed as dist

import configurator
from gpt.checkpoint import load_model
from gpt.data.tokenizer import get_tokenizer
from gpt.runtime import distributed, errors, hardware
from gpt.runtime.settings import POSITIVE, Setting, at_least, check
from gpt.training.hellaswag_eval import evaluate, load_examples
from gpt.training.plan import check_init_folder

SETTINGS = dict(
    init_from=Setting(default='resume', doc="'resume' (from out_dir), a gpt2 variant (e.g. 'gpt2-xl') or a "
                      "transformers folder"),
    out_dir=Setting(default='out', doc="ignored if init_from is not 'resume'"),
    device=Setting(default='auto', doc="'auto', 'cpu', 'cuda', 'cuda:0', 'mps'; under torchrun each rank takes its "
                   "own GPU"),
    dtype=Setting(default='auto', doc="'float32', 'bfloat16' or 'float16'; auto: bf16 on GPUs that have it"),
    compile=Setting(default=False, doc="torch.compile the model"),
    path=Setting(default='', doc="hellaswag_val.jsonl or its folder; '' = $HELLASWAG_DIR or "
                 "~/.cache/nanogpt/hellaswag"),
    limit=Setting(at_least(0, "0 (all examples) or more"), default=0, doc="evaluate only the first N examples (0 = "
                  "all 10,042), for quick checks"),
    batch_examples=Setting(POSITIVE, default=8, doc="examples per forward (4 rows each)"),
)


def main(argv):
    errors.install()
    s = configurator.apply({'__file__': __file__}, argv, SETTINGS)
    check_init_folder(s['init_from'])
    check(s, s.declared)  # values that are the right type but make no sense: one line each

    torch.set_float32_matmul_precision('high')  # allow tf32 on matmul
    device = hardware.resolve_device(s['device'])
    ddp, rank, _, world_size, device = distributed.init_process(device, '', timeout_minutes=10)  # under torchrun
    device_type = device.split(':')[0]
    ctx = hardware.autocast(device_type, hardware.resolve_dtype(s['dtype'], device_type))

    examples = distributed.rank_zero_first(lambda: load_examples(s['path'] or None))  # rank 0 downloads
    examples = examples[:s['limit'] or None]  # limit 0: all

    model, meta = load_model(s['init_from'], s['out_dir'])
    tokenizer = get_tokenizer(meta)  # no metadata means GPT-2 BPE, as in nanoGPT
    model = hardware.maybe_compile(model.to(device), s['compile'], device_type)
    result = evaluate(model, examples, tokenizer, device, ctx, rank, world_size, s['batch_examples'], progress=True)
    if rank == 0:
        print(f"HellaSwag acc_norm: {result['acc_norm']:.4f}  acc: {result['acc']:.4f}  ({result['n']} examples)")
    if ddp:
        dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1:])
