"""Export a checkpoint to a folder that transformers loads with AutoModelForCausalLM.from_pretrained(folder): weights in
safetensors plus the tokenizer, built locally (no network). What it writes, where, how it is checked: docs/export.md.

$ python export.py --out_dir=out                              # -> out/hf
$ python export.py --out_dir=out --export_dir=my-model --dtype=bfloat16
$ python export.py --out_dir=out --export_dir=my-model --force=True   # replace a folder that is not an export
"""
import json
import os
import sys

import torch
from tqdm import tqdm

import configurator
from gpt.checkpoint import checkpoint_meta, load_checkpoint, model_from_checkpoint, newer_sharded
from gpt.data.tokenizer import get_tokenizer
from gpt.hf import exportdir, model_card, to_hf, verify
from gpt.hf.tokenizer import hf_tokenizer, save_tokenizer
from gpt.runtime.errors import UserError, install
from gpt.runtime.files import atomic_write

DTYPES = {'float32': torch.float32, 'bfloat16': torch.bfloat16, 'float16': torch.float16}


def main(argv):
    install()
    settings = dict(
        out_dir='out',  # the run folder, holding ckpt.pt
        export_dir='',  # where the transformers folder goes; '' = <out_dir>/hf
        dtype='float32',  # of the exported weights: float32, bfloat16 or float16
        verify=True,  # load the folder back with transformers and compare logits and tokens with ours
        force=False,  # replace export_dir even if it holds files that are not an earlier export
    )
    s = configurator.apply(settings, argv)
    if s['dtype'] not in DTYPES:
        raise UserError(f"dtype must be one of {', '.join(DTYPES)}, not {s['dtype']!r}")
    export_dir = s['export_dir'] or os.path.join(s['out_dir'], 'hf')
    path = os.path.join(s['out_dir'], 'ckpt.pt')
    exportdir.check(export_dir, force=s['force'], keep=(path, os.getcwd()))
    sharded = newer_sharded(s['out_dir'])  # a ckpt.pt beside it would be an older state of the run
    if sharded or (not os.path.exists(path) and os.path.isdir(os.path.join(s['out_dir'], 'ckpt_dcp'))):
        raise UserError(f"{s['out_dir']}'s newest checkpoint is the sharded (fsdp) {sharded or 'ckpt_dcp'}: make a "
                        f"ckpt.pt of it first with `python convert_checkpoint.py --out_dir={s['out_dir']}`")

    # a big model takes minutes (building it twice, writing, reading back): a terminal shows the stage
    stages = tqdm(total=4 if s['verify'] else 3, unit="stage", disable=None)
    stages.set_description("reading the checkpoint")
    ckpt = load_checkpoint(path)
    import transformers  # here, not at the top: it is slow to import, and nothing above needs it
    if not sys.stderr.isatty():
        transformers.utils.logging.disable_progress_bar()  # quiet in logs and CI, like our own bars
    model = model_from_checkpoint(ckpt, path).eval()
    tokenizer = get_tokenizer(checkpoint_meta(ckpt, path))  # no metadata means GPT-2 BPE, as in nanoGPT
    if s['dtype'] != 'float32':
        # round our weights as the export will, so the check compares like with like
        with torch.no_grad():
            for p in model.parameters():
                p.copy_(p.to(DTYPES[s['dtype']]).float())

    stages.update()
    stages.set_description("converting")
    hf_config, state_dict = to_hf(model)  # what transformers cannot express is refused here, before writing
    hf_tok = hf_tokenizer(tokenizer, model.config.block_size, model.config.vocab_size)
    # a character vocabulary gets an end-of-text token only where the model has a spare id (docs/export.md)
    if hf_tok.pad_token is None:
        tqdm.write(f"note: every one of the model's {model.config.vocab_size} ids is a character, so the export "
                   f"has no end-of-text or pad token and generates one prompt at a time (docs/export.md)")
    hf_config.bos_token_id = hf_tok.bos_token_id
    hf_config.eos_token_id = hf_config.pad_token_id = hf_tok.eos_token_id
    hf_model = transformers.AutoModelForCausalLM.from_config(hf_config)
    missing, unexpected = hf_model.load_state_dict(state_dict, strict=False)
    missing = [k for k in missing if not k.endswith((".attn.bias", ".attn.masked_bias"))]  # old causal-mask buffers
    assert not missing and not unexpected, f"export bug: missing {missing[:5]}, unexpected {unexpected[:5]}"
    hf_model.to(DTYPES[s['dtype']])
    generation = hf_model.generation_config
    generation.bos_token_id, generation.eos_token_id = hf_config.bos_token_id, hf_config.eos_token_id
    generation.pad_token_id = hf_config.pad_token_id
    # a call that gives no length stops at the context, not past it (docs/export.md: Context length)
    generation.max_length = model.config.block_size
    if tokenizer.vocab_size < hf_config.vocab_size:
        # the padding ids were never data: transformers' generate must not pick them (sample.py never does)
        generation.suppress_tokens = list(range(tokenizer.vocab_size, hf_config.vocab_size))
    weights = {t.untyped_storage().data_ptr(): t.nbytes for t in hf_model.state_dict().values()}  # tied: once
    exportdir.check_space(export_dir, sum(weights.values()))
    stages.update()
    stages.set_description("writing")
    tqdm.write(f"writing {type(hf_model).__name__} ({s['dtype']}) to {export_dir}")
    with exportdir.writing(export_dir) as folder:  # in place only once written and checked
        hf_model.save_pretrained(folder)
        save_tokenizer(hf_tok, folder)
        with atomic_write(os.path.join(folder, 'README.md'), 'w', encoding='utf-8') as f:
            f.write(model_card(ckpt, hf_config, s['dtype']))
        stages.update()
        if s['verify']:
            stages.set_description("checking")
            verify(model, folder, tokenizer)
            stages.update()
    stages.set_description("exported")
    stages.close()
    print(f"done: AutoModelForCausalLM.from_pretrained({json.dumps(export_dir)})")


if __name__ == "__main__":
    main(sys.argv[1:])
