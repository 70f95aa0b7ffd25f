"""
gpt/training/stepgraph.py: the training step replayed from a CUDA graph. On the CPU the step runs eagerly, and the
FakeGraph of test_generation.py stands in for the graph: it records the step's ops on their tensors and reruns
them, as a graph reruns its kernels on the same addresses, so a step that read a value back to the CPU,
baked in a Python number (the learning rate) or relied on zero_grad between steps fails here. Both must
train exactly as train.py's plain loop does. The last test captures a real graph on CUDA.
"""
import copy
from contextlib import nullcontext

import pytest
import torch
import torch.nn as nn
from test_generation import FakeGraph

from gpt.checkpoint import portable
from gpt.training import step, stepgraph
from model import GPT, GPTConfig

B, T, V = 4, 16, 64


class Scaled(nn.Module):
    """A GPT whose loss is multiplied by a buffer: setting it to NaN makes one step non-finite."""

    def __init__(self, model):
        super().__init__()
        self.model = model
        self.register_buffer('scale', torch.ones(()))

    def forward(self, x, y):
        logits, loss = self.model(x, y)
        return logits, loss * self.scale


def tiny(device='cpu'):
    torch.manual_seed(0)
    return Scaled(GPT(GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=T, vocab_size=V, dropout=0.0))).to(device)


def adamw(model):
    # train.py's optimizer on CUDA is fused AdamW; the CPU has a fused one too
    return torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.95), weight_decay=0.1, fused=True)


def batches(n, device='cpu'):
    g = torch.Generator().manual_seed(1)
    return [(torch.randint(0, V, (B, T), generator=g).to(device), torch.randint(0, V, (B, T), generator=g).to(device))
            for _ in range(n)]


def plain_step(model, optimizer, data, accum, lr):
    """train.py's loop without the graph: micro-steps, clip at 1.0, skip a non-finite update."""
    step.set_lr(optimizer, lr)
    loss_sum = 0.0
    for _ in range(accum):
        _, loss = model(*next(data))
        loss = loss / accum
        loss_sum += loss.item()
        loss.backward()
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0).item()
    if norm == norm and abs(norm) != float('inf'):
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss_sum, norm


def graph_step(graph, data, accum, lr):
    """train.py's use of the graph: the learning rate, then a step on the next accum micro-batches."""
    step.set_lr(graph.optimizer, lr)
    return graph.run([next(data) for _ in range(accum)])


def fake_capture(self):
    """As StepGraph.capture, with a FakeGraph: recording runs the step, so undo what it did to the weights
    and the optimizer (a real capture runs nothing)."""
    self.optimizer.zero_grad(set_to_none=True)
    self.body(update=False)  # the warm-up: the optimizer's state exists before the capture
    self.optimizer.zero_grad(set_to_none=True)
    saved = copy.deepcopy((self.model.state_dict(), self.optimizer.state_dict()))
    self.graph = FakeGraph()
    with self.graph:
        self.out = self.body()
    self.model.load_state_dict(saved[0])
    with torch.no_grad():  # in place: the recording holds these very tensors
        for group, saved_group in zip(self.optimizer.param_groups, saved[1]['param_groups']):
            for p, i in zip(group['params'], saved_group['params']):
                for k, v in self.optimizer.state[p].items():
                    v.copy_(saved[1]['state'][i][k])


@pytest.mark.parametrize("graphed", [False, True], ids=["eager", "fake-graph"])
@pytest.mark.parametrize("accum", [1, 3])
def test_graph_step_trains_as_the_plain_loop(monkeypatch, graphed, accum):
    if graphed:
        monkeypatch.setattr(stepgraph.StepGraph, "capture", fake_capture)
    steps = 6
    ref, model = tiny(), tiny()
    ref_opt, opt = adamw(ref), adamw(model)
    data = batches(steps * accum + 1)
    lrs = [2**-10 * (i + 1) for i in range(steps)]  # a schedule (exact in float32): each replay reads its rate
    ref_data, graph_data = iter(data), iter(data)
    graph = stepgraph.StepGraph(model, opt, nullcontext(), 1.0, accum, B, T, 'cpu', graphed=graphed)
    for lr in lrs:
        ref_loss, ref_norm = plain_step(ref, ref_opt, ref_data, accum, lr)
        loss, norm = graph_step(graph, graph_data, accum, lr)
        assert loss.item() == pytest.approx(ref_loss, rel=1e-6) and norm.item() == pytest.approx(ref_norm, rel=1e-6)
    # the same kernels on the same numbers: exactly equal (with learning rates that float32 holds exactly)
    for p, q in zip(ref.parameters(), model.parameters()):
        torch.testing.assert_close(q, p, rtol=0, atol=0)
    assert opt.state[next(model.parameters())]['step'].item() == steps
    assert (graph.graph is not None) == graphed


