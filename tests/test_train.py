"""
End to end through the real command line: prepare shakespeare_char (from the generated corpus), train a tiny
GPT on the CPU, sample from it, resume it, and sample from a checkpoint laid out the way nanoGPT writes them.
"""
import json
import math
import os
import pickle
import shutil

import pytest
import torch
from conftest import ROOT, flags, log_rows, run, tiny

# a model that learns the corpus' bigrams in a few hundred CPU iterations (~10 s)
TINY = tiny(n_embd=64, batch_size=16, learning_rate=2e-3, min_lr=1e-4, eval_interval=100, eval_iters=10,
            log_interval=10, warmup_iters=20, lr_decay_iters=300)
MAX_ITERS = 300
SEPARATOR = "\n---------------\n"


def train(data_dir, out_dir, **kw):
    return run("train.py", f"--data_dir={data_dir}", "--dataset=shakespeare_char", f"--out_dir={out_dir}",
               *flags(**{**TINY, 'max_iters': MAX_ITERS, **kw}))


def evals(out_dir):
    """(step, train loss, val loss) of each evaluation in the run's log."""
    return [(r["step"], r["train_loss"], r["val_loss"]) for r in log_rows(out_dir, "eval")]


def load(out_dir):
    return torch.load(os.path.join(out_dir, "ckpt.pt"), map_location="cpu", weights_only=True)


def samples(stdout):
    """The generated texts: what sample.py prints after its tokenizer line, between the separators."""
    head, _, body = stdout.partition("\n")
    while not head.startswith("tokenizer:"):
        head, _, body = body.partition("\n")
    assert body.endswith(SEPARATOR), body[-200:]
    return body[:-len(SEPARATOR)].split(SEPARATOR)


@pytest.fixture(scope="session")
def char_data(corpus_path, tmp_path_factory):
    data_dir = tmp_path_factory.mktemp("shakespeare_char") / "data"
    run(os.path.join("data", "shakespeare_char", "prepare.py"), "--input", corpus_path,
        "--out_dir", data_dir)
    with open(data_dir / "meta.json", encoding="utf-8") as f:
        meta = json.load(f)
    assert meta["vocab_size"] == 65
    return data_dir, meta


@pytest.fixture(scope="session")
def trained(char_data, tmp_path_factory):
    """A 300-iteration run: its out_dir."""
    data_dir, _ = char_data
    out_dir = tmp_path_factory.mktemp("run") / "out"
    train(data_dir, out_dir)
    return out_dir


@pytest.fixture(scope="session")
def resumed(char_data, trained, tmp_path_factory):
    """The 300-iteration run, resumed (in a copy of its out_dir) up to 400: (out_dir, its log)."""
    data_dir, _ = char_data
    out_dir = tmp_path_factory.mktemp("resumed") / "out"
    shutil.copytree(trained, out_dir)
    r = train(data_dir, out_dir, init_from="resume", max_iters=MAX_ITERS + 100)
    return out_dir, r.stdout


@pytest.fixture(scope="session")
def sampled(trained):
    return run("sample.py", f"--out_dir={trained}", "--device=cpu", "--num_samples=2",
               "--max_new_tokens=100").stdout


def test_training_lowers_the_loss(trained):
    e = evals(trained)
    assert [n for n, _, _ in e] == [0, 100, 200, 300], e
    first_val, last_val = e[0][2], e[-1][2]
    assert abs(first_val - math.log(65)) < 0.2  # an untrained model guesses uniformly over 65 characters
    assert last_val < 2.7, e  # bigram statistics alone get well below ln 65 = 4.17
    assert all(b[2] < a[2] for a, b in zip(e, e[1:])), e
    assert [r["step"] for r in log_rows(trained)] == list(range(0, MAX_ITERS, 10))
    assert sorted(os.listdir(trained)) == ["ckpt.pt", "log.jsonl"]  # no temp files left by the atomic writes


