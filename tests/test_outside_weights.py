"""
Weights from outside - a checkpoint (ckpt.pt) or a transformers folder (init_from=<folder>) - that are damaged or
hostile: every loader (train.py resuming or starting from a folder, sample.py, export.py, hellaswag.py) ends each
kind of damage in one `error:` line naming the file, exit status 2 and no traceback; a hostile pickle runs no
code. The kinds: a truncated file, garbage bytes, a pickle with code (torch.save's zip and legacy formats), a
counter of the wrong type, a NaN or inf weight, a tensor missing, and a character model whose vocabulary is
nowhere to be found.
"""
import json
import os
import pickle

import pytest
import torch
from conftest import run, tiny, write_char_dataset

from gpt import hf
from gpt.checkpoint import load_checkpoint
from gpt.runtime.errors import UserError
from gpt.training import plan
from model import GPT, GPTConfig

transformers = pytest.importorskip("transformers", reason="transformers folders need transformers")
from safetensors.torch import load_file, save_file  # noqa: E402 - comes with transformers

pytestmark = pytest.mark.usefixtures("one_thread")
ARGS = dict(n_layer=1, n_head=2, n_embd=32, block_size=32, bias=True, vocab_size=65, dropout=0.0)
SAMPLE = ["--device=cpu", "--num_samples=1", "--max_new_tokens=3"]


class Marker:
    """A pickled object whose loading would create a file: proof that a loader ran a pickle's code."""

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return open, (self.path, "w")


