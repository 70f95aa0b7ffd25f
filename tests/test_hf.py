"""
gpt/hf/__init__.py, the bridge to transformers, and export.py: a checkpoint becomes a transformers folder that loads
offline with AutoModelForCausalLM (GPT-2 or Llama), gives our logits and greedy tokens, carries a tokenizer
that encodes as ours (characters, GPT-2 BPE, a dataset's own tokenizers BPE), and imports back
(GPT.from_pretrained) with the same logits again. Every config field that changes the math is carried or
refused, both ways: the round trip runs over every model setting (CASES); an architecture field (model.py
says each field's kind) that hf.FIELDS does not map is refused on export, a new one included
(test_a_new_architecture_field_is_refused_on_export_and_left_at_its_default_on_import).

Under two transformers versions: CI runs this file in a second environment with the oldest version the
requirements allow, and with $HF_OTHER_PYTHON (that environment's python) set, the folders exported here
are also loaded there (test_an_export_loads_in_the_other_transformers, test_user_paths_*): what users type,
model(**tokenizer(text)), generate(**enc) and pipeline, gives our logits and tokens in both.
"""
import dataclasses
import json
import os
import subprocess
import sys

import pytest
import torch
from conftest import write_char_dataset

import export
import hellaswag
from gpt import hf
from gpt.checkpoint import load_checkpoint, model_from_checkpoint
from gpt.data.tokenizer import folder_meta, get_tokenizer
from gpt.runtime.errors import UserError
from model import ARCHITECTURE, GPT, INITIALISATION, RUNTIME, GPTConfig

transformers = pytest.importorskip("transformers", reason="the bridge needs transformers: pip install transformers")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = dict(n_layer=2, n_head=2, n_embd=32, block_size=32, batch_size=8, gradient_accumulation_steps=1,
            learning_rate=3e-3, eval_interval=100, eval_iters=1, log_interval=10, warmup_iters=5, lr_decay_iters=20,
            dropout=0.0, compile=False, device="cpu", dtype="float32")
CHARS = [chr(c) for c in range(32, 127)]  # 95 printable characters: a char tokenizer for the tiny models


pytestmark = pytest.mark.usefixtures("one_thread")  # conftest: one thread for the models run here


def run(script, *args, check=True):
    r = subprocess.run([sys.executable, script, *map(str, args)], cwd=ROOT, capture_output=True, text=True,
                       timeout=240)
    if check:
        assert r.returncode == 0, f"{script} {args}:\n{r.stdout[-2000:]}\n{r.stderr[-3000:]}"
    return r


