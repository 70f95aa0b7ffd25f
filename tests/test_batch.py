"""
The batch a command trains with (gpt/training/schedule.py's global_batch and split_batch, through the plan):
every config/*.py as it is, on a CPU and on a GPU, and nanoGPT's own commands. A config's total_batch_size
is a number of micro-batches of its batch_size x block_size; a later file or flags that change those (not
total_batch_size) change the batch as they do nanoGPT's, with a note; a total_batch_size given with them keeps
it. Own text on a CPU trains config/quickstart.py's small model, from the command data/text/prepare.py prints.
"""
import contextlib
import io
import os
import shlex
from unittest import mock

import pytest
import torch
from conftest import ROOT, declarations, run

import configurator
from gpt.runtime.errors import UserError
from gpt.training import plan

CHAR = dict(vocab_size=65, tokenizer='char', dtype='uint16')
DECLARED = declarations()
# nanoGPT's README command for a CPU (its shakespeare_char config: 64 x 256 a step, one micro-step)
NANOGPT_CPU = ("config/train_shakespeare_char.py --device=cpu --compile=False --eval_iters=20 --log_interval=1 "
               "--block_size=64 --batch_size=12 --n_layer=4 --n_head=4 --n_embd=128 --max_iters=2000 "
               "--lr_decay_iters=2000 --dropout=0.0")


def config(argv, cuda=False):
    """train.py's settings for these arguments, as the configurator gives them, on a machine with or without
    a CUDA GPU (config/quickstart.py and config/train_text.py ask)."""
    with mock.patch.object(torch.cuda, "is_available", lambda: cuda), contextlib.redirect_stdout(io.StringIO()):
        return configurator.apply({"__file__": os.path.join(ROOT, "train.py")}, list(argv), DECLARED)


def resolve(argv, world=1, cuda=False, tmp="out-batch-test-does-not-exist"):
    """The run plan of `python train.py ARGV` on `world` processes (a GPT-2 name's hub config, no download)."""
    c = config([*argv, f"--out_dir={tmp}"], cuda)
    init = c['init_from']
    src = plan.Source('pretrained', init, dict(plan.GPT2_HUB[init], vocab_size=50257, block_size=1024, bias=True)) \
        if init in plan.GPT2_HUB else plan.Source('scratch')
    meta = CHAR if c['dataset'] in ('shakespeare_char', 'text') else None
    with contextlib.redirect_stdout(io.StringIO()):
        return plan.decide(c, src, meta, world, 'cuda:0' if cuda else 'cpu', 'float32', torchrun=world > 1)


def configs():
    return sorted(f"config/{f}" for f in os.listdir(os.path.join(ROOT, "config")) if f.endswith(".py"))


