"""
HellaSwag: loading (local copy, download, no network), rendering, scoring against a straightforward
per-row computation, batching and DDP splits, a compiled model, and the standalone script.
"""
import io
import json
import os
import re
import urllib.error
import urllib.request

import pytest
import torch
from conftest import run
from torch.nn import functional as F

from gpt.data.tokenizer import Tokenizer
from gpt.runtime import hardware
from gpt.runtime.errors import UserError
from gpt.training import hellaswag_eval as hellaswag
from model import GPT, GPTConfig

RESULT_RE = re.compile(r"^HellaSwag acc_norm: (\d\.\d{4})  acc: (\d\.\d{4})  \((\d+) examples\)$", re.M)

# in the official jsonl's format; endings of quite different lengths, one context longer than small models' blocks
EXAMPLES = [
    ("Roof shingle removal", "A man is sitting on a roof.", "he",
     ["is using wrap to wrap a pair of skis.", "is ripping level tiles off.", "is holding a rubik's cube.",
      "starts pulling up roofing on a roof."], 3),
    ("Clean and jerk", "A lady walks to a barbell. She bends down and grabs the pole.", "the lady",
     ["swings and lands in her arms.", "pulls the barbell forward.", "pulls a rope attached to the barbell.",
      "stands and lifts the weight over her head."], 3),
    ("Baking cookies", "A kitchen is shown with a bowl of flour on the counter. A woman", "",
     ["adds sugar.", "runs outside into the rain and starts to dance wildly around the garden with her dog.",
      "mixes the butter and the sugar together in a large bowl until it is smooth and creamy.", "sleeps."], 2),
    ("Playing guitar", "A boy sits on a stool holding a guitar. He", "",
     ["strums.", "plays a few chords and sings along.", "throws it.",
      "tunes the strings one by one carefully."], 1),
    ("Washing a car", "The man sprays the car with a hose, then scrubs the hood with a big yellow sponge while "
     "the water runs down the driveway and the neighbours watch from across the street. He", "",
     ["rinses the soap off.", "eats a sandwich.", "drives away.", "waxes the car until it shines in the sun."], 0),
    ("Walking the dog", "A woman walks a dog along a beach. The dog", "",
     ["chases a seagull.", "barks.", "flies.", "digs a hole in the sand and buries a stick."], 0),
    ("Painting", "A girl dips a brush in blue paint. She", "",
     ["paints the sky.", "drinks it.", "paints a long line across the paper and then adds some clouds.",
      "cries."], 0),
]


def official(activity, ctx_a, ctx_b, endings, label, ind):
    ctx = f"{ctx_a} {ctx_b}" if ctx_b else ctx_a
    return dict(ind=ind, activity_label=activity, ctx_a=ctx_a, ctx_b=ctx_b, ctx=ctx, split="val",
                split_type="indomain", label=label, endings=endings, source_id=f"activitynet~v_{ind}")


@pytest.fixture(autouse=True)
def no_network(monkeypatch, tmp_path):
    """No test may reach the network or the user's cache folder."""
    def offline(*args, **kwargs):
        raise urllib.error.URLError("no network in tests")
    monkeypatch.setattr(urllib.request, "urlopen", offline)
    monkeypatch.setenv("HELLASWAG_DIR", str(tmp_path / "cache"))


@pytest.fixture(scope="module")
def examples():
    return [official(*e, ind=i) for i, e in enumerate(EXAMPLES)]


@pytest.fixture(scope="module")
def val_file(examples, tmp_path_factory):
    path = tmp_path_factory.mktemp("hellaswag") / "hellaswag_val.jsonl"
    path.write_text("".join(json.dumps(e) + "\n" for e in examples), encoding="utf-8")
    return str(path)


@pytest.fixture(scope="module")
def tok(gpt2_ranks_path):
    return Tokenizer("gpt2")


def tiny_model(block_size=64, seed=0):
    torch.manual_seed(seed)
    model = GPT(GPTConfig(block_size=block_size, vocab_size=50304, n_layer=2, n_head=2, n_embd=32))
    with torch.no_grad():
        model.lm_head.weight.normal_(std=1.0)  # (tied to wte) confident predictions: no near-ties between endings
    return model