def randomize(model, seed=0):
    """Weights far from a fresh model's (norm gains 1, biases 0, small matrices), so that a swapped, missing
    or mis-scaled tensor or setting shows in the logits."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=g)
            p.copy_(1 + 0.2 * noise if name.endswith("ln_1.weight") or name.endswith("ln_2.weight")
                    or name.endswith("ln_f.weight") else 0.15 * noise)
    return model.eval()


def save_checkpoint(model, folder, chars=None, **extra):
    """A train.py-like ckpt.pt of the model, with a character vocabulary of `chars` (default: as many as the
    model's vocabulary has ids, up to 95)."""
    n = chars or min(model.config.vocab_size, len(CHARS))
    meta = {"tokenizer": "char", "vocab_size": n, "dtype": "uint16", "itos": CHARS[:n]}
    os.makedirs(folder, exist_ok=True)
    torch.save({"model": model.state_dict(), "model_args": model.config.checkpoint_args(), "iter_num": 7,
                "best_val_loss": 3.5, "dataset_meta": meta,
                "config": {"dataset": "shakespeare_char", "batch_size": 4, "gradient_accumulation_steps": 2,
                           "block_size": model.config.block_size, **extra}}, os.path.join(folder, "ckpt.pt"))
    return folder


def ours(out_dir):
    path = os.path.join(out_dir, "ckpt.pt")
    ckpt = load_checkpoint(path)
    return model_from_checkpoint(ckpt, path).eval(), get_tokenizer(ckpt["dataset_meta"])


def max_diff(a, b):
    return (a - b).abs().max().item()


# --- the round trip, over every setting a model has

# every GPTConfig field in hf.FIELDS takes a value other than its default in at least one case (checked below)
CASES = {
    "gpt2": dict(family="gpt2", n_layer=2, n_head=2, n_embd=32, block_size=32, vocab_size=101),
    "gpt2-nobias-untied": dict(family="gpt2", n_layer=1, n_head=4, n_embd=32, block_size=17, vocab_size=67,
                               bias=False, tie_embeddings=False, mlp_hidden=48, norm_eps=1e-3),
    "gpt2-wide-kv=n_head": dict(family="gpt2", n_layer=2, n_head=4, n_kv_head=4, n_embd=64, block_size=40,
                                vocab_size=95, norm_eps=1e-6),
    "llama": dict(family="llama", n_layer=2, n_head=2, n_embd=32, block_size=32, vocab_size=101),
    "llama-gqa-bias-untied": dict(family="llama", n_layer=2, n_head=4, n_kv_head=2, n_embd=64, block_size=24,
                                  vocab_size=77, bias=True, tie_embeddings=False, rope_theta=500000.0,
                                  mlp_hidden=40, norm_eps=1e-6),
    "llama-mqa": dict(family="llama", n_layer=1, n_head=4, n_kv_head=1, n_embd=32, block_size=50, vocab_size=66,
                      rope_theta=1234.5, norm_eps=1e-3, tie_embeddings=True),
}


def test_only_architecture_fields_are_carried_and_each_carried_one_is_exercised():
    assert set(hf.FIELDS) <= set(GPTConfig.fields_of(ARCHITECTURE))  # initialisation, runtime: never exported
    defaults = {f.name: f.default for f in dataclasses.fields(GPTConfig)}
    unexercised = {k for k in hf.FIELDS if not any(k in c and c[k] != defaults[k] for c in CASES.values())}
    assert not unexercised, f"no round-trip case sets {unexercised} to anything but its default"


def compared_fields(cfg):
    """The fields that define what a model computes: all of FIELDS, less rope_theta for gpt2 (no rotary)."""
    return {k: getattr(cfg, k) for k in hf.FIELDS if not (k == "rope_theta" and cfg.family == "gpt2")}


@pytest.mark.parametrize("case", list(CASES))
def test_round_trip_export_transformers_import(case, tmp_path):
    model = randomize(GPT(GPTConfig(**CASES[case])))
    cfg = model.config
    save_checkpoint(model, tmp_path)
    export.main([f"--out_dir={tmp_path}", "--verify=False"])
    folder = tmp_path / "hf"
    hf_model = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
    assert type(hf_model).__name__ == ("LlamaForCausalLM" if cfg.family == "llama" else "GPT2LMHeadModel")
    g = torch.Generator().manual_seed(1)
    x = torch.randint(0, cfg.vocab_size, (2, cfg.block_size), generator=g)
    back = GPT.from_pretrained(str(folder)).eval()
    assert compared_fields(back.config) == compared_fields(cfg)
    with torch.no_grad():
        logits = model(x, targets=x)[0]
        assert logits.abs().max() > 1  # far from uniform: a wrong setting would show
        assert max_diff(hf_model(x).logits, logits) < 1e-5
        assert max_diff(back(x, targets=x)[0], logits) < 1e-5
        # and the same greedy tokens (ours kept to the tokenizer's ids, theirs by suppress_tokens)
        n = min(len(CHARS), cfg.vocab_size)
        prompt = x[:1, :4] % n
        greedy = model.generate(prompt, 8, temperature=0, vocab_limit=n)
        assert hf_model.generate(prompt, max_new_tokens=8, do_sample=False).tolist() == greedy.tolist()


def test_settings_transformers_cannot_express_are_refused_before_writing(tmp_path):
    model = GPT(GPTConfig(family="gpt2", n_layer=1, n_head=4, n_kv_head=2, n_embd=32, block_size=16, vocab_size=50))
    save_checkpoint(model, tmp_path)
    with pytest.raises(UserError, match="n_kv_head=2.*grouped-query") as e:
        export.main([f"--out_dir={tmp_path}"])
    assert "\n" not in str(e.value)
    assert not (tmp_path / "hf").exists()
    with pytest.raises(UserError, match="llama-family"):
        hf.llama_to_hf(model)


def test_a_new_architecture_field_is_refused_on_export_and_left_at_its_default_on_import(extra_architecture_field,
                                                                                        tmp_path):
    """GPTConfig gains an architecture field (conftest patches one in): export refuses a model that sets it,
    in one line naming it, before writing; at its default the model exports, and imports back with it."""
    import model as model_module
    name, Config = extra_architecture_field, model_module.GPTConfig
    assert name in Config.fields_of(ARCHITECTURE) and name not in hf.FIELDS
    small = dict(n_layer=1, n_head=2, n_embd=32, block_size=16, vocab_size=60)
    save_checkpoint(randomize(GPT(Config(**small, **{name: 3}))), tmp_path / "set")
    with pytest.raises(UserError) as e:
        export.main([f"--out_dir={tmp_path / 'set'}"])
    assert str(e.value).startswith(f"cannot export {name}=3: transformers' GPT-2/Llama do not compute it")
    assert "\n" not in str(e.value) and not (tmp_path / "set" / "hf").exists()

    model = randomize(GPT(Config(**small)))
    save_checkpoint(model, tmp_path / "default")
    export.main([f"--out_dir={tmp_path / 'default'}", "--verify=False"])
    back = GPT.from_pretrained(str(tmp_path / "default" / "hf")).eval()
    assert isinstance(back.config, Config) and getattr(back.config, name) == 0
    x = torch.randint(0, 60, (2, 16))
    with torch.no_grad():
        assert max_diff(back(x, targets=x)[0], model(x, targets=x)[0]) < 1e-5


def test_every_unexportable_setting_is_named_in_one_line(tmp_path):
    model = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=32, block_size=16, vocab_size=60, qk_norm=True,
                          logit_softcap=30.0))
    with pytest.raises(UserError) as e:
        hf.to_hf(model)
    assert str(e.value).startswith("cannot export qk_norm=True, logit_softcap=30.0: transformers' GPT-2/Llama do "
                                   "not compute them") and "\n" not in str(e.value)


