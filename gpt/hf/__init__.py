"""The bridge to Hugging Face transformers, both directions (docs/export.md): the GPT-2 family is GPT2LMHeadModel (our
Linear weights are its Conv1D weights, transposed), the llama family LlamaForCausalLM (ours stack by rows what Llama
keeps apart - c_attn is [q; k; v], c_fc is [gate; up] - and our rotary embedding uses transformers' rotate_half layout,
so no weight is permuted). Import works on model_args dicts and state dicts, so that model.py can call it without this
module importing model.py back; transformers, slow to import, is imported inside the functions that use it."""
import dataclasses
import json
import logging
import os
import types
import zipfile
from contextlib import suppress
from pathlib import Path

import torch
from tqdm import tqdm

from gpt.runtime.errors import UserError
from gpt.runtime.untrusted import LEGACY_START, first_non_finite, safe_load

# GPT-2 stores these as Conv1D weights, the transpose of a Linear's
CONV1D = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")


# --- the field table: every GPTConfig field, and the transformers config field that carries it

# GPTConfig's architecture field: (GPT2Config field, LlamaConfig field), None where that family has none (the
# row's comment says what happens); any other architecture field is refused unless at its default (refused_fields;
# docs/export.md#every-setting-carried-or-refused)
FIELDS = {"family": ("model_type", "model_type"),  # 'gpt2' -> GPT2LMHeadModel, 'llama' -> LlamaForCausalLM
          "block_size": ("n_positions", "max_position_embeddings"),
          "vocab_size": ("vocab_size", "vocab_size"),
          "n_layer": ("n_layer", "num_hidden_layers"),
          "n_head": ("n_head", "num_attention_heads"),
          "n_embd": ("n_embd", "hidden_size"),
          "n_kv_head": (None, "num_key_value_heads"),  # gpt2: must be n_head (no grouped-query attention)
          "mlp_hidden": ("n_inner", "intermediate_size"),
          "norm_eps": ("layer_norm_epsilon", "rms_norm_eps"),
          "tie_embeddings": ("tie_word_embeddings", "tie_word_embeddings"),
          "bias": (None, "attention_bias"),  # gpt2: always has biases (zeros export bias=False, and import as it);
          #                                    llama: mlp_bias too, equal to attention_bias
          "rope_theta": (None, "rope_theta")}  # llama: also rope_parameters['rope_theta'] (transformers 5)
# transformers fields that change the math but that our model computes one way only: export writes the
# first value, import accepts the values listed and refuses any other with one error naming field and value
FIXED = {"gpt2": {"activation_function": ("gelu_new", "gelu_pytorch_tanh"),  # both GELU's tanh form, as ours
                  "scale_attn_weights": (True,),  # scores / sqrt(head size)
                  "scale_attn_by_inverse_layer_idx": (False,),  # and not also / (layer + 1)
                  "add_cross_attention": (False,)},  # a decoder alone
         "llama": {"hidden_act": ("silu",),
                   "rope_type": ("default",),  # no rope scaling: linear, dynamic, yarn, llama3, ... are refused
                   "partial_rotary_factor": (1.0, None),  # every dimension rotates
                   "head_dim": ("hidden_size / num_attention_heads",),  # checked in _check_llama
                   "mlp_bias": ("= attention_bias",)}}  # checked in _check_llama
LLAMA_CHECKED = ("rope_type", "partial_rotary_factor", "head_dim", "mlp_bias")  # by _check_llama
# transformers fields that do not change the logits (why each: docs/export.md#every-setting-carried-or-refused)
IGNORED = {
    "gpt2": ("resid_pdrop", "embd_pdrop", "attn_pdrop", "initializer_range", "use_cache", "bos_token_id",
             "eos_token_id", "pad_token_id", "summary_type", "summary_use_proj", "summary_activation",
             "summary_proj_to_labels", "summary_first_dropout", "summary_last_dropout", "reorder_and_upcast_attn",
             "n_ctx", "task_specific_params"),  # the hub's gpt2 configs carry these two; nothing reads them
    "llama": ("attention_dropout", "initializer_range", "use_cache", "bos_token_id", "eos_token_id",
              "pad_token_id", "pretraining_tp", "rope_parameters", "rope_scaling"),  # rope: _check_llama
}