# (command, machine) -> (tokens a step, micro-steps x micro-batch on one process). Every config/*.py as it was
# before batch flags followed nanoGPT (train_text.py on a CPU excepted: it now trains the quick start's model)
TABLE = [
    ("config/eval_gpt2.py", None, 327_680, (40, 8)),  # nanoGPT's 40 micro-steps (gradient_accumulation_steps)
    ("config/eval_gpt2_medium.py", None, 327_680, (40, 8)),
    ("config/eval_gpt2_large.py", None, 327_680, (40, 8)),
    ("config/eval_gpt2_xl.py", None, 327_680, (40, 8)),
    ("config/finetune_shakespeare.py", None, 32_768, (32, 1)),
    ("config/quickstart.py", "cpu", 768, (1, 12)),
    ("config/quickstart.py", "cuda", 16_384, (1, 64)),
    ("config/speedrun_gcide.py", None, 16_384, (1, 16)),
    ("config/train_gpt2.py", None, 491_520, (40, 12)),
    ("config/train_gpt2_fineweb.py", None, 524_288, (8, 64)),
    ("config/train_llama_1b.py", None, 524_288, (32, 8)),
    ("config/train_llama_shakespeare_char.py", None, 16_384, (1, 64)),
    ("config/train_shakespeare_char.py", None, 16_384, (1, 64)),
    ("config/train_text.py", "cpu", 768, (1, 12)),
    ("config/train_text.py", "cuda", 16_384, (1, 64)),
    # nanoGPT's commands: a batch_size or block_size flag changes the sequences a step, as in nanoGPT
    (NANOGPT_CPU, None, 768, (1, 12)),
    ("config/train_shakespeare_char.py --batch_size=32 --compile=False", None, 8_192, (1, 32)),  # train.py's doc
    ("config/train_shakespeare_char.py --block_size=64", None, 4_096, (1, 64)),
    ("config/train_shakespeare_char.py --gradient_accumulation_steps=4", None, 65_536, (4, 64)),
    ("config/train_shakespeare_char.py --gradient_accumulation_steps=2 --batch_size=8", None, 4_096, (2, 8)),
    ("config/train_gpt2.py --batch_size=4", None, 163_840, (40, 4)),  # nanoGPT: 40 x 4 x 1024
    ("config/finetune_shakespeare.py --batch_size=2", None, 65_536, (32, 2)),
    ("config/train_shakespeare_char.py --batch_size=64 --block_size=256", None, 16_384, (1, 64)),  # the same
    # a total_batch_size given with them keeps the batch: batch_size only caps a micro-step (our design)
    ("config/train_shakespeare_char.py --total_batch_size=16384 --batch_size=12 --block_size=64", None, 16_384,
     (32, 8)),
    ("config/train_gpt2.py --total_batch_size=491520 --batch_size=4", None, 491_520, (120, 4)),
    # a flag before the config file: the file's settings win, as for any setting
    ("--batch_size=12 config/train_shakespeare_char.py", None, 16_384, (1, 64)),
]


@pytest.mark.parametrize("command, machine, tokens, split", TABLE, ids=[f"{c} {m or ''}" for c, m, *_ in TABLE])
def test_tokens_per_step(command, machine, tokens, split):
    for cuda in ((False, True) if machine is None else (machine == "cuda",)):
        p = resolve(shlex.split(command), cuda=cuda)
        assert (p.tokens_per_iter, (p.micro_steps, p.micro_batch)) == (tokens, split), (command, cuda)
        assert p.settings['total_batch_size'] in (tokens, 0)  # recorded as the run takes it
        assert p.eval_batch == p.micro_batch  # one process evaluates batches of the batch it trains on


def test_the_table_holds_every_config():
    assert {c for c, *_ in TABLE if " " not in c} == set(configs())


@pytest.mark.parametrize("command", [c for c, *_ in TABLE if "--" in c] + configs())
def test_the_global_batch_is_the_same_on_any_number_of_processes(command):
    one = resolve(shlex.split(command), cuda=True).tokens_per_iter
    for world in (2, 4, 8):
        try:
            assert resolve(shlex.split(command), world, cuda=True).tokens_per_iter == one
        except UserError as e:  # a batch the processes cannot share: refused, never another batch
            assert str(e).startswith("the global batch of ")


def test_a_batch_that_follows_the_flags_says_so_and_one_that_does_not_says_nothing():
    p = resolve(shlex.split(NANOGPT_CPU))
    assert p.notes[0] == (
        "batch_size=12 and block_size=64 came after config/train_shakespeare_char.py's total_batch_size=16,384 "
        "(1 micro-batch of 64 x 256), so the batch is 1 micro-batch of 12 x 64, total_batch_size=768, as in nanoGPT "
        "(give --total_batch_size to keep a batch in tokens: batch_size then only caps a micro-batch)")
    assert not any("total_batch_size" in n for n in resolve(["config/train_shakespeare_char.py"]).notes)
    assert not any("total_batch_size" in n for n in resolve(
        ["config/train_shakespeare_char.py", "--batch_size=64"]).notes)
    # gradient_accumulation_steps sets the batch here: no "does nothing" note for it
    notes = resolve(["config/train_shakespeare_char.py", "--gradient_accumulation_steps=4"]).notes
    assert notes == ("gradient_accumulation_steps=4 came after config/train_shakespeare_char.py's "
                     "total_batch_size=16,384, so the batch is 4 micro-batches of 64 x 256, total_batch_size=65,536, "
                     "as in nanoGPT (give --total_batch_size to keep a batch in tokens: batch_size then only caps a "
                     "micro-batch)",)