def test_the_token_efficiency_switches_are_refused_in_one_line():
    """pos_emb='rope' on gpt2, value_embeds and skip_connections: transformers' GPT2LMHeadModel computes none of
    them (and LlamaForCausalLM neither of the last two), so export names all three, as the checkpoint has them."""
    for family in ("gpt2", "llama"):
        rope = dict(pos_emb='rope') if family == 'gpt2' else {}
        model = GPT(GPTConfig(family=family, n_layer=2, n_head=2, n_embd=32, block_size=16, vocab_size=60, **rope,
                              value_embeds=1, skip_connections=True))
        with pytest.raises(UserError) as e:
            hf.to_hf(model)
        named = ("pos_emb='rope', " if rope else "") + "value_embeds=1, skip_connections=True"
        assert str(e.value).startswith(f"cannot export {named}: transformers' GPT-2/Llama do not compute them")


def test_initialisation_and_runtime_fields_are_not_exported(tmp_path):
    """How a run starts or runs the model (dropout, zero_init_proj, fused_loss, loss_chunk) is not what it
    computes: a model that sets them exports, and the folder's dropouts are zero."""
    others = {f.name for f in dataclasses.fields(GPTConfig)} - set(GPTConfig.fields_of(ARCHITECTURE))
    assert others == set(GPTConfig.fields_of(INITIALISATION) + GPTConfig.fields_of(RUNTIME)) and others
    for family in ("gpt2", "llama"):
        model = randomize(GPT(GPTConfig(family=family, n_layer=1, n_head=2, n_embd=32, block_size=16,
                                        vocab_size=60, dropout=0.3, zero_init_proj=True, fused_loss=True,
                                        loss_chunk=7)))
        config, _ = hf.to_hf(model)
        dropouts = {k: v for k, v in config.to_dict().items()
                    if k.endswith(("pdrop", "dropout")) and not k.startswith("summary_")}  # double-heads model's
        assert dropouts and not any(dropouts.values()), dropouts
        assert not set(config.to_dict()) & others


# --- import: every transformers setting that changes the math is carried or refused

GPT2 = dict(n_positions=48, n_embd=48, n_layer=2, n_head=4, vocab_size=300)
LLAMA = dict(vocab_size=300, hidden_size=64, intermediate_size=160, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=48, rms_norm_eps=1e-5, rope_theta=500000.0)


@pytest.mark.parametrize("family, change, refused", [
    ("gpt2", {}, None),
    ("gpt2", dict(tie_word_embeddings=False), None),  # was 1.23 off, silently
    ("gpt2", dict(layer_norm_epsilon=1e-2), None),  # was 0.69
    ("gpt2", dict(n_inner=96), None),  # was an AssertionError
    ("gpt2", dict(activation_function="gelu_pytorch_tanh"), None),
    ("gpt2", dict(reorder_and_upcast_attn=True), None),  # precision only
    ("gpt2", dict(activation_function="relu"), "activation_function='relu'"),  # was 0.387 off
    ("gpt2", dict(activation_function="gelu"), "activation_function='gelu'"),
    ("gpt2", dict(scale_attn_by_inverse_layer_idx=True), "scale_attn_by_inverse_layer_idx=True"),  # was 2.1e-3
    ("gpt2", dict(scale_attn_weights=False), "scale_attn_weights=False"),
    ("gpt2", dict(some_new_switch=3), "some_new_switch=3"),
    ("llama", {}, None),
    ("llama", dict(tie_word_embeddings=True, attention_bias=True, mlp_bias=True), None),
    ("llama", dict(num_key_value_heads=1, rms_norm_eps=1e-3, rope_theta=77.0), None),
    ("llama", dict(pretraining_tp=2), None),  # same sums, sliced
    ("llama", dict(rope_scaling="linear"), "rope_type.*'linear'"),
    ("llama", dict(head_dim=32), "head_dim=32"),
    ("llama", dict(attention_bias=True, mlp_bias=False), "mlp_bias=False"),
    ("llama", dict(hidden_act="gelu"), "hidden_act='gelu'"),
    ("llama", dict(partial_rotary_factor=0.5), "partial_rotary_factor=0.5"),
])
def test_import_carries_or_refuses_every_field(family, change, refused, tmp_path):
    if family == "gpt2":
        config = transformers.GPT2Config(**{**GPT2, **change})
        hf_model = transformers.GPT2LMHeadModel(config)
    else:
        if "rope_scaling" in change:  # where each version keeps it, in its own form
            change = (dict(rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0})
                      if int(transformers.__version__.split(".")[0]) >= 5 else
                      dict(rope_scaling={"type": "linear", "factor": 2.0}))
        config = transformers.LlamaConfig(**{**LLAMA, **change})
        if refused and "head_dim" not in change:  # some would not even build here; the config is what we read
            config.save_pretrained(tmp_path)
            with pytest.raises(UserError, match=refused) as e:
                GPT.from_pretrained(str(tmp_path))
            assert "\n" not in str(e.value)
            return
        hf_model = transformers.LlamaForCausalLM(config)
    torch.manual_seed(0)
    with torch.no_grad():
        for p in hf_model.parameters():
            p.copy_(torch.randn_like(p) * (0.2 if p.dim() > 1 else 0.5) + (1 if p.dim() == 1 else 0))
    hf_model.eval().save_pretrained(tmp_path)
    if refused:
        with pytest.raises(UserError, match=refused) as e:
            GPT.from_pretrained(str(tmp_path))
        assert "\n" not in str(e.value) and str(e.value).startswith("transformers config field ")
        return
    model = GPT.from_pretrained(str(tmp_path)).eval()
    x = torch.randint(0, 300, (2, 48))
    with torch.no_grad():
        assert max_diff(model(x, targets=x)[0], hf_model(x).logits) < 1e-5


