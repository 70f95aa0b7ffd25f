"""
The bridge to Hugging Face transformers, both directions, for both families:

    GPT-2 family  <->  GPT2LMHeadModel     (our Linear weights are its Conv1D weights, transposed)
    llama family  <->  LlamaForCausalLM    (ours fuse what Llama keeps apart - attn.c_attn is [q_proj; k_proj;
                                            v_proj], mlp.c_fc is [gate_proj; up_proj], stacked by rows - and our
                                            rotary embedding uses transformers' rotate_half layout, so no
                                            weight is permuted)

    config, state_dict = to_hf(model)                    # export.py: AutoModelForCausalLM.from_config(config)
    model_args, state_dict = load_pretrained(name)       # GPT.from_pretrained: GPT(GPTConfig(**model_args))

Import works on model_args dicts and state dicts, not on model objects, so model.py can call it without
this module importing model.py back. Export also writes the tokenizer and a model card (export.py).
"""
import os
import types

import torch
from tqdm import tqdm

from gpt.errors import UserError
from gpt.tokenizer import GPT2_EOT, gpt2_encoding

# GPT-2 stores these as Conv1D weights, the transpose of a Linear's
CONV1D = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")


# --- export: our model -> a transformers config and state dict

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


def _key_map(cfg):
    """[(our key, [(transformers key, rows), ...])]: each of our tensors is its transformers tensors stacked.
    cfg: a GPTConfig or a model_args dict."""
    if isinstance(cfg, dict):
        cfg = types.SimpleNamespace(**cfg)
    C, H, kv = cfg.n_embd, cfg.mlp_hidden, cfg.n_kv_head * (cfg.n_embd // cfg.n_head)
    pairs = [("transformer.wte.weight", [("model.embed_tokens.weight", cfg.vocab_size)]),
             ("transformer.ln_f.weight", [("model.norm.weight", C)]),
             ("lm_head.weight", [("lm_head.weight", cfg.vocab_size)])]
    for i in range(cfg.n_layer):
        ours, theirs = f"transformer.h.{i}.", f"model.layers.{i}."
        pairs += [(ours + "ln_1.weight", [(theirs + "input_layernorm.weight", C)]),
                  (ours + "ln_2.weight", [(theirs + "post_attention_layernorm.weight", C)])]
        for kind in ("weight", "bias") if cfg.bias else ("weight",):
            pairs += [
                (ours + f"attn.c_attn.{kind}", [(theirs + f"self_attn.{p}_proj.{kind}", n)
                                                for p, n in (("q", C), ("k", kv), ("v", kv))]),
                (ours + f"attn.c_proj.{kind}", [(theirs + f"self_attn.o_proj.{kind}", C)]),
                (ours + f"mlp.c_fc.{kind}", [(theirs + f"mlp.{p}_proj.{kind}", H) for p in ("gate", "up")]),
                (ours + f"mlp.c_proj.{kind}", [(theirs + f"mlp.down_proj.{kind}", C)]),
            ]
    return pairs


def llama_to_hf(model):
    """(transformers.LlamaConfig, state dict for LlamaForCausalLM) of a llama-family GPT. The tensors are
    views of the model's own (no copies); with tied embeddings lm_head.weight is embed_tokens.weight."""
    from transformers import LlamaConfig
    cfg = model.config
    if cfg.family != "llama":
        raise UserError(f"llama_to_hf needs a llama-family model, not family '{cfg.family}'")
    config = LlamaConfig(
        vocab_size=cfg.vocab_size, hidden_size=cfg.n_embd, intermediate_size=cfg.mlp_hidden,
        num_hidden_layers=cfg.n_layer, num_attention_heads=cfg.n_head, num_key_value_heads=cfg.n_kv_head,
        head_dim=cfg.n_embd // cfg.n_head, max_position_embeddings=cfg.block_size, rms_norm_eps=cfg.norm_eps,
        rope_theta=cfg.rope_theta, attention_bias=cfg.bias, mlp_bias=cfg.bias, hidden_act="silu",
        tie_word_embeddings=cfg.tie_embeddings)
    ours = model.state_dict()
    state_dict = {}
    for key, parts in _key_map(cfg):
        for (name, _), tensor in zip(parts, ours[key].split([n for _, n in parts])):
            state_dict[name] = tensor
    return config, state_dict


# the speedrun's switches (docs/speedrun.md) that transformers' GPT-2 and Llama do not compute, with their
# defaults; zero_init_proj is only how the weights start, so the export carries it exactly
UNEXPORTABLE = {'qk_norm': False, 'mlp_act': 'gelu', 'logit_softcap': 0.0}


def to_hf(model):
    """(transformers config, state dict) for the model's family."""
    for name, default in UNEXPORTABLE.items():
        value = getattr(model.config, name, default)
        if value != default:
            raise UserError(f"cannot export {name}={value!r}: transformers' GPT-2 and Llama do not compute it")
    family = getattr(model.config, 'family', 'gpt2')
    if family == 'gpt2':
        return gpt2_to_hf(model)
    if family == 'llama':
        return llama_to_hf(model)
    raise UserError(f"cannot export a model of family '{family}' (known: gpt2, llama)")


# --- import: transformers weights -> model_args and a state dict

def _rope_theta(c):
    """The rotary base of a LlamaConfig (transformers 5 keeps it in rope_parameters, 4 in rope_theta);
    scaled variants (Llama 3.1's 'llama3', 'linear', 'yarn', ...) are refused rather than run wrongly."""
    rope = getattr(c, "rope_parameters", None) or getattr(c, "rope_scaling", None) or {}
    kind = rope.get("rope_type", rope.get("type", "default"))
    if kind != "default":
        raise UserError(f"this Llama uses rope_type '{kind}'; only plain rotary embeddings are supported")
    return float(rope.get("rope_theta", getattr(c, "rope_theta", 10000.0)))


def gpt2_from_hf(hf_model, dropout=0.0):
    """(model_args, state dict) of a GPT-2-family GPT holding a transformers GPT2LMHeadModel's weights."""
    hf = hf_model.config
    args = dict(block_size=hf.n_positions, vocab_size=hf.vocab_size, n_layer=hf.n_layer, n_head=hf.n_head,
                n_embd=hf.n_embd, bias=True, dropout=dropout)
    state_dict = {k: v.t() if k.endswith(CONV1D) else v for k, v in hf_model.state_dict().items()
                  if not k.endswith((".attn.masked_bias", ".attn.bias"))}  # causal-mask buffers, not weights
    state_dict.setdefault("lm_head.weight", state_dict["transformer.wte.weight"])  # tied: one tensor
    return args, state_dict


def llama_from_hf(hf_model, dropout=0.0):
    """(model_args, state dict) of a llama-family GPT holding a transformers LlamaForCausalLM's weights."""
    c = hf_model.config
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    mlp_bias = getattr(c, "mlp_bias", False)
    if c.hidden_act != "silu" or head_dim * c.num_attention_heads != c.hidden_size or c.attention_bias != mlp_bias:
        raise UserError(f"unsupported Llama variant (hidden_act {c.hidden_act}, head_dim {head_dim} x "
                        f"{c.num_attention_heads} heads vs hidden_size {c.hidden_size}, attention_bias "
                        f"{c.attention_bias}, mlp_bias {mlp_bias})")
    args = dict(family="llama", block_size=c.max_position_embeddings, vocab_size=c.vocab_size,
                n_layer=c.num_hidden_layers, n_head=c.num_attention_heads, n_embd=c.hidden_size,
                n_kv_head=c.num_key_value_heads or c.num_attention_heads, mlp_hidden=c.intermediate_size,
                rope_theta=_rope_theta(c), norm_eps=c.rms_norm_eps, bias=c.attention_bias,
                tie_embeddings=bool(c.tie_word_embeddings), dropout=dropout)
    theirs = hf_model.state_dict()
    if args["tie_embeddings"]:
        theirs.setdefault("lm_head.weight", theirs["model.embed_tokens.weight"])
    state_dict = {key: torch.cat([theirs[name] for name, _ in parts]) for key, parts in _key_map(args)}
    return args, state_dict


def load_pretrained(model_type, dropout=0.0):
    """(model_args, state dict) from GPT-2 weights through transformers - a hub name (gpt2, gpt2-medium,
    gpt2-large, gpt2-xl) or a local folder written by save_pretrained - or from a Llama folder."""
    if os.path.isdir(model_type):
        from transformers import AutoConfig
        kind = AutoConfig.from_pretrained(model_type).model_type
        if kind == "llama":
            from transformers import LlamaForCausalLM
            print(f"loading Llama weights from {model_type}")
            return llama_from_hf(LlamaForCausalLM.from_pretrained(model_type), dropout)
        if kind != "gpt2":
            raise UserError(f"{model_type} holds a transformers '{kind}' model; only gpt2 and llama load")
    from transformers import GPT2LMHeadModel
    print(f"loading GPT-2 weights from {model_type}")
    return gpt2_from_hf(GPT2LMHeadModel.from_pretrained(model_type), dropout)


# --- the rest of an exported folder: tokenizer, model card, the check that it loads as ours

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