# --- export: our model -> a transformers config and state dict

def _common_kwargs(cfg, family):
    """The transformers config's one-to-one fields (FIELDS) from a `family` model's GPTConfig (else a UserError)."""
    if cfg.family != family:
        raise UserError(f"{family}_to_hf needs a {family}-family model, not family '{cfg.family}'")
    i = 0 if family == "gpt2" else 1
    plain = ("block_size", "vocab_size", "n_layer", "n_head", "n_embd", "mlp_hidden", "norm_eps", "tie_embeddings")
    kwargs = {FIELDS[k][i]: getattr(cfg, k) for k in plain}
    kwargs.update({field: allowed[0] for field, allowed in FIXED[family].items() if field not in LLAMA_CHECKED})
    return kwargs


def gpt2_to_hf(model):
    """(GPT2Config, GPT2LMHeadModel state dict) of a gpt2-family GPT: Linear weights transposed, zero biases if none."""
    from transformers import GPT2Config
    cfg = model.config
    config = GPT2Config(**_common_kwargs(cfg, "gpt2"), resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                        bos_token_id=None, eos_token_id=None)  # the tokenizer's, set by the caller
    if cfg.n_kv_head != cfg.n_head:
        raise UserError(f"n_kv_head={cfg.n_kv_head}: transformers' GPT-2 has no grouped-query attention "
                        f"(n_head={cfg.n_head}), so this model cannot be exported as GPT2LMHeadModel")
    state_dict = {k: v.t() if k.endswith(CONV1D) else v for k, v in model.state_dict().items()}
    if not cfg.bias:  # transformers' GPT-2 always has biases: zeros (each norm's and Linear's) compute the same thing
        state_dict.update({k.removesuffix("weight") + "bias": torch.zeros(len(v)) for k, v in model.state_dict().items()
                           if k.startswith(("transformer.h.", "transformer.ln_f.")) and k.endswith(".weight")})
    return config, state_dict


