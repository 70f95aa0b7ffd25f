"""
Export a checkpoint to a folder that transformers loads with AutoModelForCausalLM.from_pretrained(folder):
GPT2LMHeadModel for the GPT-2 family, LlamaForCausalLM for the llama family, weights in safetensors, plus
the tokenizer (GPT-2 BPE, the dataset's tokenizers JSON, or its characters) so that pipeline("text-generation") and
lm-evaluation-harness work on it. Everything is built locally: no network.

$ python export.py --out_dir=out                              # -> out/hf
$ python export.py --out_dir=out --export_dir=my-model --dtype=bfloat16

Afterwards the folder is checked: transformers loads it, and its logits and tokens must be ours.
A model whose vocabulary was padded (GPT-2: 50304 for the tokenizer's 50257) keeps its padded size, so the
weights are exactly ours; the padding ids are listed in generation_config.json's suppress_tokens, so
transformers' generate never picks them, just as sample.py never does.
"""
import json
import os
import sys

import torch
from tqdm import tqdm

import configurator
import errors
from checkpoint import load_checkpoint, model_from_checkpoint
from datafiles import read_meta
from errors import UserError
from tokenizer import GPT2_EOT, get_tokenizer, gpt2_encoding

DTYPES = {'float32': torch.float32, 'bfloat16': torch.bfloat16, 'float16': torch.float16}
# GPT-2 stores these as Conv1D weights, the transpose of a Linear's
CONV1D = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")


def gpt2_to_hf(model):
    """(GPT2Config, state dict for GPT2LMHeadModel) of a GPT-2-family model: the same tensors, Linear
    weights transposed to Conv1D's layout, and zero biases where ours have none (bias=False)."""
    from transformers import GPT2Config
    cfg = model.config
    C, hidden = cfg.n_embd, getattr(cfg, 'mlp_hidden', 0) or 4 * cfg.n_embd
    if getattr(cfg, 'n_kv_head', cfg.n_head) != cfg.n_head:
        raise UserError(f"transformers' GPT-2 has no grouped-query attention (n_kv_head={cfg.n_kv_head}, "
                        f"n_head={cfg.n_head}): this model cannot be exported as GPT2LMHeadModel")
    config = GPT2Config(vocab_size=cfg.vocab_size, n_positions=cfg.block_size, n_embd=C, n_layer=cfg.n_layer,
                        n_head=cfg.n_head, n_inner=hidden, activation_function="gelu_new",
                        layer_norm_epsilon=getattr(cfg, 'norm_eps', 1e-5), resid_pdrop=0.0, embd_pdrop=0.0,
                        attn_pdrop=0.0, tie_word_embeddings=getattr(cfg, 'tie_embeddings', True),
                        bos_token_id=None, eos_token_id=None)  # the tokenizer's, set by the caller
    state_dict = {k: v.t() if k.endswith(CONV1D) else v for k, v in model.state_dict().items()}
    if not cfg.bias:  # transformers' GPT-2 always has biases: zeros compute the same thing
        sizes = {"ln_1": C, "attn.c_attn": 3 * C, "attn.c_proj": C, "ln_2": C, "mlp.c_fc": hidden, "mlp.c_proj": C}
        for i in range(cfg.n_layer):
            for name, n in sizes.items():
                state_dict[f"transformer.h.{i}.{name}.bias"] = torch.zeros(n)
        state_dict["transformer.ln_f.bias"] = torch.zeros(C)
    return config, state_dict


def to_hf(model):
    """(transformers config, state dict) for the model's family."""
    family = getattr(model.config, 'family', 'gpt2')
    if family == 'gpt2':
        return gpt2_to_hf(model)
    if family == 'llama':
        from hf_convert import to_hf_llama
        return to_hf_llama(model)
    raise UserError(f"cannot export a model of family '{family}' (known: gpt2, llama)")