def one_error_line(r, *names):
    """The run ended in exactly one `error:` line that names each of `names`, status 2, no traceback."""
    assert r.returncode == 2 and "Traceback" not in r.stderr, (r.returncode, r.stdout[-1500:], r.stderr[-3000:])
    errors = [line for line in (r.stdout + r.stderr).splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and r.stderr.strip().splitlines()[-1] == errors[0], r.stderr[-3000:]
    for name in names:
        assert str(name) in errors[0], errors[0]
    return errors[0]


# --- checkpoints: ckpt.pt as train.py and nanoGPT write it

def checkpoint(folder, vocab_size=65, dataset=None, **entries):
    """A nanoGPT-style ckpt.pt of a tiny model in folder: model, model_args, iter_num, best_val_loss (a tensor,
    as nanoGPT saves it), config; with our dataset_meta (a 65-character vocabulary) unless `dataset` names
    one (then it has none, as nanoGPT's). entries: more, or others."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(**dict(ARGS, vocab_size=vocab_size)))
    chars = [chr(c) for c in range(32, 32 + vocab_size)] if vocab_size < 100 else None
    ckpt = {"model": model.state_dict(), "model_args": dict(ARGS, vocab_size=vocab_size), "iter_num": 7,
            "best_val_loss": torch.tensor(3.5), "config": {"batch_size": 4, "block_size": 32,
                                                          "gradient_accumulation_steps": 2}}
    if dataset:
        ckpt["config"]["dataset"] = dataset
    elif chars:
        ckpt["dataset_meta"] = {"tokenizer": "char", "vocab_size": vocab_size, "dtype": "uint16", "itos": chars}
    ckpt.update(entries)
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, "ckpt.pt")
    torch.save(ckpt, path)
    return path


def damage(path, kind, marker):
    """Damage the file at path in the way `kind` says."""
    data = open(path, "rb").read()
    if kind == "truncated":
        open(path, "wb").write(data[:len(data) // 2])
    elif kind == "garbage":
        open(path, "wb").write(os.urandom(4096))
    elif kind in ("pickle", "legacy pickle"):  # torch.save's formats, holding an object that runs code
        torch.save({"model": {}, "model_args": {}, "x": Marker(marker)}, path,
                   _use_new_zipfile_serialization=kind == "pickle")
    elif kind == "plain pickle":  # pickle's own format: not torch.save's at all
        with open(path, "wb") as f:
            pickle.dump({"x": Marker(marker)}, f)
    else:
        raise ValueError(kind)


@pytest.fixture(scope="module")
def char_data(corpus_path, tmp_path_factory):
    return write_char_dataset(tmp_path_factory.mktemp("chars"), corpus_path, chars=20000)


@pytest.fixture(scope="module")
def hellaswag_file(tmp_path_factory):
    """One HellaSwag example in the official jsonl's format, so that hellaswag.py goes on to load the model."""
    path = tmp_path_factory.mktemp("hellaswag") / "hellaswag_val.jsonl"
    path.write_text(json.dumps(dict(ind=0, activity_label="Cooking", ctx_a="A man cooks.", ctx_b="He",
                                    ctx="A man cooks. He", split="val", split_type="indomain", label=0,
                                    endings=["eats.", "sleeps.", "runs.", "sings."], source_id="x")) + "\n")
    return path


def loader(script, out_dir, char_data, hellaswag_file=None):
    """The command line that makes `script` load out_dir/ckpt.pt."""
    if script == "hellaswag.py":
        return ["hellaswag.py", f"--out_dir={out_dir}", f"--path={hellaswag_file}", "--device=cpu"]
    if script == "train.py":
        return ["train.py", "--init_from=resume", f"--out_dir={out_dir}", f"--data_dir={char_data}",
                *(f"--{k}={v}" for k, v in tiny(max_iters=8, n_layer=1).items())]
    if script == "sample.py":
        return ["sample.py", f"--out_dir={out_dir}", *SAMPLE]
    return ["export.py", f"--out_dir={out_dir}", f"--export_dir={out_dir}/hf"]


LOADERS = ("train.py", "sample.py", "export.py", "hellaswag.py")


DAMAGE = ["truncated", "garbage", "pickle", "legacy pickle", "plain pickle"]
# every loader reads ckpt.pt through load_checkpoint, which the first test tries with every damage; the second
# runs each damage through one of the scripts, each script at least once: one line, no traceback, no code run
SCRIPT_CASES = [(kind, LOADERS[i % len(LOADERS)]) for i, kind in enumerate(DAMAGE)]


@pytest.mark.parametrize("kind", DAMAGE)
def test_load_checkpoint_refuses_every_damage_naming_the_file(kind, tmp_path):
    path, marker = checkpoint(tmp_path / "run"), tmp_path / "code-ran"
    damage(path, kind, marker)
    with pytest.raises(UserError) as e:
        load_checkpoint(path)
    assert str(path) in str(e.value) and not marker.exists(), e.value
    if kind in ("pickle", "legacy pickle"):
        assert "unsafe, not loaded" in str(e.value) and "class io.open" in str(e.value), e.value


@pytest.mark.parametrize("kind, script", SCRIPT_CASES)
def test_a_damaged_or_hostile_checkpoint_is_one_line(script, kind, char_data, hellaswag_file, tmp_path):
    path, marker = checkpoint(tmp_path / "run"), tmp_path / "code-ran"
    damage(path, kind, marker)
    line = one_error_line(run(*loader(script, tmp_path / "run", char_data, hellaswag_file), check=False), path)
    assert not marker.exists(), "the checkpoint's pickle ran code"
    if kind in ("pickle", "legacy pickle"):
        assert "unsafe, not loaded" in line and "class io.open" in line, line


# the entries the code reads, each with a value of another type than its writer saves
WRONG = [("iter_num", "7 steps"), ("iter_num", -3), ("iter_num", 7.0), ("tokens", "many"), ("tokens", True),
         ("best_val_loss", "low"), ("best_val_loss", torch.zeros(3)), ("elapsed", "1h"), ("skipped_steps", 1.5),
         ("initial_val_loss", [4.1]), ("wandb_run_id", 12), ("config", "lr=1"), ("plan", ["a"]),
         ("dataset_meta", "chars"), ("log_position", "end")]


@pytest.mark.parametrize("key,value", WRONG, ids=[f"{k}={v!r}"[:30] for k, v in WRONG])
def test_a_counter_of_the_wrong_type_is_refused_at_load(key, value, tmp_path):
    # at load, for every loader (each script's line: test_each_loader_refuses_a_wrong_typed_counter_...)
    path = checkpoint(tmp_path / "run", **{key: value})
    with pytest.raises(UserError) as e:
        load_checkpoint(path)
    assert str(e.value).startswith(f"{path}: its entry {key!r} is ") and "damaged or was edited" in str(e.value)


def test_the_entries_train_py_and_nanogpt_save_pass(tmp_path):
    ckpt = load_checkpoint(checkpoint(tmp_path / "run", tokens=0, elapsed=3, skipped_steps=0, best_val_loss=2.5,
                                      initial_val_loss=4.2, wandb_run_id="abc", log_position=100, plan={}))
    assert ckpt["iter_num"] == 7


@pytest.mark.parametrize("script", LOADERS)
def test_each_loader_refuses_a_wrong_typed_counter_and_model_arg(script, char_data, hellaswag_file, tmp_path):
    path = checkpoint(tmp_path / "a", iter_num="7")
    one_error_line(run(*loader(script, tmp_path / "a", char_data, hellaswag_file), check=False), path, "'iter_num'")
    path = checkpoint(tmp_path / "b")
    ckpt = torch.load(path)
    ckpt["model_args"]["n_embd"] = "32"
    torch.save(ckpt, path)
    one_error_line(run(*loader(script, tmp_path / "b", char_data, hellaswag_file), check=False), path,
                   "model_args['n_embd']")


def non_finite_checkpoint(folder, bad):
    path = checkpoint(folder)
    ckpt = torch.load(path)
    ckpt["model"]["transformer.h.0.mlp.c_fc.weight"][3, 4] = bad
    ckpt["model"]["transformer.ln_f.weight"][0] = bad
    torch.save(ckpt, path)
    return path


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_load_checkpoint_refuses_weights_that_are_not_finite_naming_the_first(bad, tmp_path):
    path = non_finite_checkpoint(tmp_path / "run", bad)
    with pytest.raises(UserError, match="weight transformer.h.0.mlp.c_fc.weight holds NaN or inf"):
        load_checkpoint(path)


@pytest.mark.parametrize("script, bad", [(s, (float("nan"), float("inf"))[i % 2]) for i, s in enumerate(LOADERS)])
def test_weights_that_are_not_finite_are_refused_naming_the_first(script, bad, char_data, hellaswag_file, tmp_path):
    path = non_finite_checkpoint(tmp_path / "run", bad)
    line = one_error_line(run(*loader(script, tmp_path / "run", char_data, hellaswag_file), check=False), path)
    assert "weight transformer.h.0.mlp.c_fc.weight holds NaN or inf" in line, line


@pytest.mark.parametrize("script", ["sample.py", "export.py", "hellaswag.py"])
@pytest.mark.parametrize("dataset", ["no_such_dataset_here", None])
def test_a_character_model_without_its_vocabulary_is_refused_not_decoded_as_gpt2(script, dataset, hellaswag_file,
                                                                                  tmp_path):
    # a nanoGPT checkpoint of shakespeare_char: no dataset_meta, its meta.pkl in data/<dataset>/ (here: absent)
    path = checkpoint(tmp_path / "run", dataset=dataset or "x")
    if dataset is None:
        ckpt = torch.load(path)
        del ckpt["config"]["dataset"]
        torch.save(ckpt, path)
    line = one_error_line(run(*loader(script, tmp_path / "run", None, hellaswag_file), check=False), path,
                          "65 tokens")
    if dataset:
        assert os.path.join("data", dataset, "meta.pkl") in line and f"data/{dataset}/prepare.py" in line, line
    else:
        assert "config['dataset']" in line, line
    assert not os.path.exists(tmp_path / "run" / "hf")


def test_a_gpt2_sized_vocabulary_without_meta_is_gpt2_bpe(gpt2_ranks_path, tmp_path):
    checkpoint(tmp_path / "run", vocab_size=50304, dataset="no_such_dataset_here")
    r = run("sample.py", f"--out_dir={tmp_path / 'run'}", *SAMPLE)
    assert "tokenizer: gpt2 (50257 tokens)" in r.stdout


# --- resuming a checkpoint that does not count its tokens (nanoGPT's)

def resumed(ckpt):
    return plan.Source('resume', 'out/ckpt.pt', dict(ARGS), dict(ckpt.get('config') or {}), ckpt)


def test_a_checkpoint_without_a_token_count_counts_its_steps_at_its_own_batch(capsys):
    # nanoGPT's config: gradient_accumulation_steps before dividing by the processes (its train.py saves the
    # global count), batch_size per micro-step
    ckpt = {"iter_num": 10, "config": {"gradient_accumulation_steps": 40, "batch_size": 12, "block_size": 1024}}
    assert plan.started(resumed(ckpt), 103_168) == (10, 10 * 40 * 12 * 1024)
    ckpt["plan"] = {"tokens_per_iter": 5000}  # ours, without 'tokens' (older): its plan's rate first
    assert plan.started(resumed(ckpt), 103_168) == (10, 50_000)
    ckpt["tokens"] = 123  # the count itself above all
    assert plan.started(resumed(ckpt), 103_168) == (10, 123)
    assert "note:" not in capsys.readouterr().out
    for config in ({}, {"batch_size": 12, "block_size": 1024}, {"gradient_accumulation_steps": "40",
                                                                "batch_size": 12, "block_size": 1024}):
        assert plan.started(resumed({"iter_num": 10, "config": config}), 103_168) == (10, 1_031_680)
        assert "counted at this run's 103,168 tokens each" in capsys.readouterr().out


def test_resuming_a_nanogpt_checkpoint_at_another_batch_counts_its_own(char_data, tmp_path):
    # nanoGPT's checkpoint: no tokens, no plan, no dataset_meta; its run took 8 x 32 x 3 tokens a step, this
    # launch 4 x 32 x 1
    path = checkpoint(tmp_path / "run", vocab_size=96, best_val_loss=torch.tensor(1e9),
                      config={"batch_size": 8, "block_size": 32, "gradient_accumulation_steps": 3})
    ckpt = torch.load(path)
    del ckpt["dataset_meta"]
    torch.save(ckpt, path)
    r = run(*loader("train.py", tmp_path / "run", char_data))
    saved = torch.load(path)
    assert saved["iter_num"] == 8 and saved["tokens"] == 7 * 8 * 32 * 3 + 4 * 32, r.stdout[-2000:]


# --- transformers folders: init_from=<folder>

def hf_folder(folder, vocab_size=50257):
    """A tiny GPT-2 as save_pretrained writes it (random weights, nothing downloaded)."""
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=1, n_head=2, n_embd=32, n_positions=32, vocab_size=vocab_size,
                                     bos_token_id=None, eos_token_id=None)
    transformers.GPT2LMHeadModel(config).save_pretrained(folder)
    return folder


