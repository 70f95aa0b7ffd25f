"""
The run plan (gpt/training/plan.py): what the user gave (config.given, whatever the values), the checkpoint or
pretrained model, the data and the machine make one frozen plan. A resumed model is its checkpoint's: every
architecture field the user set that differs is refused in one line, a value equal to train.py's default
included; counts derive from the model's block_size; checkpoints and log.jsonl record the plan; a new
GPTConfig field is handled by its kind alone.
"""
import dataclasses

import numpy as np
import pytest
from conftest import flags, log_rows, run, tiny, train_settings, write_ids_dataset

import configurator
from gpt.checkpoint import load_checkpoint
from gpt.runtime.errors import UserError
from gpt.training import plan
from model import ARCHITECTURE, GPT, GPTConfig

# train.py's settings, at its defaults, for a small resumable run
TRAIN = {**train_settings(), **dict(batch_size=4, gradient_accumulation_steps=1, max_iters=100, warmup_iters=10,
                                    lr_decay_iters=100, init_from='resume', out_dir='out-plan-test-does-not-exist',
                                    device='cpu', dtype='float32', compile=False)}


def given(**kw):
    """Settings as the configurator returns them: train.py's, with these set by the user."""
    return configurator.Config({**TRAIN, **kw}, kw)


def checkpoint_source(run_config=None, **model_args):
    args = {**dict(n_layer=2, n_head=2, n_embd=64, block_size=64, bias=False, vocab_size=16, dropout=0.0),
            **model_args}
    return plan.Source('resume', 'out/ckpt.pt', args, run_config or {})


def make(config, src=None, world_size=1):
    return plan.decide(config, src or checkpoint_source(), None, world_size, 'cpu', 'float32', torchrun=world_size > 1)


def test_a_resumed_model_is_the_checkpoints():
    p = make(given())
    assert (p.model['n_layer'], p.model['n_embd'], p.block_size) == (2, 64, 64)
    assert dict(p.model) == dataclasses.asdict(GPTConfig(n_layer=2, n_head=2, n_embd=64, block_size=64, bias=False,
                                                         vocab_size=16))
    # what the run records is the model that runs, not train.py's defaults
    assert (p.settings['n_layer'], p.settings['block_size']) == (2, 64)
    assert make(given(n_layer=2, n_kv_head=0, mlp_hidden=256)).model['n_layer'] == 2  # the same values: fine
    assert make(given(dropout=0.1, fused_loss=True)).model['dropout'] == 0.1  # runtime fields are the run's


@pytest.mark.parametrize("flags_, named", [
    (dict(n_layer=12), "n_layer=12 (model: 2)"),  # train.py's own default, given: still a request
    (dict(qk_norm=True, mlp_act='relu2'), "qk_norm=True (model: False), mlp_act='relu2' (model: 'gelu')"),
    (dict(logit_softcap=30.0), "logit_softcap=30.0 (model: 0.0)"),
    (dict(pos_emb='rope', value_embeds=1, skip_connections=True),
     "pos_emb='rope' (model: 'learned'), value_embeds=1 (model: 0), skip_connections=True (model: False)"),
    (dict(block_size=32), "block_size=32 (model: 64)"),  # a resumed model's positions are its own
    (dict(family='llama', n_head=4), "n_head=4 (model: 2), family='llama' (model: 'gpt2')"),
])
def test_architecture_the_user_sets_that_differs_is_refused(flags_, named):
    with pytest.raises(UserError) as e:
        make(given(**flags_))
    assert named in str(e.value) and "the checkpoint out/ckpt.pt is a 2-layer, 64-wide gpt2 model" in str(e.value)


def test_a_model_field_this_version_does_not_know_is_refused():
    # a checkpoint from a newer version (or another program): built without the field, it would be another model
    with pytest.raises(UserError, match="out/ckpt.pt describes its model with attn_sinks, which this version"):
        make(given(), checkpoint_source(attn_sinks=4))
    with pytest.raises(UserError, match="out/ckpt.pt: its model fields do not describe a GPT"):
        make(given(), checkpoint_source(n_head="2"))


def test_initialisation_that_would_do_nothing_is_refused():
    with pytest.raises(UserError, match="zero_init_proj=True only sets how a new model's weights start"):
        make(given(zero_init_proj=True))
    # the same command as the run that made the checkpoint, plus --init_from=resume: fine
    assert make(given(zero_init_proj=True), checkpoint_source({'zero_init_proj': True})).model['zero_init_proj']


def test_counts_derive_from_the_models_block_size():
    # total_batch_size in the first run's terms (a block_size=16 model): 128 tokens = 2 micro-steps of 4 x 16,
    # computed from the checkpoint's block_size, not train.py's 1024 (which cannot divide 128 at all)
    p = make(given(total_batch_size=128, max_tokens=1280), checkpoint_source(block_size=16))
    assert (p.micro_steps, p.tokens_per_iter, p.max_iters) == (2, 128, 10)
    assert p.settings['gradient_accumulation_steps'] == 2 and p.settings['max_iters'] == 10
    p = make(given(gradient_accumulation_steps=4), checkpoint_source(block_size=16), world_size=2)
    assert (p.micro_steps, p.settings['gradient_accumulation_steps'], p.tokens_per_iter) == (2, 4, 2 * 2 * 4 * 16)