def test_a_later_config_file_changes_the_batch_as_flags_do(tmp_path):
    mine = tmp_path / "small.py"
    mine.write_text("batch_size = 12\nblock_size = 64\n")
    assert resolve(["config/train_shakespeare_char.py", str(mine)]).tokens_per_iter == 768
    # in the same file as the total, batch_size caps the micro-batch
    mine.write_text("total_batch_size = 16384\nbatch_size = 12\nblock_size = 64\n")
    p = resolve(["config/train_shakespeare_char.py", str(mine)])
    assert (p.tokens_per_iter, p.micro_steps, p.micro_batch) == (16_384, 32, 8)


def test_a_batch_the_flags_cannot_follow_is_one_line_naming_both_fixes(tmp_path):
    odd = tmp_path / "odd.py"  # 64 sequences of 256: not a whole number of micro-batches of 12
    odd.write_text("total_batch_size = 16384\nbatch_size = 12\nblock_size = 256\n")
    with pytest.raises(UserError) as e:
        resolve([str(odd), "--batch_size=4"])
    assert str(e.value) == (
        f"batch_size=4 came after {odd}'s total_batch_size=16,384, which is not a whole number of micro-batches "
        f"of batch_size=12 x block_size=256, so the batch they mean is unclear: give --total_batch_size=16384 "
        f"to keep it (batch_size then only caps a micro-batch), or --gradient_accumulation_steps=N for a batch of "
        f"N micro-batches of batch_size x block_size")
    # either fix runs
    assert resolve([str(odd), "--batch_size=4", "--total_batch_size=16384"]).tokens_per_iter == 16_384
    assert resolve([str(odd), "--batch_size=4", "--gradient_accumulation_steps=3"]).tokens_per_iter == 3 * 4 * 256


def test_the_configurator_records_its_sources_in_order(tmp_path):
    mine = tmp_path / "mine.py"
    mine.write_text("batch_size = 8\n")
    c = config(["--n_layer=2", "--batch_size=4", str(mine), "--block_size=32"])
    assert c.sources == (("flags", {"n_layer": 2, "batch_size": 4}), (str(mine), {"batch_size": 8}),
                         ("flags", {"block_size": 32}))


def test_own_text_on_a_cpu_trains_the_quick_starts_model(tmp_path):
    """The command data/text/prepare.py ends with, on a machine without a GPU: the quick start's cost."""
    text = tmp_path / "mine.txt"
    text.write_text("".join(f"Line {i}: the quick brown fox jumps over the lazy dog.\n" for i in range(400)))
    r = run("data/text/prepare.py", "--input", text, "--out_dir", tmp_path / "data")
    command = shlex.split(r.stdout.strip().splitlines()[-1].removeprefix("next: python "))
    assert command[:2] == ["train.py", "config/train_text.py"]
    c = config([*command[1:], f"--out_dir={tmp_path / 'out'}"])
    with mock.patch.object(torch.cuda, "is_available", lambda: False), contextlib.redirect_stdout(io.StringIO()):
        own, _ = plan.make(c)
    quick = resolve(["config/quickstart.py"])
    assert own.device == "cpu" and own.meta['tokenizer'] == "char"
    same = ("tokens_per_iter", "micro_steps", "micro_batch", "block_size", "max_iters", "eval_iters",
            "eval_interval", "lr_decay_iters", "compile", "cuda_graph")
    assert {k: getattr(own, k) for k in same} == {k: getattr(quick, k) for k in same}
    shape = ("n_layer", "n_head", "n_embd", "block_size", "dropout")
    assert {k: own.model[k] for k in shape} == {k: quick.model[k] for k in shape}
    assert own.tokens_per_iter == 768 and own.eval_iters == 20 and own.model['n_embd'] == 128
    # on a GPU the same command trains the shakespeare_char model
    gpu = resolve(["config/train_text.py"], cuda=True)
    assert (gpu.tokens_per_iter, gpu.model['n_layer'], gpu.model['n_embd'], gpu.eval_iters) == (16_384, 6, 384, 50)