def as_bin(folder):
    """The folder with its weights in pytorch_model.bin (torch.save's), as older transformers wrote them."""
    path = os.path.join(folder, "model.safetensors")
    torch.save(load_file(path), os.path.join(folder, "pytorch_model.bin"))
    os.remove(path)
    return os.path.join(folder, "pytorch_model.bin")


def hf_loader(script, folder, char_data, tmp_path):
    if script == "train.py":
        return ["train.py", f"--init_from={folder}", f"--out_dir={tmp_path / 'out'}", f"--data_dir={char_data}",
                *(f"--{k}={v}" for k, v in tiny(max_iters=2).items() if not k.startswith("n_"))]
    return ["sample.py", f"--init_from={folder}", *SAMPLE]


HF_DAMAGE = ["truncated", "garbage", "bin truncated", "bin garbage", "bin pickle", "bin legacy pickle",
             "bin plain pickle", "nan", "missing tensor", "missing file"]


# each kind of damage through one of the scripts (both read a folder through the same reader, which the next
# test tries with every kind): the script's end, one line and no traceback, is what this one adds
HF_CASES = [(kind, ("train.py", "sample.py")[i % 2]) for i, kind in enumerate(HF_DAMAGE)]
HF_WORDS = {"nan": "tensor transformer.h.0.attn.c_proj.weight holds NaN or inf",
            "missing tensor": "transformer.h.0.mlp.c_fc.weight", "missing file": "holds no weights",
            "pickle": "class io.open", "legacy pickle": "class io.open"}