@pytest.mark.parametrize("graphed", [False, True], ids=["eager", "fake-graph"])
def test_a_non_finite_step_is_skipped_on_the_device(monkeypatch, graphed):
    if graphed:
        monkeypatch.setattr(stepgraph.StepGraph, "capture", fake_capture)
    ref, model = tiny(), tiny()
    ref_opt, opt = adamw(ref), adamw(model)
    data = batches(5)
    ref_data, graph_data = iter(data), iter(data)
    graph = stepgraph.StepGraph(model, opt, nullcontext(), 1.0, 1, B, T, 'cpu', graphed=graphed)
    norms = []
    for i in range(4):
        model.scale.fill_(float('nan') if i == 2 else 1.0)
        ref.scale.fill_(float('nan') if i == 2 else 1.0)
        plain_step(ref, ref_opt, ref_data, 1, 2**-10)
        loss, norm = graph_step(graph, graph_data, 1, 2**-10)
        norms.append(norm.item())
    assert norms[2] != norms[2] and all(n == n for n in norms[:2] + norms[3:])  # only step 2 is NaN
    for p, q in zip(ref.parameters(), model.parameters()):
        torch.testing.assert_close(q, p, rtol=0, atol=0)
    assert opt.state[next(model.parameters())]['step'].item() == 3  # the skipped step is not counted


@pytest.mark.parametrize("graphed", [False, True], ids=["eager", "fake-graph"])
@pytest.mark.parametrize("accum", [1, 2])
def test_the_next_batch_is_read_after_the_step_is_queued(monkeypatch, graphed, accum):
    """train.py's micro_batches reads the next batch after handing one over; run() must take exactly accum
    batches before the step and let the generator read the next step's only after it, so the read overlaps the
    GPU's work instead of coming between two steps while the GPU waits."""
    if graphed:
        monkeypatch.setattr(stepgraph.StepGraph, "capture", fake_capture)
    model = tiny()
    graph = stepgraph.StepGraph(model, adamw(model), nullcontext(), 1.0, accum, B, T, 'cpu', graphed=graphed)
    events, data = [], iter(batches(3 * accum + 1))
    if graphed:  # captured first (the fake recording runs the step once); each run() then replays it
        graph.capture()
        replay = graph.graph.replay
        monkeypatch.setattr(graph.graph, "replay", lambda: events.append("step") or replay())
    else:
        body = graph.body
        monkeypatch.setattr(graph, "body", lambda update=True: events.append("step") or body(update))
    held = [next(data)]

    def micro_batches():  # train.py's
        for _ in range(accum):
            yield held[0]
            held[0] = next(data)
            events.append("read")

    for _ in range(3):
        graph.run(micro_batches())
    assert events == (["read"] * (accum - 1) + ["step", "read"]) * 3


def test_portable_state_resumes_without_the_graph():
    model = tiny()
    opt = adamw(model)
    stepgraph.StepGraph(model, opt, nullcontext(), 1.0, 1, B, T, 'cpu', graphed=False)
    state = portable(opt.state_dict())
    assert all(g['lr'] == 0.0 and type(g['lr']) is float and g['capturable'] is False for g in state['param_groups'])
    # a plain (not fused, not capturable) optimizer on the CPU takes it and steps
    plain = torch.optim.AdamW(model.parameters(), lr=1e-3)
    plain.load_state_dict(state)
    _, loss = model(*batches(1)[0])
    loss.backward()
    plain.step()