def test_a_pretrained_model_keeps_its_architecture_but_may_be_cropped():
    src = plan.Source('pretrained', 'gpt2', dict(plan.GPT2_HUB['gpt2'], vocab_size=50257, block_size=1024, bias=True))
    p = make(given(init_from='gpt2', block_size=256, dropout=0.1), src)
    assert (p.block_size, p.model['n_layer'], p.model['vocab_size'], p.model['dropout']) == (256, 12, 50257, 0.1)
    with pytest.raises(UserError, match="block_size=2048 .model: 1024."):
        make(given(init_from='gpt2', block_size=2048), src)
    with pytest.raises(UserError, match="the pretrained model gpt2 is a 12-layer, 768-wide gpt2 model.*n_layer=6"):
        make(given(init_from='gpt2', n_layer=6), src)
    with pytest.raises(UserError, match="zero_init_proj=True only sets"):
        make(given(init_from='gpt2', zero_init_proj=True), src)


def test_heads_that_do_not_divide_the_width_are_named_as_given_with_the_fix():
    """The error names the setting the user gave (n_head), never n_kv_head's value derived from it."""
    scratch = plan.Source('scratch')
    with pytest.raises(UserError) as e:
        make(given(init_from='scratch', n_head=3, n_embd=32), scratch)
    assert str(e.value) == ("n_head=3 does not divide n_embd=32: give an n_head that does (e.g. 2 or 4) or an n_embd "
                            "that 3 divides")
    with pytest.raises(UserError, match=r"^n_kv_head=5 does not divide n_head=4: give an n_kv_head that does, or 0"):
        make(given(init_from='scratch', n_head=4, n_embd=32, n_kv_head=5), scratch)


def test_the_config_line_says_what_the_plan_decided_and_where_every_setting_is():
    config = given(learning_rate=1e-3)
    line = plan.config_line(make(config), config)
    # the checkpoint's model, not train.py's defaults; the learning_rate given is the run's: not repeated
    assert line == ("config: block_size=64 n_layer=2 n_head=2 n_embd=64 n_kv_head=2 mlp_hidden=256 (as the run plan "
                    "decided; every setting: the plan row of out-plan-test-does-not-exist/log.jsonl)")
    config = given(eval_only=True, n_layer=2, n_head=2, n_embd=64, block_size=64, n_kv_head=2, mlp_hidden=256)
    assert plan.config_line(make(config), config) == "config: as given (as the run plan decided)"  # no log


def test_the_plan_is_frozen_and_records_as_plain_data():
    p = make(given())
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.block_size = 8
    with pytest.raises(TypeError):
        p.model['n_layer'] = 8
    record = p.record()
    assert record['model']['n_layer'] == 2 and record['settings']['block_size'] == 64 and record['init'] == 'resume'
    assert all(type(v) in (dict, list, str, int, float, bool, type(None)) for v in record.values())


def test_a_new_architecture_field_needs_no_change_to_resume_or_checkpoints(extra_architecture_field):
    """(test_hf.py's test_a_new_architecture_field_is_refused_on_export_...: the same field, export's side)"""
    name = extra_architecture_field
    assert name in plan.GPTConfig.fields_of(ARCHITECTURE)
    # resume refuses it when the user sets another value than the checkpoint's
    with pytest.raises(UserError, match=f"{name}=5 .model: 3."):
        make(given(**{name: 5}), checkpoint_source(**{name: 3}))
    assert make(given(), checkpoint_source(**{name: 3})).model[name] == 3
    # checkpoints record it where it differs from its default (nanoGPT's keys always)
    model = GPT(plan.GPTConfig(n_layer=1, n_head=2, n_embd=32, block_size=8, vocab_size=16, **{name: 3}))
    assert model.config.checkpoint_args()[name] == 3


# ---- the refused and resumed runs, end to end through train.py -------------------------------------------------

@pytest.fixture(scope="module")
def first_run(tmp_path_factory):
    """A 1-layer model with block_size 16 and zero-initialised projections, trained 3 steps."""
    tmp = tmp_path_factory.mktemp("plan")
    ids = np.random.default_rng(0).integers(0, 16, 3000)
    data = write_ids_dataset(tmp / "data", ids, "abcdefghijklmnop", val=500 / 3000)
    out = tmp / "out"
    settings = tiny(n_layer=1, block_size=16, eval_interval=3, eval_iters=1, data_dir=data, out_dir=out)
    run("train.py", *flags(**settings), "--zero_init_proj=True", "--max_iters=3")
    return settings, out