def gpt2_bpe_vocab_merges():
    """GPT-2's vocab and merges in transformers' byte-level form, rebuilt from tiktoken's ranks (so the local
    GPT2_TIKTOKEN_FILE is enough). Each merge is recovered by running BPE on the token's bytes with only
    the merges ranked below it: what is left are the two halves whose merge made the token."""
    from transformers.convert_slow_tokenizer import bytes_to_unicode
    ranks = gpt2_encoding()._mergeable_ranks
    byte_char = bytes_to_unicode()
    text = lambda token: "".join(byte_char[b] for b in token)

    def halves(token, rank):
        parts = [bytes([b]) for b in token]
        while len(parts) > 2:
            pairs = [(ranks.get(a + b, rank), i) for i, (a, b) in enumerate(zip(parts, parts[1:]))]
            best, i = min(pairs)
            if best >= rank:
                break
            parts[i:i + 2] = [parts[i] + parts[i + 1]]
        return parts

    vocab, merges = {}, []
    for token, rank in sorted(ranks.items(), key=lambda item: item[1]):
        vocab[text(token)] = rank
        if len(token) > 1:
            left, right = halves(token, rank)
            merges.append((text(left), text(right)))
    vocab["<|endoftext|>"] = GPT2_EOT
    return vocab, merges


def hf_tokenizer(tokenizer, block_size):
    """A transformers tokenizer that encodes and decodes as ours (tokenizer.Tokenizer) does."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    special = {}
    if tokenizer.name == 'gpt2':
        vocab, merges = gpt2_bpe_vocab_merges()
        tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False))
        # ByteLevel splits the text with GPT-2's own regex (tokenizer.GPT2_PAT), then maps bytes to characters
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        special = dict(unk_token="<|endoftext|>")
    elif tokenizer.name == 'char':
        # one token per character: split before every character, look each up, join them back without spaces
        tok = Tokenizer(models.WordLevel(vocab={ch: i for i, ch in enumerate(tokenizer.itos)}, unk_token=None))
        tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
        tok.decoder = decoders.Fuse()
    else:  # 'hf': the dataset's own tokenizers JSON, as it is
        tok = tokenizer.hf
    if tokenizer.eot is not None:  # documents are separated by it: it begins and ends each one
        special.update(bos_token=tok.id_to_token(tokenizer.eot), eos_token=tok.id_to_token(tokenizer.eot))
    return PreTrainedTokenizerFast(tokenizer_object=tok, model_max_length=block_size,
                                   clean_up_tokenization_spaces=False, **special)


def model_card(ckpt, hf_config, dtype):
    cfg = ckpt.get('config', {})
    lines = [
        "# Exported GPT checkpoint", "",
        f"Trained with a nanoGPT-style trainer: {type(hf_config).__name__.replace('Config', '')} architecture, "
        f"{hf_config.num_hidden_layers} layers, {hf_config.num_attention_heads} heads, width {hf_config.hidden_size}, "
        f"context {ckpt['model_args']['block_size']}, vocabulary {hf_config.vocab_size}; weights in {dtype}.",
        f"Dataset: {cfg.get('dataset', '?')}; step {ckpt.get('iter_num', '?')}; best validation loss "
        f"{float(ckpt.get('best_val_loss', float('nan'))):.4f}.", "",
        "```python",
        "from transformers import AutoModelForCausalLM, pipeline",
        "model = AutoModelForCausalLM.from_pretrained('.')",
        "generate = pipeline('text-generation', model='.')",
        "print(generate('Hello', max_new_tokens=50))",
        "```", "",
    ]
    return "\n".join(lines)


def verify(model, folder, tokenizer, tolerance=1e-4):
    """Load the folder back with transformers and compare: logits on a fixed batch (to `tolerance` of their
    largest magnitude), and the tokens of a text."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    hf_model = AutoModelForCausalLM.from_pretrained(folder).float().eval()
    generator = torch.Generator().manual_seed(0)
    x = torch.randint(0, tokenizer.vocab_size, (2, min(model.config.block_size, 64)), generator=generator)
    with torch.no_grad():
        ours = model(x, targets=x)[0]  # with targets: the logits of every position
        theirs = hf_model(x).logits
    diff = (ours - theirs).abs().max().item()
    if not diff <= tolerance * max(1.0, ours.abs().max().item()):
        raise RuntimeError(f"the exported model's logits differ from ours by up to {diff:.3g}: a bug in the export")
    text = "".join(tokenizer.itos[:20]) if tokenizer.name == 'char' else "Hello, I'm a language model,"
    if AutoTokenizer.from_pretrained(folder).encode(text, add_special_tokens=False) != tokenizer.encode(text):
        raise RuntimeError("the exported tokenizer encodes differently from ours: a bug in the export")
    tqdm.write(f"checked: transformers loads {folder}; its logits match ours (max abs difference {diff:.2g}), "
               f"and so do its tokens")


