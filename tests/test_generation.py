"""
generation.py: the fixed-shape KV cache, and the decode step that CUDA replays from a graph. On the CPU the
step runs eagerly; FakeGraph stands in for a CUDA graph (it records the step's ops with the tensors they
read and write, and replays them on those same tensors, as a graph reruns its kernels on the same
addresses), so the logic the GPU relies on is checked here too. The last test captures real graphs on CUDA.
"""
from types import SimpleNamespace

import pytest
import torch
import torch.utils._pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

from gpt import generation
from gpt.training import schedule
from gpt.training.evaluation import draw_samples
from model import GPT, GPTConfig

# the model families, and gpt2 with the speedrun switches that change what the cache holds or how layers connect
FAMILIES = ["gpt2", "llama", "gpt2-switches"]


def tiny(family, **kw):
    cfg = dict(block_size=32, vocab_size=101, n_layer=2, n_head=4, n_embd=32, dropout=0.0, family=family)
    if family == "llama":  # with grouped-query attention
        cfg.update(n_kv_head=2, bias=False, tie_embeddings=False)
    if family == "gpt2-switches":  # 4 layers: the first and last mix a value embedding, the middle two do not
        cfg.update(family="gpt2", n_layer=4, pos_emb="rope", value_embeds=1, skip_connections=True, qk_norm=True)
    cfg.update(kw)
    torch.manual_seed(0)
    model = GPT(GPTConfig(**cfg)).eval()
    with torch.no_grad():  # the switches' scalars off their initial 0.5 and 1, so that a wrong one would show
        for name, p in model.named_parameters():
            if name.endswith(("ve_lambdas", "skip_weights")):
                p.add_(torch.randn_like(p) * 0.5)
    return model


class FakeGraph(TorchDispatchMode):
    """Records every op run under it; replay() runs them again on the tensors they had, writing each
    result into the tensor the recording made. A step that baked in a Python number (a position) or
    allocated anew would replay the wrong thing; one that read a value back to the CPU fails here."""

    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        assert func is not torch.ops.aten._local_scalar_dense.default, "the step reads a value back to the CPU"
        out = func(*args, **(kwargs or {}))
        self.ops.append((func, args, kwargs or {}, out))
        return out

    def replay(self):
        for func, args, kwargs, out in self.ops:
            # on the raw memory, as a graph's kernels: detached, autograd neither records nor checks anything
            args, kwargs = pytree.tree_map_only(torch.Tensor, torch.Tensor.detach, (args, kwargs))
            new = func(*args, **kwargs)
            for o, n in zip(pytree.tree_leaves(out), pytree.tree_leaves(new)):
                if isinstance(o, torch.Tensor) and o.data_ptr() != n.data_ptr():  # not in place, not a view
                    o.detach().copy_(n)


@pytest.fixture
def fake_graphs(monkeypatch):
    """generate() on the graph path, with FakeGraph for CUDA graphs; yields the list of captures."""
    captures = []

    def capture(self, model):
        pos = self.cache.pos.clone()
        self.graph = FakeGraph()
        with self.graph:
            self.logits = model(self.token, cache=self.cache)[0][:, -1]
        self.cache.pos.copy_(pos)  # a capture runs nothing: the first replay takes this step
        captures.append(self)

    monkeypatch.setattr(generation, "uses_graphs", lambda model, device, cuda_graphs=True: cuda_graphs)  # as on a GPU
    monkeypatch.setattr(generation.Decoder, "capture", capture)
    yield captures


@pytest.mark.parametrize("family", FAMILIES)
def test_step_logits_match_the_full_forward(family):
    model = tiny(family)
    idx = torch.randint(0, 101, (3, 12))
    dec = generation.Decoder(model.config.n_layer, 3, 32, "cpu", graphed=False)
    with torch.no_grad():
        steps = [dec.prefill(model, idx[:, :5])] + [dec.step(model, idx[:, [t]]) for t in range(5, 12)]
        for t, logits in zip(range(5, 13), steps):
            torch.testing.assert_close(logits, model(idx[:, :t])[0][:, -1], rtol=1e-5, atol=1e-5)
    assert dec.cache.pos.item() == 12


