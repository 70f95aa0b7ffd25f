import os
import subprocess
import sys

import pytest

import configurator
from gpt.runtime.errors import UserError


def defaults():
    return dict(batch_size=12, learning_rate=6e-4, compile=True, out_dir="out", dataset="openwebtext")


def test_config_file_then_flags_override(tmp_path):
    cfg = tmp_path / "my_config.py"
    cfg.write_text("import math\nbatch_size = 4 * 8\nout_dir = 'out-' + dataset\n_private = 3\n")
    g = defaults()
    config = configurator.apply(g, [str(cfg), "--batch_size=7", "--learning_rate=1e-3", "--compile=False"])
    assert config == dict(batch_size=7, learning_rate=1e-3, compile=False, out_dir="out-openwebtext",
                          dataset="openwebtext")
    assert g["batch_size"] == 7  # the globals themselves change


def test_int_accepted_for_float_and_strings_taken_as_given():
    g = defaults()
    configurator.apply(g, ["--learning_rate=1", "--out_dir=2024", "--dataset=shakespeare_char", "--compile=true"])
    assert g["learning_rate"] == 1.0 and type(g["learning_rate"]) is float
    assert g["out_dir"] == "2024" and g["dataset"] == "shakespeare_char" and g["compile"] is True


@pytest.mark.parametrize("arg, words", [
    ("--batch_sise=3", ["unknown config key 'batch_sise'", "did you mean batch_size?"]),
    ("--batchsize=32", ["unknown config key 'batchsize' (from --batchsize=32): did you mean batch_size?"]),
    ("--lr=1e-3", ["unknown config key 'lr' (from --lr=1e-3) (--help lists every setting)"]),
    ("--batch_size=3.5", ["batch_size expects int", "3.5", "float"]),
    ("--batch_size=abc", ["batch_size expects int", "'abc'"]),
    ("--compile=1", ["compile expects bool", "1"]),
    ("--learning_rate=fast", ["learning_rate expects float", "'fast'"]),
    ("--batch_size", ["flag --batch_size has no value"]),
    ("no_such_file.py", ["config file no_such_file.py not found"]),
])
def test_bad_arguments_name_the_problem(arg, words):
    with pytest.raises(UserError) as e:
        configurator.apply(defaults(), [arg])
    for w in words:
        assert w in str(e.value)


def test_config_file_errors_name_the_file(tmp_path):
    cfg = tmp_path / "bad.py"
    cfg.write_text("batch_sise = 3\n")
    with pytest.raises(UserError, match=r"unknown config key 'batch_sise' in .*bad\.py line 1: did you mean "
                                        r"batch_size\?$"):
        configurator.apply(defaults(), [str(cfg)])
    cfg.write_text("compile = False\nbatch_size = '3'\n")
    with pytest.raises(UserError, match=r"batch_size expects int, got '3' \(str\) from .*bad\.py line 2: give a "
                                        r"whole number$"):
        configurator.apply(defaults(), [str(cfg)])


@pytest.mark.parametrize("text, words", [
    # YAML: Python reads `key: value` as an annotation, which sets nothing; even a value that is no Python
    ("batch_size: 16\n", ["bad.cfg line 1: `batch_size: 16` sets nothing", "not YAML): write batch_size = 16"]),
    ("compile = False\nout_dir: out-test\n", ["line 2: `out_dir: out-test`", "write out_dir = out-test"]),
    ("if True:\n    batchsize: 16\n", ["line 2: `batchsize: 16` sets nothing", "write batch_size = 16"]),
    ("nothing_like_a_setting: 3\n", ["unknown config key 'nothing_like_a_setting' in", "bad.cfg line 1"]),
    ("import math\n_x = 3\n", ["config file", "bad.cfg sets no setting", "batch_size = 16"]),  # sets nothing at all
    ("# batch_size = 3\n", ["bad.cfg sets no setting"]),
    ("import math\nbatch_size = 3\ndef compile():\n    return False\n", ["compile expects bool", "(function) from",
                                                                       "bad.cfg line 3: give True or False"]),
    ("batch_size = 3\ncompile = false\n", ["bad.cfg failed at line 2: NameError", "write False"]),
    ("dataset = shakespeare_char\n", ["line 1", "text in a config file is quoted: 'shakespeare_char'"]),
    ("compile: false\nout_dir: c:/runs\n", ["bad.cfg is not valid Python at line 2", "key = value"]),
])
def test_a_config_file_that_sets_nothing_says_where_and_the_fix(tmp_path, text, words):
    cfg = tmp_path / "bad.cfg"
    cfg.write_text(text)
    with pytest.raises(UserError) as e:
        configurator.apply(defaults(), [str(cfg)])
    assert "\n" not in str(e.value)
    for w in words:
        assert w in str(e.value)