def damaged_hf_folder(tmp_path, kind):
    """(folder, the file named in the refusal, the damage without its 'bin ' prefix, the marker a pickle's code
    would make)."""
    folder, marker = hf_folder(tmp_path / "hf"), tmp_path / "code-ran"
    path = os.path.join(folder, "model.safetensors")
    if kind.startswith("bin"):
        path = as_bin(folder)
        kind = kind[4:]
    if kind in ("nan", "missing tensor"):
        weights = load_file(path)
        if kind == "nan":
            weights["transformer.h.0.attn.c_proj.weight"][1, 2] = float("nan")
        else:
            del weights["transformer.h.0.mlp.c_fc.weight"]
        save_file(weights, path, metadata={"format": "pt"})
    elif kind == "missing file":
        os.remove(path)
    else:
        damage(path, kind, marker)
    return folder, path if kind not in ("missing tensor", "missing file") else folder, kind, marker


@pytest.mark.parametrize("kind", HF_DAMAGE)
def test_the_folder_reader_refuses_every_damage_naming_the_file(kind, tmp_path):
    folder, named, kind, marker = damaged_hf_folder(tmp_path, kind)
    with pytest.raises(UserError) as e:
        hf.load_pretrained(str(folder))
    assert str(named) in str(e.value) and HF_WORDS.get(kind, "") in str(e.value), e.value
    assert "unsafe, not loaded" in str(e.value) or kind not in ("pickle", "legacy pickle"), e.value
    assert not marker.exists(), "the folder's pickle ran code"


