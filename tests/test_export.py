"""
export.py: a trained checkpoint becomes a transformers folder that loads offline with AutoModelForCausalLM
(GPT-2 or Llama), gives our logits and our greedy tokens, and carries a tokenizer that encodes as ours
(characters, GPT-2 BPE, a dataset's own tokenizers BPE).
"""
import json
import os
import subprocess
import sys

import pytest
import torch
from conftest import write_char_dataset

import export
from gpt.checkpoint import load_checkpoint, model_from_checkpoint
from gpt.errors import UserError
from gpt.tokenizer import get_tokenizer
from model import GPT, GPTConfig

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = dict(n_layer=2, n_head=2, n_embd=32, block_size=32, batch_size=8, gradient_accumulation_steps=1,
            learning_rate=3e-3, eval_interval=100, eval_iters=1, log_interval=10, warmup_iters=5, lr_decay_iters=20,
            dropout=0.0, compile=False, device="cpu", dtype="float32")


def run(script, *args):
    r = subprocess.run([sys.executable, script, *map(str, args)], cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, f"{script} {args}:\n{r.stdout[-2000:]}\n{r.stderr[-3000:]}"
    return r


def train(data_dir, out_dir, **kw):
    run("train.py", f"--data_dir={data_dir}", f"--out_dir={out_dir}", *[f"--{k}={v}" for k, v in {**TINY, **kw}.items()])
    return out_dir


def ours(out_dir):
    path = os.path.join(out_dir, "ckpt.pt")
    ckpt = load_checkpoint(path)
    return model_from_checkpoint(ckpt, path).eval(), get_tokenizer(ckpt["dataset_meta"])


@pytest.fixture(scope="module")
def char_run(shakespeare_text_path, tmp_path_factory):
    d = tmp_path_factory.mktemp("export_char")
    write_char_dataset(d / "data", shakespeare_text_path)
    # bias=False: transformers' GPT-2 always has biases, so the export fills in zeros
    return train(d / "data", d / "out", dataset="shakespeare_char", max_iters=20, bias=False)


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
    hf = AutoModelForCausalLM.from_pretrained(folder).eval()
    hf_tok = AutoTokenizer.from_pretrained(folder)
    text = "First Citizen:\nBefore we proceed any further, hear me speak."
    x = torch.tensor([tokenizer.encode(text)[:32]])
    assert hf_tok.encode(text) == tokenizer.encode(text)
    assert hf_tok.decode(tokenizer.encode(text)) == text
    with torch.no_grad():
        diff = (model(x, targets=x)[0] - hf(x).logits).abs().max().item()
        assert diff < 1e-4, diff
        greedy = model.generate(x[:, :8], 20, temperature=0)
        hf_greedy = hf.generate(x[:, :8], max_new_tokens=20, do_sample=False)
    assert hf_greedy.tolist() == greedy.tolist()
    # the text-generation pipeline works on the folder as it is, and writes the same text as our greedy decoding
    generate = pipeline("text-generation", model=str(folder))
    out = generate(text[:8], max_new_tokens=20, do_sample=False)[0]["generated_text"]
    assert out == tokenizer.decode(greedy[0].tolist())


def test_gpt2_bpe_export_has_gpt2s_tokenizer_and_never_picks_padding(bpe_run, shakespeare_text_path, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer, pipeline
    folder = tmp_path / "hf"
    export.main([f"--out_dir={bpe_run}", f"--export_dir={folder}"])
    model, tokenizer = ours(bpe_run)
    assert model.config.vocab_size == 50304 and tokenizer.vocab_size == 50257
    hf = AutoModelForCausalLM.from_pretrained(folder).eval()
    assert hf.config.vocab_size == 50304 and hf.config.eos_token_id == 50256
    assert hf.generation_config.suppress_tokens == list(range(50257, 50304))
    assert hf(torch.tensor([[464]])).logits[0, -1].argmax() >= 50257  # a padding id would win, unsuppressed
    # the tokenizer, rebuilt offline from the tiktoken ranks, encodes exactly as tiktoken does
    hf_tok = AutoTokenizer.from_pretrained(folder)
    with open(shakespeare_text_path) as f:
        text = f.read()[-20000:]
    text += " naïve café 😀 <|endoftext|> 1234567   \t\r\n  spaces"
    assert hf_tok.encode(text) == tokenizer.encode(text)
    assert hf_tok.decode(tokenizer.encode(text)) == text
    x = torch.tensor([tokenizer.encode("ROMEO:\nWhat say you, my lord?")])
    with torch.no_grad():
        diff = (model(x, targets=x)[0] - hf(x).logits).abs().max().item()
        assert diff < 1e-4, diff
        # our generate keeps to the tokenizer's ids; suppress_tokens makes transformers do the same
        greedy = model.generate(x, 16, temperature=0, vocab_limit=tokenizer.vocab_size)
        hf_greedy = hf.generate(x, max_new_tokens=16, do_sample=False)
    assert hf_greedy.tolist() == greedy.tolist()
    generate = pipeline("text-generation", model=str(folder))
    out = generate("ROMEO:\nWhat say you, my lord?", max_new_tokens=16, do_sample=False)[0]["generated_text"]
    assert out == tokenizer.decode(greedy[0].tolist())


def test_llama_family_exports_as_llama(tmp_path):
    if "family" not in GPTConfig.__dataclass_fields__:
        pytest.skip("model.py has no llama family yet")
    from transformers import AutoModelForCausalLM
    torch.manual_seed(0)
    config = GPTConfig(family="llama", n_layer=2, n_head=4, n_kv_head=2, n_embd=64, block_size=32, vocab_size=65,
                       bias=False, tie_embeddings=False)
    model = GPT(config).eval()
    meta = {"tokenizer": "char", "vocab_size": 65, "dtype": "uint16", "itos": [chr(32 + i) for i in range(65)]}
    torch.save({"model": model.state_dict(), "model_args": config.checkpoint_args(), "iter_num": 0,
                "best_val_loss": 9.0, "config": {}, "dataset_meta": meta}, tmp_path / "ckpt.pt")
    export.main([f"--out_dir={tmp_path}", "--dtype=bfloat16"])
    hf = AutoModelForCausalLM.from_pretrained(tmp_path / "hf").float().eval()
    assert type(hf).__name__ == "LlamaForCausalLM" and hf.config.num_key_value_heads == 2
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(p.bfloat16().float())  # the export rounded the weights to bfloat16
        x = torch.randint(0, 65, (2, 32))
        assert (model(x, targets=x)[0] - hf(x).logits).abs().max().item() < 1e-4


def test_export_mistakes_are_one_line_errors(tmp_path):
    with pytest.raises(UserError, match="no checkpoint at"):
        export.main([f"--out_dir={tmp_path}"])
    with pytest.raises(UserError, match="dtype must be one of"):
        export.main([f"--out_dir={tmp_path}", "--dtype=int8"])


def test_own_bpe_tokenizer_is_exported_as_it_is(shakespeare_text_path, tmp_path):
    from gpt import tokenizer
    if not hasattr(tokenizer, "dataset_tokenizer"):
        pytest.skip("gpt/tokenizer.py has no tokenizers-JSON datasets yet")
    from transformers import AutoTokenizer
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
    assert hf_tok.eos_token == "<|endoftext|>" and hf_tok.eos_token_id == meta["eot"]