@pytest.mark.parametrize("family, change, named", [
    ("gpt2", dict(activation_function="relu", scale_attn_weights=False, some_new_switch=3),
     ["activation_function='relu'", "scale_attn_weights=False", "some_new_switch=3"]),
    ("llama", dict(hidden_act="gelu", head_dim=32, attention_bias=True, mlp_bias=False, partial_rotary_factor=0.5),
     ["hidden_act='gelu'", "head_dim=32", "mlp_bias=False", "partial_rotary_factor=0.5"]),
])
def test_one_import_error_names_every_refused_field(family, change, named, tmp_path):
    config = (transformers.GPT2Config(**{**GPT2, **change}) if family == "gpt2"
              else transformers.LlamaConfig(**{**LLAMA, **change}))
    config.save_pretrained(tmp_path)
    with pytest.raises(UserError) as e:
        GPT.from_pretrained(str(tmp_path))
    message = str(e.value)
    assert "\n" not in message and message.startswith("transformers config field ")
    assert all(message.count(name) == 1 for name in named), message
    assert message.count("; field ") == len(named) - 1, message  # each once, nothing else


def test_an_exported_bias_free_gpt2_comes_back_bias_free(tmp_path):
    model = randomize(GPT(GPTConfig(n_layer=1, n_head=2, n_embd=32, block_size=16, vocab_size=60, bias=False)))
    config, state_dict = hf.gpt2_to_hf(model)
    hf_model = transformers.GPT2LMHeadModel(config)
    hf_model.load_state_dict(state_dict, strict=False)
    args, back = hf.gpt2_from_hf(hf_model)
    assert args["bias"] is False and not any(k.endswith(".bias") for k in back)


# --- export.py: what the folder holds

@pytest.fixture(scope="module")
def char_run(shakespeare_text_path, tmp_path_factory):
    d = tmp_path_factory.mktemp("export_char")
    write_char_dataset(d / "data", shakespeare_text_path)
    # bias=False: transformers' GPT-2 always has biases, so the export fills in zeros
    out = d / "out"
    run("train.py", f"--data_dir={d / 'data'}", f"--out_dir={out}", "--dataset=shakespeare_char", "--max_iters=20",
        "--bias=False", *[f"--{k}={v}" for k, v in TINY.items()])
    return out


@pytest.fixture(scope="module")
def bpe_run(gpt2_ranks_path, tmp_path_factory):
    """A GPT-2 BPE checkpoint whose vocabulary is padded to 50304, and whose padding ids would win every
    greedy step if nothing kept generation from them."""
    d = tmp_path_factory.mktemp("export_bpe")
    torch.manual_seed(0)
    args = dict(n_layer=2, n_head=2, n_embd=32, block_size=64, bias=True, vocab_size=50304, dropout=0.0)
    model = GPT(GPTConfig(**args))
    with torch.no_grad():
        model.lm_head.weight[50257:] *= 50
    meta = {"tokenizer": "gpt2", "vocab_size": 50257, "dtype": "uint16", "eot": 50256}
    torch.save({"model": model.state_dict(), "model_args": args, "iter_num": 0, "best_val_loss": 10.0,
                "config": {"dataset": "bpe"}, "dataset_meta": meta}, d / "ckpt.pt")
    return d


def test_char_checkpoint_exports_and_matches_ours(char_run):
    from transformers import AutoModelForCausalLM, AutoTokenizer, pipeline
    r = run("export.py", f"--out_dir={char_run}")
    assert "logits match ours" in r.stdout and "so do its tokens" in r.stdout, r.stdout
    folder = char_run / "hf"
    assert {"model.safetensors", "config.json", "tokenizer.json", "README.md"} <= set(os.listdir(folder))
    assert json.loads((folder / "config.json").read_text())["architectures"] == ["GPT2LMHeadModel"]

    model, tokenizer = ours(char_run)
    hf_model = AutoModelForCausalLM.from_pretrained(folder).eval()
    hf_tok = AutoTokenizer.from_pretrained(folder)
    text = "First Citizen:\nBefore we proceed any further, hear me speak."
    x = torch.tensor([tokenizer.encode(text)[:32]])
    assert hf_tok.encode(text) == tokenizer.encode(text)
    assert hf_tok.decode(tokenizer.encode(text)) == text
    with torch.no_grad():
        assert max_diff(model(x, targets=x)[0], hf_model(x).logits) < 1e-5
        greedy = model.generate(x[:, :8], 20, temperature=0, vocab_limit=tokenizer.vocab_size)
        hf_greedy = hf_model.generate(x[:, :8], max_new_tokens=20, do_sample=False)
    assert hf_greedy.tolist() == greedy.tolist()
    # the text-generation pipeline works on the folder as it is, and writes the same text as our greedy decoding
    generate = pipeline("text-generation", model=str(folder))
    out = generate(text[:8], max_new_tokens=20, do_sample=False)[0]["generated_text"]
    assert out == tokenizer.decode(greedy[0].tolist())
    # train.py gave the 65 characters one id more, which the folder names <|endoftext|>: its eos and pad, so
    # prompts of different lengths batch, each generating what it does alone
    assert tokenizer.vocab_size == 65 and hf_model.config.vocab_size == 66 and "note:" not in r.stdout
    assert (hf_tok.eos_token, hf_tok.pad_token, hf_tok.pad_token_id) == ("<|endoftext|>", "<|endoftext|>", 65)
    prompts = [text[:3], text[:15], text[:1]]
    alone = [generate(p, max_new_tokens=6, do_sample=False)[0]["generated_text"] for p in prompts]
    batched = generate(prompts, max_new_tokens=6, do_sample=False, batch_size=3)
    assert [b[0]["generated_text"] for b in batched] == alone