@pytest.mark.parametrize("kind, script", HF_CASES)
def test_a_damaged_or_hostile_transformers_folder_is_one_line(script, kind, char_data, tmp_path):
    folder, named, kind, marker = damaged_hf_folder(tmp_path, kind)
    r = run(*hf_loader(script, folder, char_data, tmp_path), check=False)
    line = one_error_line(r, named)
    assert not marker.exists(), "the folder's pickle ran code"
    assert not os.path.exists(tmp_path / "out"), "train.py wrote before refusing"
    assert HF_WORDS.get(kind, "") in line, line
    assert "unsafe, not loaded" in line or kind not in ("pickle", "legacy pickle"), line


def test_plain_and_sharded_weights_load_as_they_are(tmp_path):
    folder = hf_folder(tmp_path / "hf")
    reference = hf.load_pretrained(str(folder))[1]
    as_bin(folder)
    assert all(torch.equal(reference[k], v) for k, v in hf.load_pretrained(str(folder))[1].items())
    # the hub's layout of GPT-2: keys without the 'transformer.' prefix, in shards named by an index
    weights = {k.removeprefix("transformer."): v for k, v in torch.load(folder / "pytorch_model.bin").items()}
    os.remove(folder / "pytorch_model.bin")
    names = sorted(weights)
    half = {n: "model-00001-of-00002.safetensors" if i % 2 else "model-00002-of-00002.safetensors"
            for i, n in enumerate(names)}
    for shard in set(half.values()):
        save_file({n: weights[n].contiguous() for n in names if half[n] == shard}, folder / shard,
                  metadata={"format": "pt"})
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": half}))
    loaded = hf.load_pretrained(str(folder))[1]
    assert loaded.keys() == reference.keys() and all(torch.equal(reference[k], v) for k, v in loaded.items())


@pytest.mark.parametrize("shard", ["../elsewhere.safetensors", "/etc/passwd", ""])
def test_a_weight_index_naming_files_outside_its_folder_is_refused(shard, tmp_path):
    folder = hf_folder(tmp_path / "hf")
    (folder / "model.safetensors.index.json").write_text('{"weight_map": {"wte.weight": "%s"}}' % shard)
    with pytest.raises(UserError, match="model.safetensors.index.json names"):
        hf.load_pretrained(str(folder))


def test_a_hub_name_that_cannot_be_had_is_one_line_without_the_hub_librarys_messages(tmp_path):
    # no network here, and an empty cache: offline or not, the hub library's retries say nothing before ours
    for offline in ("1", "0"):
        r = run("sample.py", "--init_from=gpt2", *SAMPLE, check=False,
                env={"HF_HUB_OFFLINE": offline, "HF_HOME": str(tmp_path / "hf_home"), "HF_ENDPOINT": "http://127.0.0.1:9"})
        line = one_error_line(r, "'gpt2'")
        assert "could not load GPT-2 weights" in line and "thrown while requesting" not in r.stderr, r.stderr


def test_a_hub_model_in_the_cache_is_read_by_the_same_reader(gpt2_ranks_path, tmp_path):
    # the Hugging Face cache's layout (models--gpt2/snapshots/<revision>/), offline: a tiny model as 'gpt2'
    cache = tmp_path / "hf_home" / "hub" / "models--gpt2"
    snapshot = hf_folder(cache / "snapshots" / "abc123")
    (cache / "refs").mkdir()
    (cache / "refs" / "main").write_text("abc123")
    env = {"HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf_home")}
    assert "tokenizer: gpt2" in run("sample.py", "--init_from=gpt2", *SAMPLE, env=env).stdout
    damage(str(snapshot / "model.safetensors"), "truncated", None)
    one_error_line(run("sample.py", "--init_from=gpt2", *SAMPLE, env=env, check=False),
                   snapshot / "model.safetensors")