def reference(model, example, tok):
    """Each ending's summed and mean completion loss, one row at a time: the row cut to block_size + 1
    tokens from the left, full logits from forward with targets, cross_entropy over the ending's tokens."""
    ctx = tok.encode(example["ctx"])
    sums, means = [], []
    for ending in example["endings"]:
        end = tok.encode(" " + ending)
        ids = torch.tensor((ctx + end)[-(model.config.block_size + 1):])
        with torch.no_grad():
            logits, _ = model(ids[None, :-1], ids[None, 1:])
        losses = F.cross_entropy(logits[0], ids[1:], reduction="none")[-len(end):]
        sums.append(losses.sum().item())
        means.append(losses.mean().item())
    return sums, means


def predictions(model, examples, tok):
    """The independently computed predictions (by sum, by mean), checked to have no near-ties."""
    preds = []
    for example in examples:
        sums, means = reference(model, example, tok)
        for values in (sums, means):
            best, second = sorted(values)[:2]
            assert second - best > 1e-3, "near-tie: pick another seed for the test model"
        preds.append((min(range(4), key=sums.__getitem__), min(range(4), key=means.__getitem__)))
    return preds


@pytest.fixture(scope="module")
def preds(examples, tok):
    """tiny_model()'s predictions for the fixture's examples, row by row."""
    return predictions(tiny_model(), examples, tok)


def expected(examples, preds):
    n = len(examples)
    return dict(acc=sum(e["label"] == p for e, (p, _) in zip(examples, preds)) / n,
                acc_norm=sum(e["label"] == q for e, (_, q) in zip(examples, preds)) / n, n=n)


def run_eval(model, examples, tok, **kw):
    kw = {"pad_multiple": 16, **kw}  # short rows: a 50304-token vocabulary is slow on a small CPU
    return hellaswag.evaluate(model, examples, tok, "cpu", None, **kw)


# loading ---------------------------------------------------------------------------------------------


def test_load_local_file_and_folder(val_file, examples, monkeypatch):
    assert hellaswag.load_examples(val_file) == examples
    assert hellaswag.load_examples(os.path.dirname(val_file)) == examples
    monkeypatch.setenv("HELLASWAG_DIR", os.path.dirname(val_file))
    assert hellaswag.load_examples() == examples


def test_missing_file_without_network_is_a_user_error(tmp_path):
    with pytest.raises(UserError, match=r"could not download HellaSwag \(no network in tests\): put "
                                        r"hellaswag_val.jsonl in .*cache or pass its path") as e:
        hellaswag.load_examples()
    assert "\n" not in str(e.value)
    assert not (tmp_path / "cache").exists()
    with pytest.raises(UserError, match="could not download HellaSwag"):
        hellaswag.load_examples(str(tmp_path / "elsewhere"))
    with pytest.raises(UserError, match="no HellaSwag file at"):
        hellaswag.load_examples(str(tmp_path / "typo.jsonl"))


def test_download_is_kept_in_the_cache(val_file, examples, tmp_path, monkeypatch):
    urls = []

    def fetch(url, timeout):
        urls.append(url)
        with open(val_file, "rb") as f:
            return io.BytesIO(f.read())
    monkeypatch.setattr(urllib.request, "urlopen", fetch)
    assert hellaswag.load_examples() == examples
    assert urls == ["https://raw.githubusercontent.com/rowanz/hellaswag/master/data/hellaswag_val.jsonl"]
    assert os.listdir(tmp_path / "cache") == ["hellaswag_val.jsonl"]  # no temporary file left behind
    assert hellaswag.load_examples() == examples
    assert len(urls) == 1  # the second load used the local copy


def test_bad_files_are_user_errors(tmp_path, monkeypatch):
    bad = tmp_path / "hellaswag_val.jsonl"
    bad.write_text('{"ctx": "a", "endings": ["b", "c", "d", "e"], "label": 1}\n<html>\n')
    with pytest.raises(UserError, match="line 2 is not JSON"):
        hellaswag.load_examples(str(bad))
    bad.write_text('{"ctx": "a", "endings": ["b", "c"], "label": 1}\n')
    with pytest.raises(UserError, match="line 1 is not a HellaSwag example"):
        hellaswag.load_examples(str(bad))
    with pytest.raises(UserError, match="test has no labels"):
        hellaswag.load_examples(str(bad), split="test")
    # a server answering with something else (a captive portal's page) is not cached
    monkeypatch.setattr(urllib.request, "urlopen", lambda url, timeout: io.BytesIO(b"<html>\n"))
    with pytest.raises(UserError, match="could not download HellaSwag .*line 1 is not JSON"):
        hellaswag.load_examples()
    assert not (tmp_path / "cache").exists()