def main(argv):
    errors.install()
    settings = dict(
        out_dir='out',  # the run folder, holding ckpt.pt
        export_dir='',  # where the transformers folder goes; '' = <out_dir>/hf
        dtype='float32',  # of the exported weights: float32, bfloat16 or float16
        verify=True,  # load the folder back with transformers and compare logits and tokens with ours
    )
    s = configurator.apply(settings, argv)
    if s['dtype'] not in DTYPES:
        raise UserError(f"dtype must be one of {', '.join(DTYPES)}, not {s['dtype']!r}")
    export_dir = s['export_dir'] or os.path.join(s['out_dir'], 'hf')
    path = os.path.join(s['out_dir'], 'ckpt.pt')
    if not os.path.exists(path) and os.path.isdir(os.path.join(s['out_dir'], 'ckpt_dcp')):
        raise UserError(f"{s['out_dir']} holds a sharded (fsdp) checkpoint: make a ckpt.pt first with "
                        f"`python convert_checkpoint.py --out_dir={s['out_dir']}`")

    # a big model takes minutes (building it twice, writing, reading back): a terminal shows the stage
    stages = tqdm(total=4 if s['verify'] else 3, unit="stage", disable=None)
    stages.set_description("reading the checkpoint")
    ckpt = load_checkpoint(path)
    import transformers
    if not sys.stderr.isatty():
        transformers.utils.logging.disable_progress_bar()  # quiet in logs and CI, like our own bars
    model = model_from_checkpoint(ckpt, path).eval()
    meta = ckpt.get('dataset_meta')
    if meta is None and 'dataset' in ckpt.get('config', {}):
        # a nanoGPT checkpoint: the dataset's metadata is where nanoGPT keeps it
        meta = read_meta(os.path.join(os.path.dirname(os.path.abspath(__file__)), 'data', ckpt['config']['dataset']))
    tokenizer = get_tokenizer(meta)  # no metadata means GPT-2 BPE, as in nanoGPT
    if s['dtype'] != 'float32':
        # round our weights as the export will, so the check compares like with like
        with torch.no_grad():
            for p in model.parameters():
                p.copy_(p.to(DTYPES[s['dtype']]).float())

    stages.update()
    stages.set_description("converting")
    hf_config, state_dict = to_hf(model)
    # GPT-2's <|endoftext|> begins and ends documents; a character vocabulary has no such token
    hf_config.bos_token_id = hf_config.eos_token_id = tokenizer.eot
    hf_model = transformers.AutoModelForCausalLM.from_config(hf_config)
    missing, unexpected = hf_model.load_state_dict(state_dict, strict=False)
    missing = [k for k in missing if not k.endswith((".attn.bias", ".attn.masked_bias"))]  # old causal-mask buffers
    assert not missing and not unexpected, f"export bug: missing {missing[:5]}, unexpected {unexpected[:5]}"
    hf_model.to(DTYPES[s['dtype']])
    if tokenizer.vocab_size < hf_config.vocab_size:
        # the padding ids were never data: transformers' generate must not pick them (sample.py never does)
        hf_model.generation_config.suppress_tokens = list(range(tokenizer.vocab_size, hf_config.vocab_size))
    stages.update()
    stages.set_description("writing")
    tqdm.write(f"writing {type(hf_model).__name__} ({s['dtype']}) to {export_dir}")
    hf_model.save_pretrained(export_dir)
    hf_tokenizer(tokenizer, model.config.block_size).save_pretrained(export_dir)
    with open(os.path.join(export_dir, 'README.md'), 'w') as f:
        f.write(model_card(ckpt, hf_config, s['dtype']))
    stages.update()
    if s['verify']:
        stages.set_description("checking")
        verify(model, export_dir, tokenizer)
        stages.update()
    stages.set_description("exported")
    stages.close()
    print(f"done: AutoModelForCausalLM.from_pretrained({json.dumps(export_dir)})")


if __name__ == "__main__":
    main(sys.argv[1:])
