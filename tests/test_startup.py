"""
What makes train.py start sooner must not change the run (gpt/training/plan.py's init_model): a new model's weights
for a seed are nanoGPT's (GPT(GPTConfig(...)) under torch.manual_seed) with init_device='cpu', and on a CPU
with the default init_device='device', which builds the model on the run's device; a bad init_device is one
error line; a run that does not compile never imports torch._dynamo.
"""
import textwrap

import pytest
import torch
from conftest import flags, log_rows, run, tiny

from gpt.training import plan
from model import GPT, GPTConfig

# the speedrun's switches, at a tiny size
SHAPE = dict(n_layer=2, n_head=2, n_embd=32, block_size=32, bias=False, vocab_size=64, qk_norm=True,
             zero_init_proj=True, tie_embeddings=False)


def test_a_new_models_weights_are_nanogpts_for_its_seed():
    """As train.py builds it: plan.build_model, from the plan's seed; the reference is nanoGPT's way. Equal
    bitwise, and the random state outside the build is left as it was."""
    code = textwrap.dedent(f"""
        import torch
        from gpt.training import plan
        from gpt.training.plan import Source
        from model import GPT, GPTConfig
        model_config = GPTConfig(**{SHAPE!r}).__dict__
        from types import SimpleNamespace
        # what build_model reads of a plan
        run = SimpleNamespace(model=model_config, block_size=32, device='cpu', settings=dict(init_device='cpu'))
        torch.manual_seed(99)
        outside = torch.get_rng_state()
        model = plan.build_model(run, Source('scratch'), seed=1337)
        assert torch.equal(torch.get_rng_state(), outside), "the build moved the caller's random state"
        torch.manual_seed(1337)
        reference = GPT(GPTConfig(**{SHAPE!r}))
        theirs = reference.state_dict()
        for name, w in model.state_dict().items():
            assert torch.equal(w, theirs[name]), name
        print('equal', len(theirs))
    """)
    r = run("-c", code)
    assert r.stdout.split()[-2] == "equal" and int(r.stdout.split()[-1]) > 10, r.stdout


def test_init_device_device_is_the_default_and_the_cpu_draws_nanogpts_weights():
    """The default draws on the run's device: on a CPU, nanoGPT's weights for the seed (init_device='cpu'
    gives them on a GPU machine too)."""
    from conftest import train_settings
    assert train_settings()['init_device'] == 'device'
    torch.manual_seed(5)
    reference = GPT(GPTConfig(**SHAPE)).state_dict()
    for device in ('cpu', torch.device('cpu')):
        weights = plan.init_model(SHAPE, 5, device).state_dict()
        assert all(torch.equal(weights[k], reference[k]) for k in reference)


def test_init_device_builds_the_model_on_that_device():
    """The device the weights are drawn on is the one they live on (meta stands in for a GPU here)."""
    model = plan.init_model(SHAPE, 5, 'meta')
    assert {p.device.type for p in model.parameters()} == {'meta'}


def test_init_device_device_trains_on_the_cpu(tmp_path, shakespeare_text_path):
    from conftest import write_char_dataset
    data = write_char_dataset(tmp_path / 'data', shakespeare_text_path, chars=20000)
    common = flags(**tiny(max_iters=2, eval_interval=2), data_dir=data, dataset='x')
    a = run("train.py", *common, f"--out_dir={tmp_path / 'a'}")
    b = run("train.py", *common, "--init_device=device", f"--out_dir={tmp_path / 'b'}")
    loss = lambda r: [line for line in r.stdout.splitlines() if line.startswith("step 2:")]
    assert loss(a) and loss(a)[0].split(", ")[:2] == loss(b)[0].split(", ")[:2]  # the CPU is the run's device


@pytest.mark.parametrize("value", ["cuda", "gpu", ""])
def test_a_bad_init_device_is_one_line(value):
    r = run("train.py", *flags(**tiny()), f"--init_device={value}", check=False)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-3000:]
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith(f"error: init_device={value!r} makes no sense") and "'cpu'" in last \
        and "'device'" in last, last



NO_DYNAMO = '''
import runpy, sys
sys.path.insert(0, {root!r})
sys.argv = ["train.py"] + sys.argv[1:]
runpy.run_path({root!r} + "/train.py", run_name="__main__")
print("torch._dynamo imported:", "torch._dynamo" in sys.modules)
'''


@pytest.mark.parametrize("optimizer", [{}, dict(optimizer='muon')], ids=["adamw", "muon"])
def test_a_run_that_does_not_compile_never_imports_torch_dynamo(tmp_path, shakespeare_text_path, optimizer):
    """torch.optim imports torch._dynamo at an optimizer's first add_param_group and step, seconds of a run's
    start-up on a fresh GPU machine; gpt/optim/__init__.py's optimizers do not, nor does anything else a run without
    compile does: training, evaluation, checkpoints, a resume."""
    from conftest import ROOT, write_char_dataset
    data = write_char_dataset(tmp_path / 'data', shakespeare_text_path, chars=20000)
    wrapper = tmp_path / "no_dynamo.py"
    wrapper.write_text(NO_DYNAMO.format(root=ROOT))
    common = flags(**tiny(max_iters=3, eval_interval=2, **optimizer), data_dir=data, dataset='x',
                   out_dir=tmp_path / 'out')
    for extra in ([], ["--init_from=resume", "--max_iters=5"]):
        r = run(str(wrapper), *common, *extra)
        assert r.stdout.strip().splitlines()[-1] == "torch._dynamo imported: False", r.stdout[-2000:]
    assert len(log_rows(tmp_path / 'out')) == 5