def test_where_the_graph_cannot_run():
    assert stepgraph.problem('cuda', False, 'bfloat16', False) is None
    assert 'CUDA' in stepgraph.problem('cpu', False, 'float32', False)
    assert 'torchrun' in stepgraph.problem('cuda', ('ddp', 'wrapper', ''), 'bfloat16', False)  # tests/test_gradsync.py
    assert 'bfloat16' in stepgraph.problem('cuda', False, 'float16', False)
    assert 'activation_checkpointing' in stepgraph.problem('cuda', False, 'bfloat16', True)


@pytest.mark.cuda
@pytest.mark.parametrize("accum", [1, 2])
def test_cuda_graph_step_matches_the_plain_loop(accum):
    """A real capture: the replayed step trains as the eager one does (the same kernels)."""
    ref, model = tiny('cuda'), tiny('cuda')
    ref_opt, opt = adamw(ref), adamw(model)
    data = batches(6 * accum + 1, 'cuda')
    ref_data, graph_data = iter(data), iter(data)
    graph = stepgraph.StepGraph(model, opt, nullcontext(), 1.0, accum, B, T, 'cuda')
    for i in range(6):
        ref_loss, _ = plain_step(ref, ref_opt, ref_data, accum, 2**-10 * (i + 1))
        loss, _ = graph_step(graph, graph_data, accum, 2**-10 * (i + 1))
        assert loss.item() == pytest.approx(ref_loss, rel=1e-6)
    assert graph.graph is not None
    for p, q in zip(ref.parameters(), model.parameters()):
        torch.testing.assert_close(q, p, rtol=0, atol=0)


def fake_eval_capture(self):
    """EvalGraph.capture with a FakeGraph (recording runs the forward, which changes nothing)."""
    self.graph = FakeGraph()
    with self.graph:
        self.loss = self.body()


class Windows:
    """estimate_loss's loader: the same batches at every evaluation."""

    def __init__(self, data):
        self.data = iter(data)

    def next_batch(self):
        return next(self.data)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_evaluations_graph_gives_the_eager_losses_as_the_weights_train(monkeypatch, dtype):
    """Evaluations between graphed steps: the replayed forward reads the weights as they are at each one (under
    autocast too, whose cached casts would be stale copies), equal to the eager forward's losses."""
    monkeypatch.setattr(stepgraph.StepGraph, "capture", fake_capture)
    monkeypatch.setattr(stepgraph.EvalGraph, "capture", fake_eval_capture)
    from gpt.training.evaluation import estimate_loss
    model = tiny()
    ctx = torch.autocast('cpu', dtype=dtype, enabled=dtype != torch.float32)
    graph = stepgraph.StepGraph(model, adamw(model), ctx, 1.0, 1, B, T, 'cpu')
    data, evals = iter(batches(4)), batches(3)
    seen = []
    for _ in range(3):
        got = estimate_loss(model, lambda split: Windows(evals), 3, ctx, 'cpu', forward=graph.eval_loss)
        want = estimate_loss(model, lambda split: Windows(evals), 3, ctx, 'cpu')
        assert got == want and model.training
        seen.append(got['val'])
        graph_step(graph, data, 1, 2**-6)
    assert len(set(seen)) == 3  # the weights moved between evaluations
    assert isinstance(graph.eval_loss.graph, FakeGraph)


@pytest.mark.cuda
def test_cuda_evaluations_graph_matches_the_eager_forward():
    """A real capture of the evaluations' forward, under bf16 autocast, between real graphed steps."""
    from gpt.training.evaluation import estimate_loss
    model = tiny('cuda')
    ctx = torch.autocast('cuda', dtype=torch.bfloat16)
    graph = stepgraph.StepGraph(model, adamw(model), ctx, 1.0, 1, B, T, 'cuda')
    data, evals = iter(batches(4, 'cuda')), batches(3, 'cuda')
    seen = []
    for _ in range(3):
        got = estimate_loss(model, lambda split: Windows(evals), 3, ctx, 'cuda', forward=graph.eval_loss)
        assert got == pytest.approx(estimate_loss(model, lambda split: Windows(evals), 3, ctx, 'cuda'), rel=1e-6)
        seen.append(got['val'])
        graph_step(graph, data, 1, 2**-6)
    assert len(set(seen)) == 3 and graph.eval_loss.graph is not None
