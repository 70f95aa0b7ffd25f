"""
What makes train.py start sooner must not change the run (gpt/plan.py's init_model): a new model's weights
for a seed are nanoGPT's (GPT(GPTConfig(...)) under torch.manual_seed) by default; init_device='device' builds
the model on the run's device; a bad init_device is one error line.
"""
import textwrap

import pytest
import torch
from conftest import flags, run, tiny

from gpt import plan
from model import GPT, GPTConfig

# the speedrun's switches, at a tiny size
SHAPE = dict(n_layer=2, n_head=2, n_embd=32, block_size=32, bias=False, vocab_size=64, qk_norm=True,
             zero_init_proj=True, tie_embeddings=False)


def test_a_new_models_weights_are_nanogpts_for_its_seed():
    """As train.py builds it: plan.build_model, from the plan's seed; the reference is nanoGPT's way. Equal
    bitwise, and the random state outside the build is left as it was."""
    code = textwrap.dedent(f"""
        import torch
        from gpt import plan
        from gpt.plan import Source
        from model import GPT, GPTConfig
        model_config = GPTConfig(**{SHAPE!r}).__dict__
        run = plan.RunPlan(init='scratch', init_from='scratch', source='', model=model_config, block_size=32,
                           world_size=1, micro_steps=1, micro_batch=1, tokens_per_iter=32, max_iters=1, warmup_iters=0,
                           lr_decay_iters=1, out_dir='', earlier_run=(), device='cpu', dtype='float32',
                           settings=dict(init_device='cpu'))
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


def test_init_device_cpu_is_the_default_and_device_cpu_draws_the_same():
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