BROADCAST = """
import os, sys, torch, torch.distributed as dist
sys.path.insert(0, {root!r})
from gpt.runtime import distributed
from gpt.training import plan
dist.init_process_group("gloo")
model = plan.init_model({shape!r}, seed=100 + dist.get_rank())  # as if each rank's GPU drew other weights
distributed.broadcast_weights(model)
torch.save(model.state_dict(), os.path.join({out!r}, f"rank{{dist.get_rank()}}.pt"))
dist.barrier()
dist.destroy_process_group()  # before exit: gloo can abort a process that leaves with its group open
"""


def test_fsdp_starts_every_rank_from_rank_zeros_weights(tmp_path):
    """FSDP2 shards each rank's own copy; drawn on GPUs of different models, the copies could differ, so
    wrap() first broadcasts rank 0's (DDP does so itself)."""
    from conftest import ROOT
    script = tmp_path / "broadcast.py"
    script.write_text(BROADCAST.format(root=ROOT, shape=SHAPE, out=str(tmp_path)))
    run(str(script), nproc=2)
    reference = plan.init_model(SHAPE, seed=100).state_dict()
    for rank in (0, 1):
        weights = torch.load(tmp_path / f"rank{rank}.pt", weights_only=True)
        assert all(torch.equal(weights[k], reference[k]) for k in reference), rank


def test_a_run_says_where_its_start_up_went(tmp_path, shakespeare_text_path):
    """One line as the first step starts, and one log row with the same parts, which add up to the time since
    launch that the line gives."""
    from conftest import write_char_dataset
    data = write_char_dataset(tmp_path / 'data', shakespeare_text_path, chars=20000)
    r = run("train.py", *flags(**tiny(max_iters=2, eval_interval=2), data_dir=data, dataset='x',
                               out_dir=tmp_path / 'o'), fresh=True)  # its own import of torch is timed
    lines = [line for line in r.stdout.splitlines() if line.startswith("startup: ")]
    assert len(lines) == 1, r.stdout[-2000:]
    (row,) = log_rows(tmp_path / 'o', 'startup')
    parts = {k: v for k, v in row.items() if k not in ('kind', 'step')}
    assert list(parts) == ['import_torch', 'other_imports', 'plan', 'data', 'model',
                           'optimizer_and_state', 'first_evaluation'] and all(v >= 0 for v in parts.values())
    total = float(lines[0].split(" at ")[1].split("s since")[0])
    assert abs(sum(parts.values()) - total) < 0.06 and parts['import_torch'] > 0.1, (lines[0], parts)
    assert f"import torch {parts['import_torch']:.1f}s" in lines[0]


def test_the_start_up_line_and_row_round_the_same_times():
    # 1.34962 s: logged as 1.35, which prints as 1.4; printed from the unrounded time it read 1.3
    import time

    from gpt.monitor.trainlog import Startup
    launch = time.time() - 2
    startup = Startup(launch, launch + 1.34962)
    row, line = startup.row(), startup.line(compiled=False)
    assert row["import_torch"] == 1.35 and "(import torch 1.4s, " in line
    assert all(f"{name.replace('_', ' ')} {seconds:.1f}s" in line for name, seconds in row.items())


def test_cudnn_attention_false_keeps_attention_off_cudnns_kernel():
    """The setting is torch's switch: off, F.scaled_dot_product_attention may not pick cuDNN's kernel."""
    from gpt.runtime import hardware
    before = torch.backends.cuda.cudnn_sdp_enabled()
    try:
        hardware.attention_kernels(cudnn=False)
        assert not torch.backends.cuda.cudnn_sdp_enabled()
        hardware.attention_kernels(cudnn=True)
        assert torch.backends.cuda.cudnn_sdp_enabled()
    finally:
        torch.backends.cuda.enable_cudnn_sdp(before)


@pytest.mark.cuda
def test_without_cudnn_attention_a_gpu_runs_flash_attention_to_the_same_loss():
    """On a GPU, bf16 as training runs: with cudnn_attention=False the profiler sees flash attention's op and
    no cuDNN one, and the loss is the default's to bf16 rounding."""
    from torch.profiler import ProfilerActivity, profile

    from gpt.runtime import hardware
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=2, n_head=2, n_embd=128, block_size=256, bias=False, vocab_size=256)).cuda()
    x = torch.randint(0, 256, (4, 256), device='cuda')
    before, losses = torch.backends.cuda.cudnn_sdp_enabled(), {}
    try:
        for cudnn in (True, False):  # the profile kept is the second's, cuDNN's off
            hardware.attention_kernels(cudnn=cudnn)
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                with torch.autocast('cuda', dtype=torch.bfloat16):
                    _, loss = model(x, x)
                loss.backward()
            losses[cudnn] = loss.item()
        ops = {e.key for e in prof.key_averages()}
        assert 'aten::_scaled_dot_product_flash_attention' in ops, sorted(o for o in ops if 'attention' in o)
        assert not any('cudnn' in o for o in ops), sorted(o for o in ops if 'attention' in o)
        assert abs(losses[True] - losses[False]) < 1e-2 * losses[True], losses
    finally:
        torch.backends.cuda.enable_cudnn_sdp(before)