def test_checkpoint_is_nanogpt_layout(trained):
    out_dir = trained
    ckpt = load(out_dir)  # weights_only=True: plain data only
    assert {"model", "optimizer", "model_args", "iter_num", "best_val_loss", "config"} <= set(ckpt)
    assert ckpt["iter_num"] == MAX_ITERS
    assert ckpt["best_val_loss"] == pytest.approx(min(v for _, _, v in evals(out_dir)), abs=1e-4)
    assert not [k for k in ckpt["model"] if k.startswith(("_orig_mod.", "module."))]
    # the 65 characters and one end-of-text id the data never holds (an exported model's eos and pad)
    assert ckpt["model_args"] == dict(n_layer=2, n_head=2, n_embd=64, block_size=32, bias=False,
                                      vocab_size=66, dropout=0.0)
    given = {**TINY, "max_iters": MAX_ITERS, "dataset": "shakespeare_char", "out_dir": str(out_dir)}
    assert {k: ckpt["config"][k] for k in given} == given
    # the weights load strictly into the model the checkpoint describes
    from model import GPT, GPTConfig
    GPT(GPTConfig(**ckpt["model_args"])).load_state_dict(ckpt["model"], strict=True)
    # AdamW counted one step per iteration for every parameter
    opt_steps = {float(s["step"]) for s in ckpt["optimizer"]["state"].values()}
    assert opt_steps == {float(MAX_ITERS)}


def test_checkpoint_config_holds_only_settings(trained):
    ckpt = load(trained)
    # train.py's own module-level values (its launch time, say) are not settings
    assert not {k for k in ckpt["config"] if "launch" in k}


def test_sample_writes_the_datasets_characters(char_data, sampled):
    _, meta = char_data
    texts = samples(sampled)
    assert len(texts) == 2
    for text in texts:
        assert len(text) == 1 + 100  # the prompt "\n" and 100 new characters
        assert set(text) <= set(meta["itos"]), set(text) - set(meta["itos"])
    assert texts[0] != texts[1]


