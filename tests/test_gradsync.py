"""
ddp_sync='hooks' (gpt/runtime/distributed.py's GradSync): the gradients averaged by all-reduces started from
gradient hooks, without torch's DDP wrapper. Two gloo ranks on the CPU, float32, each its own batches, 3 steps of
2 micro-steps: the losses and weights of torch's wrapper for AdamW, Muon (shared orthogonalization), bfloat16
reduction and a parameter no step reaches; rank 0's weights everywhere from the start; torch._dynamo never
imported. The settings' checks, and where the CUDA graph may run under torchrun.
"""
import pytest
import torch
from conftest import ROOT, run

from gpt.runtime import distributed
from gpt.runtime.errors import UserError
from gpt.training import stepgraph

RANKS = '''
import sys
from contextlib import nullcontext
dynamo_at_start = 'torch._dynamo' in sys.modules
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
sys.path.insert(0, sys.argv[1])
from gpt import optim
from gpt.runtime import distributed
from gpt.training.step import train_step
from model import GPT, GPTConfig

dist.init_process_group("gloo")
rank = dist.get_rank()
CHOSEN = dict(name="adamw", learning_rate=3e-3, weight_decay=0.1, betas=(0.9, 0.95), muon_lr=0.02,
              muon_weight_decay=0.01, muon_momentum=0.95, muon_shard=True)


def case(sync, name="adamw", reduce_dtype="float32", unused=False):
    torch.manual_seed(rank)  # each rank draws other weights: rank 0's must reach every rank
    model = GPT(GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=16, vocab_size=40, dropout=0.0))
    if unused:
        # the forward pass never reads it; amid the others, so its bucket holds gradients that must be reduced
        model.transformer.h[0].unused = torch.nn.Parameter(torch.ones(8))
    first = {k: v.clone() for k, v in model.state_dict().items()}
    if sync == "hooks":  # small buckets: several all-reduces a step
        wrapped = distributed.wrap(model, "ddp", "cpu", 0, "float32", reduce_dtype=reduce_dtype, bucket_mb=0.004,
                                   sync="hooks")
        assert wrapped is model and len(model.grad_sync.flats) > 3
    elif unused:  # wrap()'s DDP refuses a parameter without a gradient: torch's way of allowing one
        wrapped = DDP(model, find_unused_parameters=True, gradient_as_bucket_view=True)
    else:  # the static graph would reduce on the first micro-step too (other rounding): off
        wrapped = distributed.wrap(model, "ddp", "cpu", 0, "float32", reduce_dtype=reduce_dtype, bucket_mb=0.004,
                                   static_graph=False)
    opt = optim.build(model, dict(CHOSEN, name=name), "cpu")
    scaler = torch.amp.GradScaler("cpu", enabled=False)
    losses = []
    for step in range(3):
        g = torch.Generator().manual_seed(100 * step + rank)  # each rank its own batches
        batches = [(torch.randint(0, 40, (2, 16), generator=g), torch.randint(0, 40, (2, 16), generator=g))
                   for _ in range(2)]
        loss, norm = train_step(wrapped, opt, scaler, batches, 2, nullcontext(), 1.0)
        losses.append((float(loss), float(norm)))
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    return dict(losses=losses, weights=weights, first=first)


out = {}
for name, kw in dict(adamw={}, muon=dict(name="muon"), bf16=dict(reduce_dtype="bfloat16"),
                     unused=dict(unused=True)).items():
    out[name, "hooks"] = case("hooks", **kw)
out["dynamo"] = [dynamo_at_start, 'torch._dynamo' in sys.modules]
for name, kw in dict(adamw={}, muon=dict(name="muon"), bf16=dict(reduce_dtype="bfloat16"),
                     unused=dict(unused=True)).items():
    out[name, "wrapper"] = case("wrapper", **kw)
out["dynamo"].append('torch._dynamo' in sys.modules)  # the wrapper imports it: the check above can fail
torch.save(out, sys.argv[2] + f"/rank{rank}.pt")
dist.barrier()
dist.destroy_process_group()
'''


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("gradsync")
    script = tmp / "ranks.py"
    script.write_text(RANKS)
    run(script, ROOT, tmp, nproc=2)
    return [torch.load(tmp / f"rank{r}.pt", weights_only=False) for r in (0, 1)]


@pytest.mark.parametrize("case", ["adamw", "muon", "bf16", "unused"])
def test_hooks_train_as_the_wrapper_does(ranks, case):
    # the same sums in the same order (each rank's share, then the sum of two): bitwise equal losses, gradient
    # norms and weights; a bucket missed, reduced twice or on a micro-step that should not sync would be off
    for r in ranks:
        hooks, wrapper = r[case, "hooks"], r[case, "wrapper"]
        if case == "unused":  # its zero gradient (the wrapper's is None) joins the norm's sum: its own rounding
            torch.testing.assert_close(hooks["losses"], wrapper["losses"], rtol=0, atol=1e-6)
        else:
            assert hooks["losses"] == wrapper["losses"]
        for k, w in wrapper["weights"].items():
            assert torch.equal(hooks["weights"][k], w), k
    for k, w in ranks[0][case, "hooks"]["weights"].items():  # the ranks end as one model: rank 0's from the start
        assert torch.equal(ranks[1][case, "hooks"]["weights"][k], w), k
    if case == "unused":  # a zero gradient: no decay for a norm-like parameter, so it stays as it was
        assert torch.equal(ranks[1][case, "hooks"]["weights"]["transformer.h.0.unused"], torch.ones(8))


def test_the_ranks_start_from_rank_zeros_weights(ranks):
    first = [r["adamw", "hooks"]["first"] for r in ranks]
    assert any(not torch.equal(first[0][k], first[1][k]) for k in first[0])  # drawn apart: the broadcast matters


def test_hooks_never_import_torch_dynamo(ranks):
    # a fresh process (torchrun's worker): not imported at start, nor after the hooks' wraps and steps; torch's
    # wrapper then imports it (which is why the hooks exist, and what makes this check able to fail)
    for r in ranks:
        assert r["dynamo"] == [False, False, True]


def test_a_bad_ddp_sync_is_one_line():
    good = dict(compile_scope="model", ddp_reduce_dtype="float32", ddp_bucket_mb=100.0)
    assert distributed.check("ddp", dict(good, ddp_sync="hooks"), False, True) == "model"
    with pytest.raises(UserError, match="unknown ddp_sync 'hook': use wrapper or hooks"):
        distributed.check("ddp", dict(good, ddp_sync="hook"), False, True)
    assert not distributed.SETTINGS["ddp_sync"].check[0]("DDP")


def test_the_wrappers_own_options_do_nothing_with_hooks():
    c = dict(ddp_sync="hooks")  # tests/test_settings.py: the note in a run's plan
    for key in ("ddp_bucket_view", "ddp_static_graph"):
        assert "ddp_sync='hooks'" in distributed.SETTINGS[key].unused(c)
        assert not distributed.SETTINGS[key].unused(dict(c, ddp_sync="wrapper"))


def test_the_cuda_graph_under_torchrun_only_with_hooks_over_nccl():
    assert stepgraph.problem('cuda', ('ddp', 'hooks', ''), 'bfloat16', False) is None
    assert stepgraph.problem('cuda', ('ddp', 'hooks', 'cpu:gloo,cuda:nccl'), 'bfloat16', False) is None
    for refused in (('ddp', 'wrapper', ''), ('fsdp', 'hooks', ''), ('ddp', 'hooks', 'gloo')):
        why = stepgraph.problem('cuda', refused, 'bfloat16', False)
        assert why and "torchrun" in why and "ddp_sync='hooks'" in why, refused
