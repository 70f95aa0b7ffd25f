"""
Settings the user gave that the run's other settings make do nothing: named in a note line each (the rules
declared with each setting, gpt/runtime/settings.py's notes), never accepted in silence.
"""
from conftest import declarations

import configurator
from gpt.runtime.settings import notes as notes_of

TRAIN, SAMPLE = declarations("train.py"), declarations("sample.py")


def inert(config):
    return notes_of(config, TRAIN)


def inert_sample(config):
    return notes_of(config, SAMPLE)


def test_settings_given_that_do_nothing_are_named():
    base = dict(decay_lr=True, lr_schedule='cosine', warmup_iters=10, warmup_tokens=0, lr_decay_iters=100,
                lr_decay_tokens=0, lr_decay_frac=0.2, min_lr=6e-5, optimizer='adamw', muon_lr=0.02, muon_momentum=0.95,
                muon_weight_decay=0.0, muon_shard=True, sample_interval=0, sample_prompt="Hi", sample_max_tokens=32,
                sample_top_p=1.0, num_samples_train=4, dashboard=False, dashboard_port=8000, compile=True,
                compile_scope='model', keep_checkpoints=0, checkpoint_interval=0, ckpt_every_tokens=0,
                total_batch_size=0, gradient_accumulation_steps=5, scalar_lr=0.04, init_from='scratch',
                value_embeds=0, skip_connections=False)

    def notes(given, **values):
        return inert(configurator.Config({**base, **values}, given))
    assert notes(base.keys()) == ["lr_decay_frac=0.2 does nothing here: only lr_schedule='wsd' uses it",
                                  *[f"{k}={base[k]!r} does nothing here: optimizer='adamw' trains without Muon"
                                    for k in ("muon_lr", "muon_momentum", "muon_weight_decay", "muon_shard",
                                              "scalar_lr")],
                                  "sample_prompt='Hi' does nothing here: sample_interval=0 draws no samples during "
                                  "training", *[f"{k}={base[k]!r} does nothing here: sample_interval=0 draws no "
                                                f"samples during training" for k in ("sample_max_tokens",
                                                                                     "sample_top_p",
                                                                                     "num_samples_train")],
                                  "dashboard_port=8000 does nothing here: dashboard=False serves no dashboard"]
    assert notes(()) == []  # train.py's defaults, given by nobody: nothing to say
    # Muon's rate for learned scalars, on a model without any; with them (or resuming a model that may have
    # them) it is used
    assert notes({"scalar_lr"}, optimizer='muon') == [
        "scalar_lr=0.04 does nothing here: the model has no learned scalars (value_embeds, skip_connections)"]
    assert notes({"scalar_lr"}, optimizer='muon', skip_connections=True) == []
    assert notes({"scalar_lr"}, optimizer='muon', init_from='resume') == []
    assert notes({"dashboard"}, dashboard=True, eval_only=True) == [
        "dashboard=True does nothing here: eval_only writes no log for the page to show"]
    assert notes({"gradient_accumulation_steps"}, total_batch_size=4096) == [
        "gradient_accumulation_steps=5 does nothing here: total_batch_size=4,096 sets the batch; the micro-steps "
        "follow from it and batch_size"]
    # the schedule's: a flag that turns a config file's setting off
    assert notes({"lr_decay_iters", "lr_schedule"}, lr_schedule='wsd') == [
        "lr_decay_iters=100 does nothing here: only lr_schedule='cosine' decays over lr_decay_iters (this run: "
        "'wsd', which decays over the last lr_decay_frac of max_iters)"]
    assert notes({"warmup_iters", "min_lr", "lr_schedule"}, decay_lr=False) == [
        "warmup_iters=10 does nothing here: decay_lr=False is nanoGPT's constant learning_rate without warm-up "
        "(lr_schedule='constant' warms up, then stays)",
        "min_lr=6e-05 does nothing here: a constant learning_rate never decays to it",
        "lr_schedule='cosine' does nothing here: decay_lr=False keeps learning_rate constant, whatever the schedule"]
    assert notes({"compile_scope", "keep_checkpoints"}, compile=False, checkpoint_interval=-1, keep_checkpoints=3) \
        == ["keep_checkpoints=3 does nothing here: checkpoint_interval=-1 saves no checkpoints",
            "compile_scope='model' does nothing here: compile=False compiles nothing"]
    assert notes({"muon_momentum", "lr_decay_frac", "sample_prompt"}, optimizer='muon', lr_schedule='wsd',
                 sample_interval=10) == []  # each in use