@pytest.mark.parametrize("family", FAMILIES)
def test_the_step_keeps_its_buffers_and_reads_nothing_back(family):
    model = tiny(family)
    dec = generation.Decoder(model.config.n_layer, 2, 32, "cpu", graphed=False)
    with torch.no_grad():
        dec.prefill(model, torch.randint(0, 101, (2, 4)))
        buffers = lambda: [t.data_ptr() for kv in dec.cache.kv for t in kv] + [dec.cache.pos.data_ptr()]
        before = buffers()
        for _ in range(3):
            dec.step(model, torch.randint(0, 101, (2, 1)))
        assert buffers() == before  # a graph replays on the addresses it captured
        # on the meta device no value can be read: the step runs all the same (prefill too)
        meta = generation.Decoder(model.config.n_layer, 2, 32, "meta", graphed=False)
        model.to("meta")
        meta.prefill(model, torch.zeros(2, 4, dtype=torch.long, device="meta"))
        assert meta.step(model, torch.zeros(2, 1, dtype=torch.long, device="meta")).shape == (2, 101)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("prompt_len", [1, 5, 31])
def test_graph_path_greedy_matches_uncached(fake_graphs, family, prompt_len):
    model = tiny(family)
    idx = torch.randint(0, 101, (2, prompt_len))
    # 40 new tokens runs past block_size=32: the cropped window is recomputed, as without the cache
    graphed = model.generate(idx, 40, temperature=0)
    plain = model.generate(idx, 40, temperature=0, use_cache=False)
    assert len(fake_graphs) == 1 and graphed.shape == (2, prompt_len + 40)
    assert torch.equal(graphed, plain)
    assert torch.equal(model.generate(idx, 10, top_k=1), plain[:, :prompt_len + 10])  # top_k=1 is greedy


def test_graph_path_samples_from_the_given_generator(fake_graphs):
    model = tiny("llama")
    idx = torch.randint(0, 101, (2, 3))
    sample = lambda seed: model.generate(idx, 20, top_k=50, generator=torch.Generator().manual_seed(seed))
    a = sample(1)
    torch.manual_seed(123)  # the global stream must not matter
    assert torch.equal(a, sample(1)) and not torch.equal(a, sample(2))
    assert len(fake_graphs) == 1  # one shape, one capture


def test_a_kept_graph_is_reused_and_rebuilt_when_what_it_captured_changes(fake_graphs):
    model = tiny("gpt2")
    long, short = torch.randint(0, 101, (2, 20)), torch.randint(0, 101, (2, 3))
    plain = lambda idx: model.generate(idx, 12, temperature=0, use_cache=False)
    assert torch.equal(model.generate(long, 12, temperature=0), plain(long))
    # the same capacity (block_size): reused, and the longer prompt's keys left in its slots stay masked
    assert torch.equal(model.generate(short, 12, temperature=0), plain(short))
    assert len(fake_graphs) == 1
    model.generate(short[:1], 12, temperature=0)  # another batch size: another graph
    model.double()  # the weights move: the graph would read the old ones
    assert torch.equal(model.generate(short, 12, temperature=0), plain(short))
    assert len(fake_graphs) == 3 and model._decoder is fake_graphs[-1]


@pytest.mark.parametrize("graphs", [False, True], ids=["eager-step", "graph-step"])
def test_compiled_step_matches_uncached(monkeypatch, fake_graphs, graphs):
    # sample.py --compile=True: the one-token step is compiled with fixed shapes (here with dynamo's eager
    # backend, which traces the same way in seconds), once per decoder; the prompt runs uncompiled
    compiled, real_compile = [], torch.compile
    monkeypatch.setattr(torch, "compile", lambda m, **kw: compiled.append(kw) or real_compile(m, backend="eager", **kw))
    model = tiny("llama")
    idx = torch.randint(0, 101, (2, 5))
    fast = model.generate(idx, 20, temperature=0, compile_step=True, cuda_graphs=graphs)
    assert torch.equal(fast, model.generate(idx, 20, temperature=0, use_cache=False))
    assert compiled == [dict(dynamic=False)] and len(fake_graphs) == int(graphs)