def test_char_export_fine_tunes_on_its_character_dataset(char_run):
    """The folder's tokenizer.json is the dataset's characters plus <|endoftext|>: train.py takes it as that
    character vocabulary (not some other tokenizer), and fine-tunes it on the data it came from."""
    folder = char_run / "hf"
    if not folder.exists():
        run("export.py", f"--out_dir={char_run}")
    meta = folder_meta(str(folder))
    _, tokenizer = ours(char_run)
    assert meta["tokenizer"] == "char" and meta["itos"] == tokenizer.itos and meta["vocab_size"] == 65
    out = char_run.parent / "finetuned"
    run("train.py", f"--data_dir={char_run.parent / 'data'}", f"--out_dir={out}", "--dataset=shakespeare_char",
        f"--init_from={folder}", "--max_iters=2", *[f"--{k}={v}" for k, v in TINY.items()])
    assert load_checkpoint(str(out / "ckpt.pt"))["model_args"]["vocab_size"] == 66


def test_char_model_without_a_spare_id_exports_without_pad_and_says_so(tmp_path, capsys):
    """A nanoGPT-style character model (vocab_size = its characters): no id for an end-of-text token, so
    the folder has no eos or pad (adding a row would change every likelihood), and export.py says so."""
    from transformers import AutoTokenizer
    model = randomize(GPT(GPTConfig(n_layer=1, n_head=2, n_embd=32, block_size=16, vocab_size=60)))
    save_checkpoint(model, tmp_path)
    export.main([f"--out_dir={tmp_path}"])
    assert "no end-of-text or pad token" in capsys.readouterr().out
    hf_tok = AutoTokenizer.from_pretrained(tmp_path / "hf")
    assert hf_tok.eos_token is None and hf_tok.pad_token is None and len(hf_tok) == 60


def test_char_tokenizer_drops_characters_outside_its_vocabulary():
    """Text with a character the vocabulary lacks encodes as the text without it (no "Missing [UNK] token"
    error, no id the model lacks); known text, characters that are special to a regex, and <|endoftext|>
    encode as before."""
    from gpt.hf.tokenizer import hf_tokenizer
    itos = list("\n !$&-.:;?[]^\\ABCabc")
    hf_tok = hf_tokenizer(get_tokenizer({"tokenizer": "char", "itos": itos}), 32, len(itos) + 1)
    known = "".join(itos) + "Cab[c]^\\-"
    assert hf_tok.encode(known) == [itos.index(ch) for ch in known]
    assert hf_tok.encode("naïve Abc 😀 — é") == hf_tok.encode("a Abc   ")  # n, ï, v, e, 😀, — and é dropped
    assert hf_tok.encode("a<|endoftext|>b") == [itos.index("a"), len(itos), itos.index("b")]
    assert len(hf_tok) == len(itos) + 1  # the vocabulary is the characters and <|endoftext|>, nothing more