# rendering and scoring -------------------------------------------------------------------------------


def test_render_example(examples, tok):
    example = examples[2]
    tokens, mask, label = hellaswag.render_example(example, tok)
    ctx = tok.encode(example["ctx"])
    ends = [tok.encode(" " + e) for e in example["endings"]]
    width = max(len(ctx) + len(end) for end in ends)
    assert tokens.shape == mask.shape == (4, width) and tokens.dtype == mask.dtype == torch.long
    assert label == 2
    for row, end in enumerate(ends):
        n = len(ctx) + len(end)
        assert tokens[row, :n].tolist() == ctx + end
        assert tokens[row, n:].tolist() == [0] * (width - n)
        assert mask[row].tolist() == [0] * len(ctx) + [1] * len(end) + [0] * (width - n)
    assert tok.decode(tokens[1, len(ctx):len(ctx) + len(ends[1])]) == " " + example["endings"][1]


def test_score_sum_and_mean_can_disagree():
    # ending 0: one token of loss 3 (sum 3, mean 3); ending 1: four tokens of loss 1 (sum 4, mean 1)
    losses = torch.tensor([[0, 3, 0, 0, 0, 9],
                           [0, 1, 1, 1, 1, 9],
                           [0, 2, 2, 2, 0, 9],
                           [0, 5, 0, 0, 0, 9]], dtype=torch.float)
    mask = torch.tensor([[0, 1, 0, 0, 0, 0],
                         [0, 1, 1, 1, 1, 0],
                         [0, 1, 1, 1, 0, 0],
                         [0, 1, 0, 0, 0, 0]])
    pred, pred_norm = hellaswag.score(losses, mask)
    assert (pred.item(), pred_norm.item()) == (0, 1)
    # batched: (examples, 4, T)
    pred, pred_norm = hellaswag.score(torch.stack([losses, losses.flip(0)]), torch.stack([mask, mask.flip(0)]))
    assert pred.tolist() == [0, 3] and pred_norm.tolist() == [1, 2]


def test_evaluate_matches_a_row_by_row_computation(examples, tok, preds):
    model = tiny_model()
    # every example on its own, labelled with the reference's choice by sum: acc is 1, acc_norm says
    # whether the mean agrees
    for example, (p, q) in zip(examples, preds):
        result = run_eval(model, [dict(example, label=p)], tok)
        assert result == dict(acc=1.0, acc_norm=float(p == q), n=1)
    # all at once, batches of 3 examples (the last one partly padding), against the fixture's labels
    assert run_eval(model, examples, tok, batch_examples=3) == expected(examples, preds)
    # labels where sum and mean pick differently, so acc and acc_norm differ
    relabelled = [dict(e, label=p) for e, (p, _) in zip(examples, preds)]
    result = run_eval(model, relabelled, tok, batch_examples=4, pad_multiple=64)
    assert result == expected(relabelled, preds) and result["acc"] == 1.0 and result["acc_norm"] < 1.0


def test_long_rows_lose_their_context_from_the_left(examples, tok):
    model = tiny_model(block_size=16)
    assert max(len(tok.encode(e["ctx"])) for e in examples) > 16  # the fixture has a context too long
    preds = predictions(model, examples, tok)
    for example, (p, q) in zip(examples, preds):
        assert run_eval(model, [dict(example, label=p)], tok) == dict(acc=1.0, acc_norm=float(p == q), n=1)
    assert run_eval(model, examples, tok, batch_examples=2, pad_multiple=64) == expected(examples, preds)


def test_eval_mode_during_and_training_mode_restored(examples, tok):
    model = tiny_model()
    modes = []
    model.register_forward_pre_hook(lambda module, args: modes.append(module.training))
    model.train()
    run_eval(model, examples[:2], tok)
    assert modes == [False] and model.training
    model.eval()
    run_eval(model, examples[:2], tok)
    assert not model.training