def test_graphs_only_where_they_can_work():
    model = tiny("gpt2")
    assert generation.uses_graphs(model, "cuda") and generation.uses_graphs(model, torch.device("cuda", 1))
    assert not generation.uses_graphs(model, "cpu") and not generation.uses_graphs(model, "mps")
    assert not generation.uses_graphs(model.train(), "cuda")  # dropout draws random numbers
    assert not generation.uses_graphs(model.eval(), "cuda", cuda_graphs=False)  # the caller said no


def test_the_step_runs_as_each_call_asks(monkeypatch, fake_graphs):
    # what a call asks for holds for that call alone (no module setting survives it); only the graphed
    # decoder is kept on the model, as a cache keyed by what it captured, compile_step included
    compiled, real_compile = [], torch.compile
    monkeypatch.setattr(torch, "compile", lambda m, **kw: compiled.append(kw) or real_compile(m, backend="eager", **kw))
    model = tiny("gpt2")
    idx = torch.randint(0, 101, (2, 5))
    plain = model.generate(idx, 10, temperature=0, use_cache=False)
    assert torch.equal(model.generate(idx, 10, temperature=0, cuda_graphs=False), plain)
    assert fake_graphs == [] and "_decoder" not in model.__dict__  # eager: nothing captured, nothing kept
    assert torch.equal(model.generate(idx, 10, temperature=0, compile_step=True), plain)
    assert len(fake_graphs) == 1 and len(compiled) == 1 and model._decoder.step_model is not model
    assert torch.equal(model.generate(idx, 10, temperature=0), plain)  # the defaults again: graphed, not compiled
    assert len(fake_graphs) == 2 and len(compiled) == 1 and model._decoder.step_model is model
    assert torch.equal(model.generate(idx, 10, temperature=0), plain)  # the same again: the kept graph
    assert len(fake_graphs) == 2


def test_progress_counts_every_new_token():
    model = tiny("gpt2")
    for use_cache in (True, False):
        calls = []
        model.generate(torch.randint(0, 101, (1, 20)), 25, top_k=5, use_cache=use_cache,
                       progress=lambda calls=calls: calls.append(1))  # past block_size too
        assert len(calls) == 25


@pytest.mark.cuda
@pytest.mark.parametrize("family", FAMILIES)
def test_cuda_graphs_match_uncached(family):
    model = tiny(family, n_embd=64).cuda().to(torch.bfloat16)
    idx = torch.randint(0, 101, (3, 5), device="cuda")
    graphed = model.generate(idx, 40, temperature=0)
    assert model._decoder.graph is not None
    assert torch.equal(graphed, model.generate(idx, 40, temperature=0, use_cache=False))
    assert torch.equal(model.generate(idx, 40, temperature=0), graphed)  # the kept graph, replayed again


@pytest.mark.cuda
def test_cuda_graph_of_the_compiled_step():
    model = tiny("gpt2", n_embd=64).cuda().to(torch.bfloat16)
    idx = torch.randint(0, 101, (3, 5), device="cuda")
    graphed = model.generate(idx, 40, temperature=0, compile_step=True)
    assert model._decoder.graph is not None and model._decoder.step_model is not model
    assert torch.equal(graphed, model.generate(idx, 40, temperature=0, use_cache=False))


# Sampling options: top-p (nucleus) against a plain reference on fixed logits, stopping each sequence at
# end-of-text in generate, draw_samples (in-training samples) and sample.py, and no samples at step 0.


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