def _key_map(cfg):
    """[(our key, [(transformers key, rows), ...])]: each of our tensors is its transformers tensors stacked."""
    cfg = types.SimpleNamespace(**cfg) if isinstance(cfg, dict) else cfg
    C, H, kv = cfg.n_embd, cfg.mlp_hidden, cfg.n_kv_head * (cfg.n_embd // cfg.n_head)
    pairs = [("transformer.wte.weight", [("model.embed_tokens.weight", cfg.vocab_size)]),
             ("transformer.ln_f.weight", [("model.norm.weight", C)]),
             ("lm_head.weight", [("lm_head.weight", cfg.vocab_size)])]
    for i in range(cfg.n_layer):
        ours, theirs = f"transformer.h.{i}.", f"model.layers.{i}."
        pairs += [(ours + "ln_1.weight", [(theirs + "input_layernorm.weight", C)]),
                  (ours + "ln_2.weight", [(theirs + "post_attention_layernorm.weight", C)])]
        for kind in ("weight", "bias") if cfg.bias else ("weight",):
            pairs += [(ours + f"attn.c_attn.{kind}", [(theirs + f"self_attn.{p}_proj.{kind}", n)
                                                      for p, n in (("q", C), ("k", kv), ("v", kv))]),
                      (ours + f"attn.c_proj.{kind}", [(theirs + f"self_attn.o_proj.{kind}", C)]),
                      (ours + f"mlp.c_fc.{kind}", [(theirs + f"mlp.{p}_proj.{kind}", H) for p in ("gate", "up")]),
                      (ours + f"mlp.c_proj.{kind}", [(theirs + f"mlp.down_proj.{kind}", C)])]
    return pairs


def llama_to_hf(model):
    """(LlamaConfig, LlamaForCausalLM state dict) of a llama-family GPT: views of the model's own tensors, no copies."""
    from transformers import LlamaConfig
    cfg = model.config
    config = LlamaConfig(**_common_kwargs(cfg, "llama"), num_key_value_heads=cfg.n_kv_head, rope_theta=cfg.rope_theta,
                         head_dim=cfg.n_embd // cfg.n_head, attention_bias=cfg.bias, mlp_bias=cfg.bias)
    config.rope_theta = cfg.rope_theta  # transformers 5 keeps it in rope_parameters only; 4.x reads this one
    config.rope_parameters = {"rope_type": "default", "rope_theta": cfg.rope_theta}  # and 4.x keeps only that
    ours = model.state_dict()
    return config, {name: tensor for key, parts in _key_map(cfg)
                    for (name, _), tensor in zip(parts, ours[key].split([n for _, n in parts]))}


def refused_fields(cfg):
    """{name: value} of the config's architecture fields that FIELDS does not carry and that differ from their
    defaults: what transformers' GPT-2 and Llama do not compute (qk_norm, any field GPTConfig gains, ...)."""
    defaults = {f.name: f.default for f in dataclasses.fields(cfg)}  # the config's class says (model.py)
    return {name: getattr(cfg, name) for name in type(cfg).architecture_fields()
            if name not in FIELDS and getattr(cfg, name) != defaults[name]}


def to_hf(model):
    """(transformers config, state dict) for the model's family; a UserError for what transformers cannot express."""
    if refused := refused_fields(model.config):
        listed = ", ".join(f"{name}={value!r}" for name, value in refused.items())
        raise UserError(f"cannot export {listed}: transformers' GPT-2/Llama do not compute "
                        f"{'it' if len(refused) == 1 else 'them'} (sample.py and hellaswag.py run this checkpoint "
                        f"as it is)")
    return gpt2_to_hf(model) if model.config.family == "gpt2" else llama_to_hf(model)


# --- import: transformers weights -> model_args and a state dict

def _check_llama(c, problems):
    """The rotary base of a LlamaConfig (5 keeps it in rope_parameters, 4 in rope_theta), after adding to
    `problems` what this model does not compute: rope scaling, partial rotation, other head widths, some biases."""
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    if head_dim * c.num_attention_heads != c.hidden_size:
        problems.append(("head_dim", head_dim, f"this model's heads are hidden_size / num_attention_heads = "
                                               f"{c.hidden_size} / {c.num_attention_heads} wide"))
    if bool(getattr(c, "mlp_bias", False)) != bool(c.attention_bias):
        problems.append(("mlp_bias", getattr(c, "mlp_bias", False),
                         f"this model has biases everywhere or nowhere, and attention_bias is {c.attention_bias}"))
    found = {}  # each problem once, though transformers 5 may show one dict under both names
    for name in ("rope_parameters", "rope_scaling"):
        rope = getattr(c, name, None) or {}
        kind = rope.get("rope_type", rope.get("type", "default"))
        if kind != "default":
            found.setdefault("rope_type", (f"{name}['rope_type']", kind,
                                           "only plain rotary embeddings are supported (no rope scaling)"))
        factor = rope.get("partial_rotary_factor", getattr(c, "partial_rotary_factor", None))
        if factor not in (None, 1, 1.0):
            found.setdefault("factor", ("partial_rotary_factor", factor,
                                        "this model rotates every dimension of a head"))
    problems += found.values()
    rope = getattr(c, "rope_parameters", None) or {}
    return float(rope.get("rope_theta", getattr(c, "rope_theta", None) or 10000.0))


def args_from_hf_config(c, dropout=0.0):
    """model_args (for GPTConfig) of a GPT2Config or LlamaConfig, every field that changes the math carried
    (FIELDS) or refused, in one UserError naming each. GPT-2's bias is left to the weights."""
    from transformers import GPT2Config, LlamaConfig, PretrainedConfig
    family = c.model_type  # gpt2 or llama: check_folder refuses any other before AutoConfig reads the folder
    # (field, value, why) of each field that cannot load exactly, so that one error line names them all. A field
    # no table above knows is refused where it differs from its default: a new transformers option (or a
    # folder's own) could change the math, and a silent default is the worst bug
    problems = []
    known = set(FIELDS) | {theirs for pair in FIELDS.values() for theirs in pair if theirs} | set(FIXED[family]) \
        | set(IGNORED[family]) | set(PretrainedConfig().to_dict()) | {"torch_dtype", "dtype"}
    default = (GPT2Config if family == "gpt2" else LlamaConfig)().to_dict()
    for key, value in c.to_dict().items():
        if key not in known and not key.startswith("_") and value not in (None, {}, []) and value != default.get(key):
            problems.append((key, value, f"not a {family} setting this project knows, so the logits it gives "
                                         f"cannot be promised (fields read: docs/export.md)"))
    for field, allowed in FIXED[family].items():
        value = getattr(c, field, allowed[0])
        if field not in LLAMA_CHECKED and value not in allowed:
            problems.append((field, value, f"this model computes only {' or '.join(map(repr, allowed))}"))
    if family == "llama":
        rope_theta = _check_llama(c, problems)
    if problems:
        raise UserError("transformers config field " + "; field ".join(f"{field}={value!r}: {why}"
                                                                        for field, value, why in problems))
    i = 0 if family == "gpt2" else 1
    args = {ours: getattr(c, pair[i]) for ours, pair in FIELDS.items()
            if pair[i] and ours not in ("bias", "rope_theta")}  # both special: below
    args.update(family=family, dropout=dropout, tie_embeddings=bool(args["tie_embeddings"]))
    if family == "gpt2":
        args["mlp_hidden"] = args["mlp_hidden"] or 4 * c.n_embd  # n_inner None: 4 x, as ours
    else:
        args.update(n_kv_head=c.num_key_value_heads or c.num_attention_heads, bias=bool(c.attention_bias),
                    rope_theta=rope_theta)
    return args


def gpt2_from_hf(hf_model, dropout=0.0):
    """(model_args, state dict) of a GPT-2-family GPT holding a transformers GPT2LMHeadModel's weights.
    Biases that are all exactly zero (an export of a bias=False model) come back as bias=False."""
    args = args_from_hf_config(hf_model.config, dropout)
    state_dict = {k: v.t() if k.endswith(CONV1D) else v for k, v in hf_model.state_dict().items()
                  if not k.endswith((".attn.masked_bias", ".attn.bias"))}  # causal-mask buffers, not weights
    if args["tie_embeddings"]:  # one tensor
        state_dict["lm_head.weight"] = state_dict["transformer.wte.weight"]
    args["bias"] = not all(torch.count_nonzero(v) == 0 for k, v in state_dict.items() if k.endswith(".bias"))
    if not args["bias"]:
        state_dict = {k: v for k, v in state_dict.items() if not k.endswith(".bias")}
    return args, state_dict


def llama_from_hf(hf_model, dropout=0.0):
    """(model_args, state dict) of a llama-family GPT holding a transformers LlamaForCausalLM's weights."""
    args, theirs = args_from_hf_config(hf_model.config, dropout), hf_model.state_dict()
    if args["tie_embeddings"]:
        theirs["lm_head.weight"] = theirs["model.embed_tokens.weight"]
    return args, {key: torch.cat([theirs[name] for name, _ in parts]) for key, parts in _key_map(args)}


def check_folder(folder, field_types=None):
    """One line for a folder given as init_from that cannot be a transformers GPT-2 or Llama model, from its
    config.json alone, before transformers is imported or any weight read. field_types: GPTConfig's {field: type}."""
    if any(os.path.exists(os.path.join(folder, name)) for name in ("ckpt.pt", "ckpt_dcp")):
        raise UserError(f"init_from={folder} is a training run's folder (it holds a checkpoint), not a "
                        f"transformers model: use --init_from=resume --out_dir={folder}")
    path = os.path.join(folder, "config.json")
    if not os.path.isfile(path):
        raise UserError(f"init_from={folder} holds no config.json, so it is not a transformers model folder "
                        f"(one written by save_pretrained, or by export.py from a checkpoint)")
    try:
        config = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:  # unreadable, not UTF-8, not JSON
        raise UserError(f"{path} could not be read as JSON ({e}): save the model again with save_pretrained")
    family = config.get("model_type") if isinstance(config, dict) else None
    if family not in ("gpt2", "llama"):
        raise UserError(f"{path}: model_type {family!r} is not a model this project loads (gpt2 or llama)")
    i = 0 if family == "gpt2" else 1
    for ours, pair in FIELDS.items() if field_types else ():
        field, want = pair[i], field_types[ours]
        value = config.get(field) if field else None
        if value is None:  # not there, or null: transformers' default
            continue
        if type(value) is not want and not (want is float and type(value) is int):
            raise UserError(f"{path}: {field}={value!r} is a {type(value).__name__}, not the {want.__name__} "
                            f"a {family} config holds: fix the file, or save the model again with save_pretrained")


def load_pretrained(model_type, dropout=0.0):
    """(model_args, state dict) of a hub GPT-2 (gpt2, ..., gpt2-xl) or a GPT-2 or Llama folder (save_pretrained's):
    its config checked, then its weights read (read_weights); what cannot load is one UserError."""
    from transformers import AutoConfig, GPT2LMHeadModel, LlamaForCausalLM
    from transformers.utils import cached_file
    quiet = {logging.getLogger(name): logging.getLogger(name).level for name in ("huggingface_hub", "transformers")}
    for logger in quiet:  # their warnings (the hub's retries, the load report) would come before our one line
        logger.setLevel(logging.ERROR)
    try:
        folder = model_type if os.path.isdir(model_type) else hub_folder(model_type, cached_file)
        check_folder(folder)
        try:
            config = AutoConfig.from_pretrained(folder)
        except Exception as e:  # transformers' ValueError, OSError; huggingface_hub's StrictDataclassError
            raise UserError(f"{model_type}: transformers cannot read its config.json "
                            f"({type(e).__name__}: {' '.join(str(e).split())[:300]})")
        args_from_hf_config(config, dropout)  # refuses early what cannot load exactly
        state_dict, llama = read_weights(folder), config.model_type == "llama"
        print(f"loading {'Llama' if llama else 'GPT-2'} weights from {model_type}")
        try:
            hf_model, info = (LlamaForCausalLM if llama else GPT2LMHeadModel).from_pretrained(
                None, config=config, state_dict=state_dict, output_loading_info=True)
        except (RuntimeError, ValueError) as e:  # a tensor of another shape than config.json's
            raise UserError(f"{folder}: its weights do not fit its config.json ({' '.join(str(e).split())[:300]})")
    except OSError as e:
        raise UserError(f"could not load GPT-2 weights '{model_type}' (no network, or not a model name or "
                        f"folder?): {str(e).splitlines()[0]}")
    finally:
        for logger, level in quiet.items():
            logger.setLevel(level)
    # a tensor no file holds would be drawn at random by transformers (the causal masks are not weights)
    if missing := sorted(k for k in info["missing_keys"] if not k.endswith((".attn.bias", ".attn.masked_bias"))):
        raise UserError(f"{folder}: its weight files lack {', '.join(missing[:3])}{' ...' if len(missing) > 3 else ''}"
                        f": they are damaged or of another model")
    return (llama_from_hf if llama else gpt2_from_hf)(hf_model, dropout)


def hub_folder(name, cached_file):
    """A hub model's folder: the cache's copy, else downloaded (OSError if it cannot be had). Without a connection
    the hub library retries for about half a minute; one request without retries first says so at once."""
    from huggingface_hub import constants, get_session  # comes with transformers, which only hub names need
    files = ("model.safetensors", "config.json")
    with suppress(OSError):  # not all in the cache
        return os.path.dirname([cached_file(name, f, local_files_only=True) for f in files][-1])
    if not constants.HF_HUB_OFFLINE:
        try:
            get_session().head(constants.ENDPOINT, timeout=10)
        except Exception as e:  # noqa: BLE001 - requests' or httpx's connection errors, whichever the hub uses
            raise OSError(f"cannot connect to {constants.ENDPOINT} ({type(e).__name__})")
    return os.path.dirname([cached_file(name, f) for f in files][-1])


def weight_files(folder):
    """A transformers folder's weight files, in transformers' order of preference: one, or an index's shards."""
    for name in ("model.safetensors", "pytorch_model.bin"):
        index = os.path.join(folder, name + ".index.json")
        if not os.path.isfile(index) and os.path.isfile(os.path.join(folder, name)):
            return [os.path.join(folder, name)]
        try:
            shards = sorted(set(json.loads(Path(index).read_text(encoding="utf-8"))["weight_map"].values()))
        except FileNotFoundError:
            continue
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            raise UserError(f"{index} is not a weight index ({type(e).__name__}: {e}): save the model again")
        for shard in shards or [None]:  # plain names of files beside it, so that nothing else is read
            if not isinstance(shard, str) or os.path.basename(shard) != shard or shard in ("", ".", ".."):
                raise UserError(f"{index} names {shard!r}, not a file of its folder: save the model again")
        return [os.path.join(folder, shard) for shard in shards]
    raise UserError(f"{folder} holds no weights (model.safetensors or pytorch_model.bin)")


def read_weights(folder):
    """A transformers folder's tensors, read with safetensors or safe_load (weights_only: no pickle's code runs);
    a file damaged, missing, holding more than tensors or NaN/inf is one UserError naming it."""
    from safetensors.torch import load_file  # here: it comes with transformers, which only folders need
    state_dict = {}
    for path in weight_files(folder):
        try:
            if path.endswith(".safetensors"):
                part = load_file(path)
            else:
                with open(path, "rb") as f:
                    torch_format = zipfile.is_zipfile(path) or f.read(len(LEGACY_START)) == LEGACY_START
                part = safe_load(path) if torch_format else None  # safe_load words its own refusals
        except UserError:
            raise
        except Exception as e:  # noqa: BLE001 - what safetensors raises on a damaged file is the file's fault
            raise UserError(f"{path} could not be read (missing, truncated or corrupted): "
                            f"{' '.join(str(e).split())[:200]}")
        if not isinstance(part, dict) or not all(isinstance(v, torch.Tensor) for v in part.values()):
            raise UserError(f"{path} is not a file of named tensors (torch.save's or safetensors): it is damaged, "
                            f"or not weights")
        if bad := first_non_finite(part):
            raise UserError(f"{path}: tensor {bad} holds NaN or inf: the weights are damaged, or diverged")
        state_dict.update(part)
    return state_dict


# --- the rest of an exported folder: the model card, the check that it loads as ours (the tokenizer: tokenizer.py)

def model_card(ckpt, hf_config, dtype):
    """README.md: YAML metadata (what the hub and huggingface_hub.ModelCard.load read), then the text."""
    family, cfg = hf_config.model_type, ckpt.get('config', {})
    tokens = None  # the training tokens, where the config says
    with suppress(KeyError, TypeError, ValueError):
        tokens = int(ckpt['iter_num']) * int(cfg['gradient_accumulation_steps']) * int(cfg['batch_size']) * \
            int(cfg['block_size'])
    dataset = cfg.get('dataset')
    yaml = ["---", 'library_name: "transformers"', 'pipeline_tag: "text-generation"', "tags:", '- "nanogpt"',
            f'- "{family}"', '- "text-generation"']
    if dataset:
        yaml += ["datasets:", f"- {json.dumps(str(dataset))}"]
    if tokens is not None:
        yaml.append(f"training_tokens: {tokens}")
    yaml += [f"training_steps: {int(ckpt.get('iter_num', 0))}", "---"]
    lines = yaml + [
        "", "# Exported GPT checkpoint", "",
        f"Trained with a nanoGPT-style trainer: {type(hf_config).__name__.replace('Config', '')} architecture, "
        f"{hf_config.num_hidden_layers} layers, {hf_config.num_attention_heads} heads, width {hf_config.hidden_size}, "
        f"context {ckpt['model_args']['block_size']}, vocabulary {hf_config.vocab_size}; weights in {dtype}.",
        f"Dataset: {dataset or '?'}; step {ckpt.get('iter_num', '?')}"
        + (f" ({tokens:,} tokens)" if tokens is not None else "") + "; best validation loss "
        f"{float(ckpt.get('best_val_loss', float('nan'))):.4f}.", "",
        f"The context is {ckpt['model_args']['block_size']} tokens: a call that gives no length stops there "
        f"(generation_config.json's max_length); one that asks for max_new_tokens must keep the prompt and them "
        f"within it. " + ("Past it generation fails: the position table has no more rows."
                          if family == "gpt2" else "Past it the rotary positions were never trained on."), "",
        "```python",
        "from transformers import AutoModelForCausalLM, pipeline",
        "model = AutoModelForCausalLM.from_pretrained('.')",
        "generate = pipeline('text-generation', model='.')",
        "print(generate('Hello'))  # up to the context",
        "```", "",
    ]
    return "\n".join(lines)


def verify(model, folder, tokenizer, tolerance=1e-4):
    """Load the folder with transformers; compare its logits (to `tolerance` of their largest) and tokens with ours."""
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
    tqdm.write(f"checked: transformers loads the folder; its logits match ours (max abs difference {diff:.2g}), "
               f"and so do its tokens")