def test_files_and_flags_take_the_same_values_alike(tmp_path):
    """A value reads the same from a config file and from a flag: an integral float is an int setting's whole
    number (--max_iters=1e3), a fraction is refused in one line naming the source; an unknown name is an error
    either way, with the setting meant."""
    cfg = tmp_path / "c.py"
    for value, expected in (("1e3", 1000), ("2000.0", 2000), ("7", 7)):
        cfg.write_text(f"batch_size = {value}\n")
        from_file, from_flag = defaults(), defaults()
        configurator.apply(from_file, [str(cfg)])
        configurator.apply(from_flag, [f"--batch_size={value}"])
        assert from_file["batch_size"] == from_flag["batch_size"] == expected
        assert type(from_file["batch_size"]) is type(from_flag["batch_size"]) is int
    for value in ("1.5", "1e400", "True"):
        cfg.write_text(f"batch_size = {value}\n")
        with pytest.raises(UserError, match=r"^batch_size expects .* from .*c\.py line 1"):
            configurator.apply(defaults(), [str(cfg)])
        with pytest.raises(UserError, match=rf"^batch_size expects .* from --batch_size={value}"):
            configurator.apply(defaults(), [f"--batch_size={value}"])
    with pytest.raises(UserError, match="batch_size expects int, got 1.5 .float. from --batch_size=1.5: give a whole"):
        configurator.apply(defaults(), ["--batch_size=1.5"])
    cfg.write_text("batchsize = 3\n")
    for args in ([str(cfg)], ["--batchsize=3"]):
        with pytest.raises(UserError, match="unknown config key 'batchsize' .*: did you mean batch_size"):
            configurator.apply(defaults(), args)


def test_the_overrides_are_echoed_by_source_where_they_differ_from_the_defaults(tmp_path, capsys):
    cfg = tmp_path / "c.py"
    cfg.write_text("batch_size = 32\nout_dir = 'out-c'\ncompile = True\nlearning_rate = 1e-3\n")
    config = configurator.apply(defaults(), [str(cfg), "--learning_rate=2e-3", "--dataset=shakespeare_char"])
    # compile=True is the default: given, not echoed; learning_rate: the flag's value, under the flags
    assert capsys.readouterr().out.splitlines() == [
        f"config from {cfg}: batch_size=32 out_dir='out-c'",
        "config from flags: learning_rate=0.002 dataset='shakespeare_char'"]
    assert config.given == {"batch_size", "out_dir", "compile", "learning_rate", "dataset"}
    assert config.set_by()["learning_rate"] == "flags" and config.set_by()["compile"] == str(cfg)
    configurator.apply(defaults(), [])
    assert capsys.readouterr().out == ""  # nothing given, nothing said


def test_a_typo_is_answered_with_the_setting_meant_among_every_section():
    """The hint looks at every setting, the sections' too (train.py's model switches), and stays quiet rather
    than name a setting merely alike (a removed name is not a typo of a current one)."""
    g, model_options = defaults(), dict(n_kv_head=0, rope_theta=10000.0)
    with pytest.raises(UserError, match="did you mean rope_theta"):
        configurator.apply(g, ["--ropetheta=5e5"], model_options)
    with pytest.raises(UserError) as e:
        configurator.apply(dict(defaults(), hellaswag_interval=0), ["--hellaswag_path=x"])
    assert "did you mean" not in str(e.value)


def test_help_lists_every_setting_with_its_default_and_comment(tmp_path, capsys):
    script = tmp_path / "myscript.py"
    script.write_text("batch_size = 12  # sequences a micro-step\nsettings = dict(\n    out_dir='out',  # the run "
                      "folder\n)\n")
    g = {**defaults(), "__file__": str(script)}
    with pytest.raises(SystemExit) as e:
        configurator.apply(g, ["--batch_size=3", "--help"])
    assert e.value.code == 0 and g["batch_size"] == 12  # nothing applied
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "usage: python myscript.py [config_file.py ...] [--key=value ...]"
    assert "  --batch_size=12  # sequences a micro-step" in out and "  --out_dir='out'  # the run folder" in out
    assert "  --learning_rate=0.0006" in out and "  --dataset='openwebtext'" in out


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.parametrize("script, setting", [("train.py", "--n_layer=12"), ("sample.py", "--top_p=1.0"),
                                             ("export.py", "--force=False"), ("hellaswag.py", "--limit=0")])
def test_scripts_answer_help(script, setting, tmp_path):
    """`python train.py --help`, the first thing many users type: the settings, exit 0, nothing written."""
    r = subprocess.run([sys.executable, os.path.join(ROOT, script), "-h"], cwd=tmp_path, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0 and "Traceback" not in r.stderr and "error:" not in r.stderr, r.stderr[-2000:]
    assert r.stdout.startswith(f"usage: python {script} ") and any(line.startswith(f"  {setting}")
                                                                    for line in r.stdout.splitlines())
    assert os.listdir(tmp_path) == []
    # the page the last line names exists; only train.py's promises every setting (tests/test_docs.py checks)
    last = r.stdout.strip().splitlines()[-1]
    page = configurator.DOCS[script]
    assert last == (f"Every setting is described in {page}." if script == "train.py" else f"More in {page}.")
    assert os.path.isfile(os.path.join(ROOT, page))


def test_a_folder_setting_starting_with_a_tilde_is_under_home(tmp_path, monkeypatch):
    """No shell expands the ~ of --out_dir=~/runs (it is not at a word's start): without this the run would
    write into a folder named '~' in the working directory."""
    monkeypatch.setenv("HOME", str(tmp_path))
    cfg = tmp_path / "c.py"
    cfg.write_text("data_dir = '~/data'\n")
    g = dict(out_dir="out", data_dir="", init_from="scratch", start="\n", sample_prompt="hi")
    configurator.apply(g, [str(cfg), "--out_dir=~/runs/a", "--init_from=~/hf", "--sample_prompt=~/not a path"])
    assert g == dict(out_dir=f"{tmp_path}/runs/a", data_dir=f"{tmp_path}/data", init_from=f"{tmp_path}/hf",
                     start="\n", sample_prompt="~/not a path")  # text settings stay as given
    configurator.apply(g, ["--out_dir=~other/x", "--init_from=gpt2"])  # only ~ and ~/ are the user's home
    assert g["out_dir"] == "~other/x" and g["init_from"] == "gpt2"