def test_ranks_split_the_examples(examples, tok):
    class Recording:
        """A tokenizer that notes the contexts it encodes."""
        def __init__(self):
            self.contexts = set()

        def encode(self, text):
            if not text.startswith(" "):
                self.contexts.add(text)
            return tok.encode(text)

    model = tiny_model()
    whole = run_eval(model, examples, tok, batch_examples=2)
    parts, seen = [], []
    for rank in range(2):
        recording = Recording()
        parts.append(run_eval(model, examples, recording, rank=rank, world_size=2, batch_examples=2))
        seen.append(recording.contexts)
    assert seen[0].isdisjoint(seen[1]) and seen[0] | seen[1] == {e["ctx"] for e in examples}
    assert seen[1] == {e["ctx"] for e in examples[1::2]}
    assert parts[0]["n"] + parts[1]["n"] == whole["n"] == len(examples)
    for key in ("acc", "acc_norm"):  # the correct counts add up
        assert sum(part[key] * part["n"] for part in parts) == pytest.approx(whole[key] * whole["n"])


# compiled models -------------------------------------------------------------------------------------


def test_compiled_model_meets_few_shapes(examples, tok):
    """Batches of many lengths, the last one short, yet a model compiled for static shapes compiles only
    once per multiple of pad_multiple up to block_size (4 here)."""
    from torch._dynamo.testing import CompileCounter
    model = tiny_model()
    eager = run_eval(model, examples * 3, tok, batch_examples=2)
    torch._dynamo.reset()
    counter = CompileCounter()
    compiled = torch.compile(model, backend=counter, dynamic=False)
    assert run_eval(compiled, examples * 3, tok, batch_examples=2) == eager
    assert 1 <= counter.frame_count <= 4
    torch._dynamo.reset()


@pytest.mark.skipif(hardware.compile_problem("cpu") is not None, reason="torch.compile cannot run on this CPU")
def test_inductor_compiled_model(examples, tok):
    model = tiny_model()
    few = examples[:3]
    eager = run_eval(model, few, tok)
    torch._dynamo.reset()
    result = run_eval(torch.compile(model), few, tok)
    torch._dynamo.reset()
    assert result["n"] == 3 and result == eager


# the standalone script -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def checkpoint_dir(tmp_path_factory):
    out_dir = tmp_path_factory.mktemp("out")
    model = tiny_model()
    model_args = dict(n_layer=2, n_head=2, n_embd=32, block_size=64, bias=True, vocab_size=50304, dropout=0.0)
    torch.save(dict(model=model.state_dict(), model_args=model_args, config={}, dataset_meta=None),
               out_dir / "ckpt.pt")
    return out_dir


def script(*args, torchrun=False):
    return run("hellaswag.py", *args, nproc=2 if torchrun else 1).stdout


def test_script(checkpoint_dir, val_file, examples, preds):
    out = script("--init_from=resume", f"--out_dir={checkpoint_dir}", f"--path={val_file}", "--device=cpu",
                 "--limit=5", "--batch_examples=2")
    assert len(RESULT_RE.findall(out)) == 1, out
    want = expected(examples[:5], preds[:5])
    assert RESULT_RE.search(out).groups() == (f"{want['acc_norm']:.4f}", f"{want['acc']:.4f}", "5")


def test_script_errors_are_one_line(checkpoint_dir, tmp_path):
    missing = tmp_path / "missing.jsonl"
    r = run("hellaswag.py", "--init_from=resume", f"--out_dir={checkpoint_dir}", f"--path={missing}", "--device=cpu",
            check=False)
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip() == (f"error: no HellaSwag file at {missing}: "
                                f"give the path of hellaswag_val.jsonl or its folder")


def test_script_under_torchrun(checkpoint_dir, val_file, examples, preds):
    """Two gloo processes: each scores half the examples, the counts are summed, rank 0 prints them."""
    out = script("--init_from=resume", f"--out_dir={checkpoint_dir}", f"--path={val_file}", "--device=cpu",
                 torchrun=True)
    assert len(RESULT_RE.findall(out)) == 1, out
    want = expected(examples, preds)
    assert RESULT_RE.search(out).groups() == (f"{want['acc_norm']:.4f}", f"{want['acc']:.4f}", str(len(examples)))