def test_resume_continues_where_it_stopped(trained, resumed):
    out_dir, log = resumed
    assert "Resuming training from" in log
    # no fresh start: the first evaluation is skipped (the checkpoint was saved right after it), and the
    # first iteration is the checkpoint's; the log goes on from the checkpoint's rows, without repeats
    assert [n for n, _, _ in evals(out_dir)] == [0, 100, 200, 300, MAX_ITERS + 100]
    rows = log_rows(out_dir)
    assert [r["step"] for r in rows] == list(range(0, MAX_ITERS + 100, 10))
    first_loss = rows[MAX_ITERS // 10]["loss"]  # the resumed run's first iteration, MAX_ITERS
    last_loss_before = evals(trained)[-1][1]  # train loss at the last evaluation before
    assert abs(first_loss - last_loss_before) < 0.3, (first_loss, last_loss_before)
    assert first_loss < math.log(65) - 1
    ckpt = load(out_dir)
    assert ckpt["iter_num"] == MAX_ITERS + 100
    # the optimizer state was restored: its step counts go on from the checkpoint's (a fresh AdamW: 100)
    opt_steps = {float(s["step"]) for s in ckpt["optimizer"]["state"].values()}
    assert opt_steps == {float(MAX_ITERS + 100)}


def test_resume_matches_an_uninterrupted_run(char_data, resumed, tmp_path):
    # model, optimizer, learning-rate schedule and data order are all restored: stopping at 300 and
    # resuming to 400 gives the same weights as one run to 400
    data_dir, _ = char_data
    train(data_dir, tmp_path / "out", max_iters=MAX_ITERS + 100)
    straight, resumed_ckpt = load(tmp_path / "out"), load(resumed[0])
    assert straight["model"].keys() == resumed_ckpt["model"].keys()
    for k, v in straight["model"].items():
        torch.testing.assert_close(resumed_ckpt["model"][k], v, rtol=0, atol=1e-6, msg=k)


def test_nanogpt_checkpoint_samples(trained, sampled, tmp_path):
    """A checkpoint as nanoGPT writes it: torch.compile's `_orig_mod.` prefixes, the causal-mask buffers of
    its non-flash attention, a tensor best_val_loss, no dataset metadata inside; the characters are in
    data/<dataset>/meta.pkl beside the scripts."""
    ckpt = load(trained)
    nano = {
        "model": {f"_orig_mod.{k}": v for k, v in ckpt["model"].items()},
        "optimizer": ckpt["optimizer"],
        "model_args": ckpt["model_args"],
        "iter_num": ckpt["iter_num"],
        "best_val_loss": torch.tensor(ckpt["best_val_loss"]),
        "config": {k: v for k, v in ckpt["config"].items() if k != "data_dir"} | {"dataset": "nano_char"},
    }
    T = ckpt["model_args"]["block_size"]
    for i in range(ckpt["model_args"]["n_layer"]):
        nano["model"][f"_orig_mod.transformer.h.{i}.attn.bias"] = torch.tril(torch.ones(T, T)).view(1, 1, T, T)
    # a copy of the scripts, so that data/nano_char/ is created beside them and not in the repository
    repo = tmp_path / "repo"
    repo.mkdir()
    for name in os.listdir(ROOT):
        if name.endswith(".py"):
            shutil.copy(os.path.join(ROOT, name), repo / name)
    shutil.copytree(os.path.join(ROOT, "gpt"), repo / "gpt")
    (repo / "data" / "nano_char").mkdir(parents=True)
    itos = ckpt["dataset_meta"]["itos"]
    with open(repo / "data" / "nano_char" / "meta.pkl", "wb") as f:
        pickle.dump({"vocab_size": len(itos), "itos": dict(enumerate(itos)),
                     "stoi": {c: i for i, c in enumerate(itos)}}, f)
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    torch.save(nano, out_dir / "ckpt.pt")
    r = run("sample.py", f"--out_dir={out_dir}", "--device=cpu", "--num_samples=2", "--max_new_tokens=100",
            cwd=repo)
    assert "tokenizer: char (65 tokens)" in r.stdout
    texts = samples(r.stdout)
    assert all(set(t) <= set(itos) for t in texts)
    # the same weights and seed give the same text as sampling from the original checkpoint
    assert texts == samples(sampled)


def test_cuda_graph_is_off_with_a_note_where_it_cannot_run(char_data, tmp_path):
    # the shipped shakespeare_char config asks for it; on a CPU the same run goes on without it
    data_dir, _ = char_data
    r = train(data_dir, tmp_path / "out", max_iters=20, eval_interval=20, cuda_graph=True)
    assert "cuda_graph: off (needs a CUDA GPU, not cpu)" in r.stdout
    assert [n for n, _, _ in evals(tmp_path / "out")] == [0, 20]
    state = load(tmp_path / "out")['optimizer']
    assert all(type(g['lr']) is float and g['capturable'] is False for g in state['param_groups'])


def test_eval_only_writes_nothing_to_out_dir(char_data, trained, tmp_path):
    """An evaluation (config/eval_gpt2.py's eval_only=True) reads: a new model's evaluation moves no earlier
    run aside, a resumed one's leaves the run's log.jsonl as it was (no rows dropped, none added)."""
    data_dir, _ = char_data
    out = tmp_path / "out"
    shutil.copytree(trained, out)
    before = {name: (out / name).read_bytes() for name in os.listdir(out)}
    resumed_val = evals(trained)[-1][2]
    for init_from in ("resume", "scratch"):
        r = train(data_dir, out, init_from=init_from, eval_only=True, eval_iters=10)
        assert f"eval_only: the losses are printed; nothing is written to {out}" in r.stdout
        step = "step 300" if init_from == "resume" else "step 0"
        assert any(line.startswith(f"{step}: train loss") for line in r.stdout.splitlines()), r.stdout[-2000:]
        assert {name: (out / name).read_bytes() for name in os.listdir(out)} == before, init_from
    assert f"val loss {resumed_val:.4f}" in train(data_dir, out, init_from="resume", eval_only=True).stdout
