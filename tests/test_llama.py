"""
The llama family (its transformers round trips: tests/test_hf.py): KV-cache generation with grouped-query
attention, the model's helpers, checkpoints, and a training run of config/train_llama_shakespeare_char.py
(shrunk), resumed, that sample.py then reads with nothing else.
"""
import math
import os

import pytest
import torch
from conftest import log_rows, run

from gpt.checkpoint import model_from_checkpoint
from gpt.runtime.errors import UserError
from model import GPT, NANOGPT_ARGS, GPTConfig

pytestmark = pytest.mark.usefixtures("one_thread")  # conftest: one thread for the models run here


def tiny(**kw):
    cfg = dict(family="llama", block_size=32, vocab_size=101, n_layer=2, n_head=4, n_kv_head=2, n_embd=32,
               dropout=0.0, bias=False, tie_embeddings=False)
    cfg.update(kw)
    torch.manual_seed(0)
    return GPT(GPTConfig(**cfg))


def test_the_cache_holds_the_key_value_heads_only():
    from gpt.generation import KVCache
    model = tiny(n_head=4, n_kv_head=1).eval()
    cache = KVCache(model.config.n_layer, 16, "cpu")
    with torch.no_grad():
        model(torch.randint(0, 101, (3, 5)), cache=cache)
    assert cache.kv[0].shape == (3, 16, 2, 1, 8) and cache.pos.item() == 5  # (B, capacity, k/v, heads, hs)


def test_helpers_work_for_llama():
    model = tiny()
    n = sum(p.numel() for p in model.parameters())
    assert model.lm_head.weight is not model.transformer.wte.weight
    assert model.get_num_params(non_embedding=False) == n
    assert model.get_num_params() == n - 101 * 32  # the input table is only looked up; lm_head counts
    assert tiny(tie_embeddings=True).get_num_params() == n - 101 * 32  # tied: one table, counted once
    flops = model.flops_per_token() * 32 * 4
    assert model.estimate_mfu(4, 0.1, peak_flops=1e12) == pytest.approx(flops / 0.1 / 1e12)
    decay, nodecay = model.configure_optimizers(0.1, 1e-3, (0.9, 0.95), "cpu").param_groups
    assert len(nodecay["params"]) == 2 * 2 + 1  # the RMSNorm gains: two per block, and ln_f
    assert len(decay["params"]) + len(nodecay["params"]) == len(list(model.parameters()))
    model.crop_block_size(16)
    assert model.config.block_size == 16
    assert model.eval().generate(torch.randint(0, 101, (1, 4)), 20, temperature=0).shape == (1, 24)
    with pytest.raises(AssertionError):
        model(torch.randint(0, 101, (1, 17)))


def test_the_rotary_table_is_float32_and_unsaved_whatever_the_weights_are_cast_to():
    """The model keeps the angles' cos and sin (computed once rather than in every forward); generation casts
    the weights to bf16, and the table must stay what forward computed before: float32, on the model's device."""
    from model import rotary
    model = tiny()
    assert model.rope.dtype == torch.float32 and 'rope' not in model.state_dict()
    cos, sin = rotary(torch.arange(32), 8, 10000.0)
    assert torch.equal(model.rope[0], cos) and torch.equal(model.rope[1], sin)
    model.to(torch.bfloat16)
    assert model.rope.dtype == torch.float32 and torch.equal(model.rope[0], cos)
    model.crop_block_size(16)  # fine-tuning at a shorter context keeps the table of those positions only
    assert model.rope.shape == (2, 16, 8) and torch.equal(model.rope[1], sin[:16])


def test_config_defaults_and_errors():
    for n_embd, hidden in [(384, 1024), (2048, 5504), (4096, 10944)]:  # 8/3 x n_embd, up to a multiple of 64
        assert GPTConfig(family="llama", n_embd=n_embd, n_head=8).mlp_hidden == hidden
    assert GPTConfig(n_embd=64, n_head=4).mlp_hidden == 256 and GPTConfig(n_head=4).n_kv_head == 4
    with pytest.raises(UserError, match="unknown model family"):
        GPTConfig(family="lama")
    with pytest.raises(UserError, match="n_kv_head"):
        GPTConfig(n_head=6, n_kv_head=4, n_embd=48)


def test_checkpoints_record_the_family_and_old_ones_are_gpt2():
    gpt2 = GPTConfig(n_layer=2, n_head=2, n_embd=16, vocab_size=50, block_size=8, bias=False)
    assert set(gpt2.checkpoint_args()) == set(NANOGPT_ARGS)  # nanoGPT can still read ours
    model = tiny()
    args = model.config.checkpoint_args()
    assert args["family"] == "llama" and args["n_kv_head"] == 2 and args["tie_embeddings"] is False
    loaded = model_from_checkpoint({"model": model.state_dict(), "model_args": args})
    idx = torch.randint(0, 101, (2, 10))
    torch.testing.assert_close(loaded(idx)[0], model(idx)[0], rtol=0, atol=0)
    # nanoGPT's model_args have none of the new keys: GPT-2, whose state dict keys are nanoGPT's
    old = GPT(GPTConfig(**gpt2.checkpoint_args()))
    assert old.config.family == "gpt2" and "transformer.wpe.weight" in old.state_dict()
    assert old.lm_head.weight is old.transformer.wte.weight


def test_llama_trains_on_shakespeare_char_resumes_and_samples(corpus_path, tmp_path):
    data_dir, out_dir = tmp_path / "data", tmp_path / "out"
    run(os.path.join("data", "shakespeare_char", "prepare.py"), "--input", corpus_path, "--out_dir", data_dir)
    # the config file, shrunk to a CPU run of steps of 512 tokens: 100 steps, then resumed to 150
    train = lambda steps, *more: run(
        "train.py", "config/train_llama_shakespeare_char.py", f"--data_dir={data_dir}", f"--out_dir={out_dir}",
        "--n_layer=2", "--n_head=4", "--n_kv_head=2", "--n_embd=64", "--block_size=32", "--batch_size=16",
        "--total_batch_size=512",
        "--dropout=0.0", "--learning_rate=2e-3", f"--max_tokens={steps * 512}", f"--warmup_tokens={10 * 512}",
        "--lr_decay_tokens=76800", "--eval_interval=50", "--eval_iters=10", "--log_interval=50",
        "--compile=False", "--device=cpu", "--dtype=float32", *more).stdout
    log = train(100)
    assert "max_tokens=51,200 -> max_iters=100" in log
    resumed = train(150, "--init_from=resume")
    assert "Resuming training from" in resumed
    evals = [(row["step"], row["val_loss"]) for row in log_rows(out_dir, "eval")]
    assert [n for n, _ in evals] == [0, 50, 100, 150], evals
    assert abs(evals[0][1] - math.log(65)) < 0.2
    assert all(b[1] < a[1] for a, b in zip(evals, evals[1:])) and evals[-1][1] < 2.7, evals
    ckpt = torch.load(out_dir / "ckpt.pt", map_location="cpu", weights_only=True)
    assert ckpt["iter_num"] == 150
    assert ckpt["model_args"]["family"] == "llama" and ckpt["model_args"]["tie_embeddings"] is False
    out = run("sample.py", f"--out_dir={out_dir}", "--device=cpu", "--num_samples=1", "--max_new_tokens=60").stdout
    assert "tokenizer: char (65 tokens)" in out
    text = out.split("tokenizer: char (65 tokens)\n", 1)[1].split("\n---------------\n")[0]
    with open(corpus_path, encoding="utf-8") as f:
        assert len(text) == 61 and set(text) <= set(f.read())
