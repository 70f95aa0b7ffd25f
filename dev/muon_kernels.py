"""
How many ops Muon's part of the optimizer step runs, counted on the CPU: a stand-in for the kernels it
launches on a GPU, where for small matrices the launches, not the arithmetic, set the time. The matrices are
GPT-2 124M's 48 (12 blocks x c_attn (q, k, v pieces), attention c_proj, MLP c_fc and c_proj); the counts do
not depend on their width, so --n_embd shrinks them to keep the CPU's Newton-Schulz iterations quick (768 is
GPT-2's).
$ python dev/muon_kernels.py [--n_embd=96] [--n_layer=12] [--top=15]
For the plain step (Python float learning rate, no found_inf) and the CUDA graph's (a 0-dim tensor learning
rate and found_inf) it prints two counts. "aten ops called": torch.profiler's aten ops called from Python (not
from inside another aten op). "kernels": the ops a CUDA graph's capture would record (a TorchDispatchMode, as
tests' FakeGraph), less views and allocations: composite ops (matmul, to, norm) split into the ops that run,
a multi-tensor _foreach_ op once (on CUDA one launch per few dozen tensors, by size; on the CPU a loop op by
op). On CUDA a baddbmm is two kernels (its addend copied into the output, then the matmul), here one.
"""
import argparse
import collections
import contextlib
import io
import os
import sys

import torch
from torch.profiler import ProfilerActivity, profile
from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from gpt.optim import muon  # noqa: E402
from model import GPT, GPTConfig  # noqa: E402

# ops that launch nothing: allocations (views are told by their schema)
FREE = {'empty', 'empty_strided', 'empty_like', 'new_empty', 'lift_fresh', 'detach', '_unsafe_view'}


class Recorder(TorchDispatchMode):
    """The ops that reach the dispatcher from Python, as a CUDA graph's capture (or tests' FakeGraph) sees
    them: composite ops (matmul, to, reshape, norm) already split into the ops that run, and an op's own
    insides (the CPU's loop of a _foreach_ op) not seen."""

    def __init__(self):
        super().__init__()
        self.kernels = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if not func.is_view and name not in FREE:
            self.kernels[name] += 1
        return func(*args, **(kwargs or {}))


def matrices(n_embd, n_layer):
    """A GPT-2-shaped model's blocks' matrices, as Muon takes them: (weight, row splits or None)."""
    model = GPT(GPTConfig(n_layer=n_layer, n_head=n_embd // 32, n_embd=n_embd, block_size=32, vocab_size=64))
    return model.hidden_matrices()


def calls(events):
    """The aten ops called from Python (not from inside another aten op), per name, from a profile."""
    out = collections.Counter()
    for e in events:
        a = e.cpu_parent
        while a is not None and not a.name.startswith('aten::'):
            a = a.cpu_parent
        if e.name.startswith('aten::') and a is None:
            out[e.name] += 1
    return out


def profile_step(n_embd, n_layer, graphed):
    """(aten ops called, kernels), each a Counter by op name, of one Muon step after the first."""
    torch.manual_seed(0)
    mats = matrices(n_embd, n_layer)
    bias = torch.nn.Parameter(torch.zeros(n_embd))  # AdamW's share, not counted
    with contextlib.redirect_stdout(io.StringIO()):  # configure's summary line
        opt = muon.configure(mats, [bias], 6e-4, 0.02, 0.1, 0.0, (0.9, 0.95), 0.95, 'cpu')
    found_inf = torch.zeros(()) if graphed else None
    if graphed:  # as gpt/training/stepgraph.py sets it: one 0-dim tensor for every group
        lr = torch.full((), 6e-4)
        for group in opt.param_groups:
            group['lr'] = lr
    for p, _ in mats:
        p.grad = torch.randn_like(p) * 1e-3
    with torch.no_grad():  # as step() runs it
        opt._muon_step(found_inf)  # the first step makes the momentum buffers
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            opt._muon_step(found_inf)
        with Recorder() as recorder:
            opt._muon_step(found_inf)
    return calls(prof.events()), recorder.kernels


def main():
    parser = argparse.ArgumentParser(description=__doc__.split('\n$')[0], formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument('--n_embd', type=int, default=96)
    parser.add_argument('--n_layer', type=int, default=12)
    parser.add_argument('--top', type=int, default=15, help='the most frequent kernels to list')
    args = parser.parse_args()
    for graphed, name in ((False, 'plain step (float lr, no found_inf)'),
                          (True, 'CUDA graph step (tensor lr, found_inf)')):
        calls, kernels = profile_step(args.n_embd, args.n_layer, graphed)
        print(f"{name}: {sum(calls.values())} aten ops called, {sum(kernels.values())} kernels")
        for op, n in kernels.most_common(args.top):
            print(f"  {n:5d}  {op}")


if __name__ == '__main__':
    main()
