"""
A dataset tokenized otherwise than the model it trains (characters vs GPT-2 BPE vs a tokenizers file) is
refused in one line that says how to prepare the data for that model.
"""
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from gpt.data.tokenizer import check_data_for_model, hf_meta, train_bpe  # noqa: E402
from gpt.runtime.errors import UserError  # noqa: E402

CHAR = {"tokenizer": "char", "vocab_size": 3, "itos": ["a", "b", "c"]}
GPT2 = {"tokenizer": "gpt2", "vocab_size": 50257}


def resumed(meta):
    return {"path": "out/ckpt.pt", "dataset_meta": meta}


def test_character_data_for_a_gpt2_model_is_refused(tmp_path):
    (tmp_path / "config.json").write_text('{"model_type": "gpt2", "vocab_size": 50257}')
    for init_from in ("gpt2", str(tmp_path)):  # a GPT-2 folder without tokenizer.json is GPT-2 BPE
        with pytest.raises(UserError) as e:
            check_data_for_model(CHAR, init_from, None, "dataset 'shakespeare_char'")
        assert str(e.value).startswith(f"dataset 'shakespeare_char' is tokenized with characters, 3 of them, but the "
                                       f"model ({init_from}) with GPT-2 BPE")
        assert "python data/shakespeare/prepare.py` and --dataset=shakespeare" in str(e.value)
    with pytest.raises(UserError, match="out/ckpt.pt.*GPT-2 BPE"):
        check_data_for_model(CHAR, "resume", resumed(None), "x")  # a checkpoint of data without meta: GPT-2


def test_matching_or_unknown_tokenizers_pass():
    check_data_for_model(CHAR, "scratch", None, "x")  # a new model takes the data's
    check_data_for_model(GPT2, "gpt2", None, "x")
    check_data_for_model(None, "gpt2", None, "x")  # no meta.json: GPT-2 BPE, as in nanoGPT
    check_data_for_model(CHAR, "resume", resumed(dict(CHAR)), "x")
    check_data_for_model(CHAR, "resume", {"path": "out/ckpt.pt"}, "x")  # nanoGPT's checkpoints do not say


def test_other_characters_are_refused():
    with pytest.raises(UserError, match="the character-level dataset it was trained on"):
        check_data_for_model(CHAR, "resume", resumed({**CHAR, "itos": ["a", "b", "d"]}), "x")


@pytest.mark.needs("tokenizers")
def test_a_tokenizers_file_is_compared_by_what_it_does(tmp_path, gpt2_ranks_path):
    tok = train_bpe(["hello world, the quick brown fox " * 50], 300).to_str()
    bpe = {**hf_meta(tok), "tokenizer_json": tok}
    with pytest.raises(UserError, match=r"a tokenizers file of \d+ tokens, but the model .gpt2. with GPT-2 BPE"):
        check_data_for_model(bpe, "gpt2", None, "x")
    with pytest.raises(UserError, match="--tokenizer=<its tokenizer.json>"):
        check_data_for_model(GPT2, "resume", resumed(bpe), "x")
    check_data_for_model(dict(bpe), "resume", resumed(bpe), "x")


@pytest.mark.needs("transformers")
def test_a_gpt2_folders_tokenizer_json_is_gpt2(tmp_path, gpt2_ranks_path):
    """A GPT-2 folder written by transformers holds GPT-2's BPE as tokenizer.json: GPT-2 data is right for it."""
    from gpt.data.tokenizer import Tokenizer
    from gpt.hf.tokenizer import hf_tokenizer
    hf_tokenizer(Tokenizer("gpt2"), 1024, 50257).save_pretrained(tmp_path)
    (tmp_path / "config.json").write_text('{"model_type": "gpt2", "vocab_size": 50257}')  # a model folder's
    check_data_for_model(GPT2, str(tmp_path), None, "owt")
    check_data_for_model(None, str(tmp_path), None, "owt")
    with pytest.raises(UserError, match=f"--tokenizer={tmp_path}/tokenizer.json"):
        check_data_for_model(CHAR, str(tmp_path), None, "x")
