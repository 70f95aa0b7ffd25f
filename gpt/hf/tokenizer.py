"""Our tokenizers (gpt/data/tokenizer.py's Tokenizer) as transformers tokenizers, for export.py: GPT-2 BPE rebuilt from
tiktoken's ranks, a character vocabulary, or a dataset's tokenizers JSON as it is; saved in a form both transformers 4
and 5 load. transformers is imported inside the functions that use it: it is slow to import."""
import json
import os

from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers

from gpt.data.tokenizer import GPT2_EOT, gpt2_encoding
from gpt.runtime.files import atomic_write

EOS = "<|endoftext|>"  # the end-of-text token a character vocabulary gets, where the model has a spare id
# what the tokenizer returns: not 4.x's token_type_ids too, which GPT-2 adds as wte(0) (docs/export.md, Inputs)
MODEL_INPUT_NAMES = ["input_ids", "attention_mask"]

def gpt2_bpe_vocab_merges():
    """GPT-2's vocab and merges in transformers' byte-level form, rebuilt from tiktoken's ranks (so the local
    GPT2_TIKTOKEN_FILE is enough). Each merge is recovered by running BPE on the token's bytes with only
    the merges ranked below it: what is left are the two halves whose merge made the token."""
    from transformers.convert_slow_tokenizer import bytes_to_unicode
    ranks, byte_char = gpt2_encoding()._mergeable_ranks, bytes_to_unicode()
    text = lambda token: "".join(byte_char[b] for b in token)

    def halves(token, rank):
        parts = [bytes([b]) for b in token]
        while len(parts) > 2:
            pairs = [(ranks.get(a + b, rank), i) for i, (a, b) in enumerate(zip(parts, parts[1:]))]
            best, i = min(pairs)
            if best >= rank:
                break
            parts[i:i + 2] = [parts[i] + parts[i + 1]]
        return parts

    vocab, merges = {}, []
    for token, rank in sorted(ranks.items(), key=lambda item: item[1]):
        vocab[text(token)] = rank
        if len(token) > 1:
            left, right = halves(token, rank)
            merges.append((text(left), text(right)))
    vocab["<|endoftext|>"] = GPT2_EOT
    return vocab, merges


def hf_tokenizer(tokenizer, block_size, vocab_size):
    """A transformers tokenizer that encodes and decodes as ours does, with an eos that is also the pad token
    (docs/export.md#using-the-folder-at-once): a character vocabulary's only where the model has a spare id."""
    from transformers import PreTrainedTokenizerFast
    special, eos = {}, None
    if tokenizer.name == 'gpt2':
        vocab, merges = gpt2_bpe_vocab_merges()
        tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False))
        # ByteLevel splits the text with GPT-2's own regex (tokenizer.GPT2_PAT), then maps bytes to characters
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        special = dict(unk_token="<|endoftext|>")
    elif tokenizer.name == 'char':
        # one token per character: split before every character, look each up, join them back without spaces
        vocab = {ch: i for i, ch in enumerate(tokenizer.itos)}
        if vocab_size > len(vocab) and EOS not in vocab:
            vocab[EOS] = eos = len(tokenizer.itos)
        tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token=None))
        # characters outside the vocabulary are dropped (special tokens match first), so that text holding one
        # encodes as the text without it (docs/export.md#using-the-folder-at-once); code points: none is special
        known = "".join(f"\\x{{{ord(ch):x}}}" for ch in tokenizer.itos)
        tok.normalizer = normalizers.Replace(Regex(f"[^{known}]"), "")
        tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
        tok.decoder = decoders.Fuse()
        if eos is not None:
            tok.add_special_tokens([EOS])
    else:  # 'hf': the dataset's own tokenizers JSON, as it is
        tok = tokenizer.hf
    if tokenizer.eot is not None:  # documents are separated by it: it begins and ends each one
        eot = tok.id_to_token(tokenizer.eot)
        special.update(bos_token=eot, eos_token=eot, pad_token=eot)
    elif eos is not None:
        special.update(eos_token=EOS, pad_token=EOS)
    return PreTrainedTokenizerFast(tokenizer_object=tok, model_max_length=block_size, padding_side="left", **special,
                                   clean_up_tokenization_spaces=False, model_input_names=MODEL_INPUT_NAMES)


def save_tokenizer(hf_tok, folder):
    """save_pretrained, in a form transformers 4 and 5 both load (docs/export.md#two-transformers-versions): a
    class both know, the inputs the model takes (MODEL_INPUT_NAMES), a BPE's merges as 4.x reads them."""
    hf_tok.save_pretrained(folder)
    _rewrite_json(os.path.join(folder, "tokenizer_config.json"), lambda config: config.update(
        tokenizer_class="PreTrainedTokenizerFast", model_input_names=MODEL_INPUT_NAMES))
    _rewrite_json(os.path.join(folder, "tokenizer.json"), legacy_merges)


def legacy_merges(tokenizer_json):
    """A BPE's merges as "left right" strings, which every tokenizers version reads (0.19 reads no pairs). A
    vocabulary whose tokens hold a space (never byte-level BPE's) keeps pairs: only they say where it splits."""
    model = tokenizer_json.get("model", {})
    merges = model.get("merges") or []
    if model.get("type") == "BPE" and all(isinstance(m, list) and " " not in "".join(m) for m in merges):
        model["merges"] = [" ".join(m) for m in merges]


def _rewrite_json(path, change):
    with open(path, encoding="utf-8") as f:
        content = json.load(f)
    change(content)
    with atomic_write(path, "w", encoding="utf-8") as f:
        json.dump(content, f, indent=2, ensure_ascii=False)
