"""Sampling options: top-p (nucleus) against a plain reference on fixed logits, stopping each sequence at
end-of-text in generate, draw_samples (in-training samples) and sample.py, and no samples at step 0."""
from types import SimpleNamespace

import pytest
import torch

from gpt import generation, schedule
from gpt.evaluation import draw_samples
from model import GPT


def reference_nucleus(logits, top_p):
    """The plain definition: the likeliest tokens, one at a time, until their probabilities reach top_p;
    renormalized over that set."""
    probs = torch.softmax(logits.double(), dim=-1).tolist()
    kept, mass = [], 0.0
    for i in sorted(range(len(probs)), key=lambda i: -probs[i]):
        kept.append(i)
        mass += probs[i]
        if mass >= top_p:
            break
    out = torch.zeros(len(probs), dtype=torch.float64)
    out[kept] = torch.tensor([probs[i] for i in kept], dtype=torch.float64) / mass
    return out


class FixedLogits:
    """A stand-in model for GPT.generate: the same logits (V,) at every position, or logits_at(idx)."""

    def __init__(self, logits=None, logits_at=None, block_size=1000):
        self.config = SimpleNamespace(block_size=block_size)
        self.logits, self.logits_at, self.calls = logits, logits_at, 0
        self.training = False

    def __call__(self, idx, cache=None):
        self.calls += 1
        logits = self.logits_at(idx) if self.logits_at else self.logits.expand(idx.size(0), -1)
        return logits[:, None, :].expand(-1, idx.size(1), -1), None

    def eval(self):
        pass

    def train(self):
        pass

    def generate(self, *args, **kwargs):
        return GPT.generate(self, *args, **{**kwargs, "use_cache": False})  # no KV cache without layers


@pytest.mark.parametrize("top_p", [0.05, 0.5, 0.9, 0.99])
def test_top_p_filter_keeps_the_reference_set(top_p):
    torch.manual_seed(0)
    logits = torch.randn(8, 50) * 3
    kept = generation.top_p_filter(logits, top_p) > -float("inf")
    for row in range(8):
        assert torch.equal(kept[row], reference_nucleus(logits[row], top_p) > 0)


def test_top_p_samples_the_reference_distribution():
    torch.manual_seed(1)
    logits = torch.randn(30) * 2
    ref = reference_nucleus(logits, 0.8)
    model = FixedLogits(logits)
    idx = torch.zeros(4000, 1, dtype=torch.long)
    # the same tokens, from the same generator, as torch.multinomial on the reference distribution
    got = model.generate(idx, 1, top_p=0.8, generator=torch.Generator().manual_seed(7))[:, 1]
    noise = torch.empty(4000, 30).exponential_(1, generator=torch.Generator().manual_seed(7))
    assert torch.equal(got, (ref.float() / noise).argmax(dim=-1))
    counts = torch.bincount(got, minlength=30).double() / 4000
    assert counts[ref == 0].sum() == 0
    assert torch.allclose(counts, ref, atol=0.03)
    # top_p 1.0 is off: the same draws as without it
    g = lambda: torch.Generator().manual_seed(3)
    assert torch.equal(model.generate(idx[:50], 5, generator=g()),
                       model.generate(idx[:50], 5, generator=g(), top_p=1.0))
    with pytest.raises(ValueError, match="top_p"):
        model.generate(idx, 1, top_p=0)


EOT = 9


def script(stops):
    """Greedy logits: row r emits EOT once it has stops[r] new tokens (None: never), else token 1."""
    def logits_at(idx):
        out = torch.zeros(idx.size(0), 10)
        for r, stop in enumerate(stops):
            out[r, EOT if stop is not None and idx.size(1) - 1 >= stop else 1] = 100.0
        return out
    return logits_at


def test_each_sequence_stops_at_eot():
    model = FixedLogits(logits_at=script([2, None]))
    out = model.generate(torch.zeros(2, 1, dtype=torch.long), 12, temperature=0, eot=EOT)
    assert out[0].tolist() == [0, 1, 1] + [EOT] * 10  # stopped, and stays stopped
    assert out[1].tolist() == [0] + [1] * 12
    # every sequence stopped: generation ends early (checked every 8 tokens), the rest filled with eot
    model = FixedLogits(logits_at=script([1, 3]))
    out = model.generate(torch.zeros(2, 1, dtype=torch.long), 40, temperature=0, eot=EOT)
    assert out.shape == (2, 41) and model.calls == 8
    assert out[1].tolist() == [0, 1, 1, 1] + [EOT] * 37
    # without eot nothing changes
    out = FixedLogits(logits_at=script([1])).generate(torch.zeros(1, 1, dtype=torch.long), 4, temperature=0)
    assert out.tolist() == [[0, 1, EOT, EOT, EOT]]


def test_draw_samples_end_at_eot():
    tokenizer = SimpleNamespace(eot=EOT, vocab_size=10, decode=lambda ids: "".join("abcdefghiE"[i] for i in ids))
    texts = draw_samples(FixedLogits(logits_at=script([3, 3])), tokenizer, [0], 2, 10, torch.no_grad(), "cpu", 0)
    assert texts == ["abbb", "abbb"]
    texts = draw_samples(FixedLogits(logits_at=script([3])), tokenizer, [0], 1, 5, torch.no_grad(), "cpu", 0,
                         top_p=0.9, stop_at_eot=False)
    assert texts == ["abbbEE"]


def test_no_samples_at_step_0():
    due = lambda it, eval_only=False: schedule.due(it, 100, eval_only, False, 10, 0, 5, 64, 0).samples
    assert not due(0) and due(5) and due(100) and due(0, eval_only=True)