def test_sample_settings_that_do_nothing_are_named():
    base = dict(temperature=0.8, top_k=200, top_p=1.0, init_from='resume', out_dir='out')
    notes = lambda given, **kw: inert_sample(configurator.Config({**base, **kw}, given))  # noqa: E731
    assert notes({"top_k", "top_p", "out_dir"}) == []
    assert notes({"top_k", "top_p", "out_dir"}, temperature=0.0, init_from='gpt2') == [
        "out_dir='out' does nothing here: init_from='gpt2' loads that model, not out_dir's checkpoint",
        "top_k=200 does nothing here: temperature=0 decodes greedily (the likeliest token), so no token is drawn",
        "top_p=1.0 does nothing here: temperature=0 decodes greedily (the likeliest token), so no token is drawn"]


def other_values(value):
    """Values of a setting's type besides its default: where a rule that makes another setting do nothing is
    looked for."""
    if isinstance(value, bool):
        return [not value]
    if isinstance(value, (int, float)):
        return [type(value)(v) for v in (0, -1, 1, 4096) if v != value]
    return ['', 'x', 'resume', 'muon', 'constant', 'wsd', 'blocks', 'hooks', 'fsdp']


def inert_runs(declared, base):
    """{setting: [(the settings of a run where it does nothing, why)]} for every declaration with an `unused`
    rule: the defaults, then each other setting changed to each of other_values."""
    runs = {}
    for key, s in declared.items():
        if s.unused is None:
            continue
        tries = [base] + [{**base, other: v} for other in base if other != key for v in other_values(base[other])]
        for values in tries:
            try:
                why = s.unused(values)
            except (KeyError, TypeError, ValueError):  # a value the rule cannot read: not a run
                continue
            if why:
                runs.setdefault(key, []).append((values, why))
    return runs


def test_every_unused_rule_names_its_setting_in_a_run_it_cannot_act_in(tmp_path):
    """Generated from the declarations: every setting of train.py with an `unused` rule, given in a run the
    rule says it does nothing in, is named in one of the run plan's notes (or its error)."""
    from conftest import tiny

    from gpt.runtime.errors import UserError
    from gpt.training import plan
    base = {**{k: s.default for k, s in TRAIN.items()}, **tiny(), 'out_dir': str(tmp_path / 'out'), 'max_iters': 20}
    runs = inert_runs(TRAIN, base)
    ruled = [k for k, s in TRAIN.items() if s.unused is not None]
    assert {'dataset', 'always_save_checkpoint', 'keep_checkpoints', 'compile_scope', 'muon_lr'} <= set(ruled)
    assert sorted(runs) == sorted(ruled), "a rule that no run makes true"
    for key in ruled:
        said = []
        for values, why in runs[key]:
            config = configurator.Config(values, {key}, TRAIN)
            try:
                plan.check_settings(config)
                fsdp = values['parallelism'] == 'fsdp'  # two processes under torchrun, as fsdp needs
                run = plan.decide(config, plan.Source('scratch'), None, 1 + fsdp, 'cpu', 'float32', torchrun=fsdp,
                                  data=(str(tmp_path), 'the data', ''))
            except UserError as e:  # the run is refused: the settings that made it so are named there
                said.append(str(e))
                continue
            assert f"{key}={values[key]!r} does nothing here: {why}" in run.notes
            said.append("noted")
            break
        assert "noted" in said or any(line.startswith(f"{key}=") for line in said), (key, said[:3])


def test_every_unused_rule_of_sample_py_is_said():
    base = {k: s.default for k, s in SAMPLE.items()}
    runs = inert_runs(SAMPLE, base)
    assert set(runs) == {k for k, s in SAMPLE.items() if s.unused is not None} >= {'top_k', 'top_p', 'out_dir'}
    for key, found in runs.items():
        for values, why in found:
            assert f"{key}={values[key]!r} does nothing here: {why}" in inert_sample(
                configurator.Config(values, {key}, SAMPLE))


def test_a_dataset_beside_a_data_dir_and_a_save_rule_beside_an_interval_are_named():
    def notes(given, **values):
        return inert(configurator.Config({**dict(dataset='openwebtext', data_dir='', checkpoint_interval=0,
                                                 always_save_checkpoint=True), **values}, given))
    # the data is data_dir's folder: a dataset of another name trains nothing, the record keeps it as a label
    assert notes({"dataset", "data_dir"}, dataset='shakespeare_char', data_dir='/data/edu_fineweb10B') == [
        "dataset='shakespeare_char' does nothing here: data_dir='/data/edu_fineweb10B' is the data trained on "
        "(dataset only names it in the run's record)"]
    assert notes({"dataset", "data_dir"}, dataset='fineweb', data_dir='/fast/disk/fineweb/') == []  # they agree
    assert notes({"dataset"}, dataset='shakespeare_char') == []
    assert notes({"always_save_checkpoint"}, checkpoint_interval=500) == [
        "always_save_checkpoint=True does nothing here: checkpoint_interval=500 saves every N steps, not after each "
        "evaluation"]
    assert notes({"always_save_checkpoint"}, always_save_checkpoint=False) == []