def test_gpt2_bpe_export_has_gpt2s_tokenizer_and_never_picks_padding(bpe_run, shakespeare_text_path, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer, pipeline
    folder = tmp_path / "hf"
    export.main([f"--out_dir={bpe_run}", f"--export_dir={folder}"])
    model, tokenizer = ours(bpe_run)
    assert model.config.vocab_size == 50304 and tokenizer.vocab_size == 50257
    hf_model = AutoModelForCausalLM.from_pretrained(folder).eval()
    assert hf_model.config.vocab_size == 50304 and hf_model.config.eos_token_id == 50256
    assert hf_model.generation_config.suppress_tokens == list(range(50257, 50304))
    assert hf_model(torch.tensor([[464]])).logits[0, -1].argmax() >= 50257  # a padding id would win, unsuppressed
    # the tokenizer, rebuilt offline from the tiktoken ranks, encodes exactly as tiktoken does
    hf_tok = AutoTokenizer.from_pretrained(folder)
    assert hf_tok.pad_token == hf_tok.eos_token == "<|endoftext|>"
    with open(shakespeare_text_path) as f:
        text = f.read()[-20000:]
    text += " naïve café 😀 <|endoftext|> 1234567   \t\r\n  spaces"
    assert hf_tok.encode(text) == tokenizer.encode(text)
    assert hf_tok.decode(tokenizer.encode(text)) == text
    x = torch.tensor([tokenizer.encode("ROMEO:\nWhat say you, my lord?")])
    with torch.no_grad():
        assert max_diff(model(x, targets=x)[0], hf_model(x).logits) < 1e-5
        # our generate keeps to the tokenizer's ids; suppress_tokens makes transformers do the same
        greedy = model.generate(x, 16, temperature=0, vocab_limit=tokenizer.vocab_size)
        hf_greedy = hf_model.generate(x, max_new_tokens=16, do_sample=False)
    assert hf_greedy.tolist() == greedy.tolist()
    generate = pipeline("text-generation", model=str(folder))
    out = generate("ROMEO:\nWhat say you, my lord?", max_new_tokens=16, do_sample=False)[0]["generated_text"]
    assert out == tokenizer.decode(greedy[0].tolist())


def test_batched_pipeline_pad_token_generation_limit_and_model_card(tmp_path):
    """A folder people can use at once: a char model whose vocabulary has spare ids gets <|endoftext|> as
    its eos and pad, and a batch of prompts of different lengths generates what each alone does; the
    README's YAML block is what the hub reads."""
    from huggingface_hub import ModelCard
    from transformers import pipeline
    model = randomize(GPT(GPTConfig(family="llama", n_layer=1, n_head=2, n_embd=32, block_size=24, vocab_size=64)))
    save_checkpoint(model, tmp_path, chars=60)
    export.main([f"--out_dir={tmp_path}"])
    folder = str(tmp_path / "hf")
    generate = pipeline("text-generation", model=folder)
    tok, config = generate.tokenizer, generate.model.config
    assert (tok.eos_token, tok.eos_token_id, tok.pad_token_id, config.pad_token_id) == ("<|endoftext|>", 60, 60, 60)
    assert 60 in generate.model.generation_config.suppress_tokens  # never generated: the model never saw it
    # a call that gives no length stops at the context
    assert json.load(open(os.path.join(folder, "generation_config.json")))["max_length"] == 24
    prompts = ["ABC", "HELLO THERE", "X"]
    alone = [generate(p, max_new_tokens=6, do_sample=False)[0]["generated_text"] for p in prompts]
    batched = generate(prompts, max_new_tokens=6, do_sample=False, batch_size=3)
    assert [b[0]["generated_text"] for b in batched] == alone
    _, tokenizer = ours(tmp_path)
    x = torch.tensor([tokenizer.encode("HELLO THERE")])
    assert alone[1] == tokenizer.decode(model.generate(x, 6, temperature=0, vocab_limit=60)[0].tolist())

    card = ModelCard.load(os.path.join(folder, "README.md"))
    assert card.data.library_name == "transformers" and card.data.pipeline_tag == "text-generation"
    assert "llama" in card.data.tags and card.data.datasets == ["shakespeare_char"]
    assert card.data.to_dict()["training_tokens"] == 7 * 2 * 4 * 24
    # tokenizer and config are written so that transformers 4.x reads them too
    assert json.load(open(os.path.join(folder, "tokenizer_config.json")))["tokenizer_class"] == \
        "PreTrainedTokenizerFast"
    saved = json.load(open(os.path.join(folder, "config.json")))
    assert saved["rope_theta"] == saved["rope_parameters"]["rope_theta"] == 10000.0


def test_own_bpe_tokenizer_is_exported_as_it_is(shakespeare_text_path, tmp_path):
    from transformers import AutoTokenizer

    from gpt.data import tokenizer
    with open(shakespeare_text_path) as f:
        text = f.read()[:50000]
    ours_tok, meta = tokenizer.dataset_tokenizer("train", tmp_path / "data", lambda: [text], 400)
    meta["tokenizer_json"] = (tmp_path / "data" / "tokenizer.json").read_text()
    args = dict(n_layer=1, n_head=2, n_embd=16, block_size=32, bias=False, vocab_size=448, dropout=0.0)
    model = GPT(GPTConfig(**args))
    torch.save({"model": model.state_dict(), "model_args": args, "iter_num": 0, "best_val_loss": 9.0,
                "config": {}, "dataset_meta": meta}, tmp_path / "ckpt.pt")
    export.main([f"--out_dir={tmp_path}"])
    hf_tok = AutoTokenizer.from_pretrained(tmp_path / "hf")
    sample = text[-2000:] + "<|endoftext|>"
    assert hf_tok.encode(sample) == ours_tok.encode(sample)
    assert hf_tok.eos_token == hf_tok.pad_token == "<|endoftext|>" and hf_tok.eos_token_id == meta["eot"]


def test_export_mistakes_are_one_line_errors(tmp_path):
    with pytest.raises(UserError, match="no checkpoint at"):
        export.main([f"--out_dir={tmp_path}"])
    with pytest.raises(UserError, match="dtype must be one of"):
        export.main([f"--out_dir={tmp_path}", "--dtype=int8"])


def test_bfloat16_export(tmp_path):
    model = randomize(GPT(GPTConfig(family="llama", n_layer=2, n_head=4, n_kv_head=2, n_embd=64, block_size=32,
                                    vocab_size=65, bias=False, tie_embeddings=False)))
    save_checkpoint(model, tmp_path)
    export.main([f"--out_dir={tmp_path}", "--dtype=bfloat16"])
    hf_model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf").float().eval()
    assert type(hf_model).__name__ == "LlamaForCausalLM" and hf_model.config.num_key_value_heads == 2
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(p.bfloat16().float())  # the export rounded the weights to bfloat16
        x = torch.randint(0, 65, (2, 32))
        assert max_diff(model(x, targets=x)[0], hf_model(x).logits) < 1e-5


# --- sample.py and hellaswag.py on a folder whose tokenizer cannot be known

def test_a_folder_without_its_tokenizer_is_one_error_line(tmp_path):
    config = transformers.LlamaConfig(**LLAMA)
    transformers.LlamaForCausalLM(config).save_pretrained(tmp_path)
    r = run("sample.py", f"--init_from={tmp_path}", "--num_samples=1", "--max_new_tokens=2", "--device=cpu",
            check=False)
    assert r.returncode == 2 and r.stderr.strip().splitlines() == [
        f"error: {tmp_path / 'tokenizer.json'} is missing, so the tokenizer of this llama model (300 tokens, not "
        f"GPT-2's BPE) cannot be known"], r.stderr[-2000:]
    examples = tmp_path / "hs.jsonl"
    examples.write_text(json.dumps({"ctx": "A man", "endings": ["a", "b", "c", "d"], "label": 0}) + "\n")
    with pytest.raises(UserError, match="tokenizer.json is missing"):
        hellaswag.main([f"--init_from={tmp_path}", f"--path={examples}", "--device=cpu"])


# --- what users type - model(**tokenizer(text)), generate(**enc), pipeline - in this transformers and the other

USER_TEXT = {"char": "HELLO THERE, friend", "bpe": "ROMEO:\nWhat say you, my lord?"}


@pytest.fixture(scope="module")
def user_exports(gpt2_ranks_path, tmp_path_factory):
    """{name: run folder} of GPT-2 and Llama exports (context 32), each with a character vocabulary and with
    GPT-2's BPE (padded to 50304), each folder holding hf/ and expected.pt: a text, our token ids and logits
    of it, and our greedy continuation, 8 tokens as ids and as text, and up to the context."""
    folders = {}
    for family in ("gpt2", "llama"):
        for vocab in ("char", "bpe"):
            d = tmp_path_factory.mktemp(f"{family}-{vocab}")
            model = randomize(GPT(GPTConfig(family=family, n_layer=2, n_head=2, n_embd=32, block_size=32,
                                            vocab_size=101 if vocab == "char" else 50304)))
            if vocab == "char":
                save_checkpoint(model, d)  # 95 characters, and <|endoftext|> the 96th id
            else:
                meta = {"tokenizer": "gpt2", "vocab_size": 50257, "dtype": "uint16", "eot": 50256}
                torch.save({"model": model.state_dict(), "model_args": model.config.checkpoint_args(),
                            "iter_num": 0, "best_val_loss": 9.0, "config": {}, "dataset_meta": meta}, d / "ckpt.pt")
            export.main([f"--out_dir={d}", "--verify=False"])
            _, tokenizer = ours(d)
            ids = tokenizer.encode(USER_TEXT[vocab])
            x = torch.tensor([ids])
            with torch.no_grad():
                greedy = model.generate(x, 8, temperature=0, vocab_limit=tokenizer.vocab_size)[0].tolist()
                full = model.generate(x, 32 - len(ids), temperature=0, vocab_limit=tokenizer.vocab_size)[0].tolist()
                torch.save({"text": USER_TEXT[vocab], "ids": ids, "logits": model(x, targets=x)[0][0],
                            "greedy": greedy, "greedy_text": tokenizer.decode(greedy), "greedy_full": full},
                           d / "expected.pt")
            folders[f"{family}-{vocab}"] = d
    return folders


# run by the python under test, on run folders: what each path users take gives, as one JSON line
USER_PATHS = r"""
import json, sys, torch, transformers
results = {}
for d in sys.argv[1:]:
    e, folder = torch.load(d + '/expected.pt'), d + '/hf'
    model = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
    enc = transformers.AutoTokenizer.from_pretrained(folder)(e['text'], return_tensors='pt')
    with torch.no_grad():
        diff = (model(**enc).logits[0] - e['logits']).abs().max().item()
        print('GENERATE', file=sys.stderr, flush=True)  # what generate() says, up to PIPELINE
        generated = model.generate(**enc, max_new_tokens=8, do_sample=False)[0].tolist()
    print('PIPELINE', file=sys.stderr, flush=True)
    generate = transformers.pipeline('text-generation', model=folder)
    text = generate(e['text'], max_new_tokens=8, do_sample=False)
    print('BARE', file=sys.stderr, flush=True)  # what a call without a length says, up to LONG
    bare = generate(e['text'], do_sample=False, return_tensors=True)[0]['generated_token_ids']
    print('LONG', file=sys.stderr, flush=True)
    try:
        long = generate(e['text'] * 10, do_sample=False)
    except Exception as error:
        long = f'{type(error).__name__}: {error}'
    results[d] = dict(inputs=sorted(enc), ids=enc['input_ids'][0].tolist(), diff=diff, generated=generated,
                      pipeline=text[0]['generated_text'], bare=list(bare), long=str(long),
                      unknown=generate.tokenizer.encode('\u00e9' + e['text'] + '\U0001f600\u2014'),
                      max_length=model.generation_config.max_length)
print('RESULTS', transformers.__version__, json.dumps(results))
"""


def check_user_paths(python, user_exports):
    r = subprocess.run([python, "-c", USER_PATHS, *map(str, user_exports.values())], capture_output=True,
                       text=True, timeout=300, env={**os.environ, "TRANSFORMERS_VERBOSITY": "warning"})
    assert r.returncode == 0, r.stderr[-3000:]
    _, version, results = r.stdout.strip().splitlines()[-1].split(" ", 2)
    results = json.loads(results)
    for name, d in user_exports.items():
        e, got = torch.load(d / "expected.pt"), results[str(d)]
        where = f"transformers {version}, {name}"
        # no token_type_ids: transformers 4.x's GPT-2 adds wte(token_type_ids), its Llama refuses them
        assert got["inputs"] == ["attention_mask", "input_ids"], (where, got["inputs"])
        assert got["ids"] == e["ids"], where
        assert got["diff"] < 1e-5, (where, got["diff"])
        assert got["generated"] == e["greedy"], where
        assert got["pipeline"] == e["greedy_text"], where
        # a call that gives no length (the pipeline's default: 256 new tokens) stops at the context, 32 tokens,
        # the greedy tokens ours; a prompt longer than the context is transformers' one-line ValueError, not an
        # IndexError from GPT-2's position table nor a Llama running past its trained positions
        assert got["max_length"] == 32 and got["bare"] == e["greedy_full"][:len(got["bare"])], where
        assert len(got["bare"]) == 32 or got["bare"][-1] == 50256, (where, len(got["bare"]))
        assert got["long"].startswith("ValueError: Input length of input_ids is ") and "max_length" in got[
            "long"], (where, got["long"])
        if name.endswith("char"):  # characters outside the vocabulary are dropped, not an error
            assert got["unknown"] == e["ids"], where
    # nothing warns about lengths when a call gives none
    bare = [part.split("LONG\n")[0] for part in r.stderr.split("BARE\n")[1:]]
    assert len(bare) == len(user_exports) and not any("max_length" in s for s in bare), (version, bare)


def test_user_paths_give_our_logits_and_tokens(user_exports):
    check_user_paths(sys.executable, user_exports)


@pytest.mark.skipif(not os.environ.get("HF_OTHER_PYTHON"), reason="HF_OTHER_PYTHON (a second transformers) not set")
def test_user_paths_give_our_logits_and_tokens_in_the_other_transformers(user_exports):
    check_user_paths(os.environ["HF_OTHER_PYTHON"], user_exports)


# --- the other transformers version

@pytest.mark.skipif(not os.environ.get("HF_OTHER_PYTHON"), reason="HF_OTHER_PYTHON (a second transformers) not set")
@pytest.mark.parametrize("case", ["gpt2-nobias-untied", "llama-gqa-bias-untied"])
def test_an_export_loads_in_the_other_transformers(case, tmp_path):
    """A folder exported here loads in the other environment's transformers with the same logits and
    greedy tokens, and its tokenizer encodes the same; and a folder that one saves imports here."""
    model = randomize(GPT(GPTConfig(**CASES[case])))
    save_checkpoint(model, tmp_path)
    export.main([f"--out_dir={tmp_path}", "--verify=False"])
    n = min(model.config.vocab_size, len(CHARS))  # the tokenizer's ids
    x = torch.randint(0, n, (2, model.config.block_size))
    with torch.no_grad():
        greedy = model.generate(x[:1, :4], 6, temperature=0, vocab_limit=n)
        torch.save({"x": x, "logits": model(x, targets=x)[0], "greedy": greedy}, tmp_path / "expected.pt")
    script = f"""
import sys, torch, transformers
folder, d = sys.argv[1], sys.argv[2]
e = torch.load(d + '/expected.pt')
m = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
t = transformers.AutoTokenizer.from_pretrained(folder)
with torch.no_grad():
    diff = (m(e['x']).logits - e['logits']).abs().max().item()
    greedy = m.generate(e['x'][:1, :4], max_new_tokens=6, do_sample=False)
assert diff < 1e-5, diff
assert greedy.tolist() == e['greedy'].tolist()
assert t.encode('HELLO, WORLD!') == {[CHARS.index(c) for c in 'HELLO, WORLD!']}
m.save_pretrained(d + '/theirs')
print(transformers.__version__, diff)
"""
    r = subprocess.run([os.environ["HF_OTHER_PYTHON"], "-c", script, str(tmp_path / "hf"), str(tmp_path)],
                       capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stderr[-3000:]
    back = GPT.from_pretrained(str(tmp_path / "theirs")).eval()
    with torch.no_grad():
        assert max_diff(back(x, targets=x)[0], model(x, targets=x)[0]) < 1e-5