def resume(first_run, *extra, check=True):
    settings, out = first_run
    return run("train.py", *flags(**{k: v for k, v in settings.items() if k not in ("n_layer", "block_size")}),
               "--init_from=resume", *extra, check=check)


@pytest.mark.parametrize("extra, named", [
    (["--qk_norm=True", "--mlp_act=relu2"], "qk_norm=True (model: False), mlp_act='relu2' (model: 'gelu')"),
    (["--n_layer=12"], "n_layer=12 (model: 1)"),
])
def test_resume_refuses_another_architecture_in_one_line(first_run, extra, named):
    before = (first_run[1] / "ckpt.pt").read_bytes()
    r = resume(first_run, *extra, "--max_iters=6", check=False)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    errors = [line for line in r.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and named in errors[0], r.stderr[-2000:]
    assert (first_run[1] / "ckpt.pt").read_bytes() == before  # nothing touched


def test_resume_past_max_iters_says_there_is_nothing_to_train(first_run):
    before = (first_run[1] / "ckpt.pt").read_bytes()
    r = resume(first_run, "--max_iters=2", "--lr_decay_frac=0.3")
    assert "nothing to train: the checkpoint is at step 3, max_iters=2 (raise --max_iters" in r.stdout, r.stdout
    assert "\nnote: lr_decay_frac=0.3 does nothing here: only lr_schedule='wsd' uses it\n" in r.stdout
    assert r.stdout.count("Resuming training from") == 1
    assert (first_run[1] / "ckpt.pt").read_bytes() == before


def test_resume_in_the_first_runs_terms_runs_and_records_the_plan(first_run):
    # the first run's total_batch_size of 128 tokens: 2 micro-steps of 4 x 16 (the checkpoint's block_size)
    r = resume(first_run, "--total_batch_size=128", "--max_iters=5", "--zero_init_proj=True")
    assert "total_batch_size=128 -> gradient_accumulation_steps=2" in r.stdout
    assert "gradient_accumulation_steps=2" in r.stdout.split("config:")[1]  # the config printed is what ran
    ckpt = load_checkpoint(str(first_run[1] / "ckpt.pt"))
    assert ckpt["iter_num"] == 5 and ckpt["config"]["gradient_accumulation_steps"] == 2
    assert ckpt["config"]["block_size"] == 16 and ckpt["config"]["n_layer"] == 1
    assert ckpt["plan"]["micro_steps"] == 2 and ckpt["plan"]["tokens_per_iter"] == 128
    assert ckpt["plan"]["model"] == dataclasses.asdict(GPTConfig(**{**ckpt["model_args"], "zero_init_proj": True}))
    plans = log_rows(first_run[1], "plan")
    assert [p["init"] for p in plans] == ["scratch", "resume"] and plans[-1]["tokens_per_iter"] == 128
    # tokens trained on: the first run's 3 steps of 64, then this one's of 128, stored and added up
    assert [row["tokens"] for row in log_rows(first_run[1])][-2:] == [3 * 64 + 128, 3 * 64 + 2 * 128]
    assert ckpt["tokens"] == 3 * 64 + 2 * 128 and f"{3 * 64 + 2 * 128:,} tokens" in r.stdout


@pytest.mark.parametrize("case", ["no data", "no checkpoint to resume", "another architecture"])
def test_a_refused_run_leaves_the_disk_as_it_found_it(first_run, tmp_path, case):
    """Every check runs before out_dir is claimed: an earlier run is not moved aside, a new folder not made."""
    settings, out = first_run
    earlier = sorted(p.name for p in out.iterdir())
    base = flags(**{k: v for k, v in settings.items() if k not in ("out_dir", "data_dir")})
    args = {"no data": [f"--data_dir={tmp_path / 'missing'}", f"--out_dir={out}"],
            "no checkpoint to resume": [f"--data_dir={settings['data_dir']}", f"--out_dir={tmp_path / 'new'}",
                                        "--init_from=resume"],
            "another architecture": [f"--data_dir={settings['data_dir']}", f"--out_dir={out}",
                                     "--init_from=resume", "--n_layer=3"]}[case]
    r = run("train.py", *base, *args, check=False)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert sorted(p.name for p in out.iterdir()) == earlier  # nothing moved aside, nothing added
    assert not (tmp_path / "new").exists()


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_bf16_residual_runs_only_under_bf16_and_says_so_otherwise(dtype, capsys):
    config = {**given(bf16_residual=True), 'init_from': 'scratch'}
    p = plan.decide(configurator.Config(config, {'bf16_residual'}), plan.Source('scratch', None, None, None), None,
                    1, 'cpu', dtype, verbose=True)
    assert p.model['bf16_residual'] is (dtype == 'bfloat16') and p.settings['bf16_residual'] is p.model['bf16_residual']
    said = "bf16_residual: off (dtype=float32: the stream takes bfloat16" in capsys.readouterr().out
    assert said is (dtype == 'float32')
