import math

import pytest
import torch
import torch.nn.functional as F

from model import GPT, GPTConfig


def tiny(**kw):
    cfg = dict(block_size=32, vocab_size=101, n_layer=2, n_head=4, n_embd=32, dropout=0.0, bias=True)
    cfg.update(kw)
    torch.manual_seed(0)
    return GPT(GPTConfig(**cfg))


def test_shapes_and_last_position_logits():
    model = tiny()
    idx = torch.randint(0, 101, (3, 16))
    logits, loss = model(idx, idx)
    assert logits.shape == (3, 16, 101) and loss.dim() == 0
    model.config.fused_loss = True
    logits, loss = model(idx, idx)
    assert logits is None and loss.dim() == 0  # training: the fused loss makes no logits
    with torch.no_grad():
        logits, loss = model(idx, idx)
    assert logits.shape == (3, 16, 101) and loss.dim() == 0
    logits, loss = model(idx)
    assert logits.shape == (3, 1, 101) and loss is None
    # the last-position logits are the same numbers the full forward computes
    with torch.no_grad():
        full, _ = model(idx, idx)
    torch.testing.assert_close(logits[:, 0], full[:, -1])


def test_initial_loss_is_near_uniform():
    model = tiny(vocab_size=512, n_embd=64)
    idx = torch.randint(0, 512, (8, 32))
    _, loss = model(idx, torch.randint(0, 512, (8, 32)))
    assert abs(loss.item() - math.log(512)) < 0.1


def test_ignore_index_targets_are_skipped():
    model = tiny()
    idx = torch.randint(0, 101, (2, 8))
    targets = idx.clone()
    targets[:, 4:] = -1
    _, loss_masked = model(idx, targets)
    with torch.no_grad():
        logits, _ = model(idx, idx)
    expected = torch.nn.functional.cross_entropy(logits[:, :4].reshape(-1, 101), idx[:, :4].reshape(-1))
    torch.testing.assert_close(loss_masked, expected)


def test_backward_reaches_every_parameter():
    model = tiny()
    idx = torch.randint(0, 101, (2, 16))
    _, loss = model(idx, idx)
    loss.backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name
        assert p.grad.abs().sum() > 0, name


def test_weight_tying_and_param_count():
    model = tiny(bias=False)
    assert model.lm_head.weight is model.transformer.wte.weight
    n = sum(p.numel() for p in model.parameters())
    assert model.get_num_params(non_embedding=False) == n
    assert model.get_num_params() == n - 32 * 32


@pytest.mark.parametrize("prompt_len", [1, 5, 31])
@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_kv_cache_greedy_generation_matches_uncached(prompt_len, family):
    # llama with grouped-query attention: the cache holds the 2 key/value heads the 4 query heads share
    llama = dict(family="llama", n_kv_head=2, bias=False, tie_embeddings=False)
    model = (tiny(**llama) if family == "llama" else tiny()).eval()
    idx = torch.randint(0, 101, (2, prompt_len))
    # 40 new tokens runs past block_size=32, so the cropping path is exercised too
    cached = model.generate(idx, 40, temperature=0, use_cache=True)
    plain = model.generate(idx, 40, temperature=0, use_cache=False)
    assert cached.shape == (2, prompt_len + 40)
    assert torch.equal(cached, plain)
    # top_k=1 sampling is greedy as well
    assert torch.equal(model.generate(idx, 10, top_k=1), plain[:, :prompt_len + 10])


def test_sampling_uses_the_given_generator_only():
    model = tiny().eval()
    idx = torch.randint(0, 101, (1, 4))
    a = model.generate(idx, 20, top_k=50, generator=torch.Generator().manual_seed(1))
    torch.manual_seed(123)  # the global stream must not matter
    b = model.generate(idx, 20, top_k=50, generator=torch.Generator().manual_seed(1))
    assert torch.equal(a, b)


def test_sampling_draws_what_torch_multinomial_draws():
    # generate() draws without torch.multinomial's input checks, but must draw the same tokens from the
    # same generator state: softmax over the top-k logits (temperature applied), then multinomial
    model = tiny().eval()
    idx = torch.randint(0, 101, (8, 5))
    drawn = model.generate(idx, 1, temperature=0.8, top_k=20, use_cache=False,
                           generator=torch.Generator().manual_seed(7))[:, -1:]
    logits = model(idx)[0][:, -1] / 0.8
    logits[logits < logits.topk(20).values[:, -1:]] = -float('inf')
    expected = torch.multinomial(F.softmax(logits, dim=-1), 1, generator=torch.Generator().manual_seed(7))
    assert torch.equal(drawn, expected)


def test_crop_block_size():
    model = tiny()
    model.crop_block_size(16)
    assert model.config.block_size == 16 and model.transformer.wpe.weight.shape == (16, 32)
    logits, _ = model(torch.randint(0, 101, (1, 16)))
    assert logits.shape == (1, 1, 101)
    with pytest.raises(AssertionError):
        model(torch.randint(0, 101, (1, 17)))
    out = model.eval().generate(torch.randint(0, 101, (1, 4)), 30, temperature=0)
    assert out.shape == (1, 34)


def test_configure_optimizers_decays_matrices_only():
    model = tiny()
    opt = model.configure_optimizers(0.1, 1e-3, (0.9, 0.95), "cpu")
    decay, nodecay = opt.param_groups
    assert decay["weight_decay"] == 0.1 and nodecay["weight_decay"] == 0.0
    assert all(p.dim() >= 2 for p in decay["params"]) and all(p.dim() < 2 for p in nodecay["params"])
    assert len(decay["params"]) + len(nodecay["params"]) == len(list(model.parameters()))


def test_estimate_mfu_uses_the_peak_given():
    model = tiny()
    assert model.estimate_mfu(4, 0.1, peak_flops=None) is None  # CPU: no peak known
    flops = model.flops_per_token() * 32 * 4
    assert model.estimate_mfu(4, 0.1, peak_flops=1e12) == pytest.approx(flops / 0.1 / 1e12)


def test_per_position_losses():
    model = tiny()
    idx = torch.randint(0, 101, (2, 8))
    targets = idx.clone()
    targets[0, :3] = -1
    losses, mean = model(idx, targets, reduction="none")[1], model(idx, targets)[1]
    assert losses.shape == (2, 8) and (losses[0, :3] == 0).all()
    torch.testing.assert_close(losses.sum() / (targets != -1).sum(), mean)


def loss_and_grads(model, idx, targets, fused, dtype=None):
    model.zero_grad()
    model.config.fused_loss = fused
    with torch.autocast("cpu", dtype=dtype, enabled=dtype is not None):
        logits, loss = model(idx, targets)
    (2 * loss).backward()  # a scaled loss, as with gradient accumulation
    return logits, loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_fused_loss_equals_plain_loss_and_gradients(family):
    # the training path (chunked linear + cross-entropy, gradients made in the forward) against lm_head +
    # F.cross_entropy: the same loss and the same gradient for every parameter, ignored targets included
    model = tiny(family=family, tie_embeddings=family == "gpt2")
    model.config.loss_chunk = 37  # chunks that do not divide the 4 * 32 positions
    idx = torch.randint(0, 101, (4, 32))
    targets = torch.randint(0, 101, (4, 32))
    targets[0, :10] = -1
    fused_logits, fused_loss, fused_grads = loss_and_grads(model, idx, targets, fused=True)
    plain_logits, plain_loss, plain_grads = loss_and_grads(model, idx, targets, fused=False)
    assert fused_logits is None and plain_logits.shape == (4, 32, 101)  # the fused path makes no logits
    torch.testing.assert_close(fused_loss, plain_loss, rtol=1e-6, atol=1e-6)
    for name, grad in plain_grads.items():
        torch.testing.assert_close(fused_grads[name], grad, rtol=1e-5, atol=1e-6, msg=name)
    # under bf16 autocast both round the same matmuls to bf16: equal within bf16's resolution
    _, fused_loss, fused_grads = loss_and_grads(model, idx, targets, fused=True, dtype=torch.bfloat16)
    _, plain_loss, plain_grads = loss_and_grads(model, idx, targets, fused=False, dtype=torch.bfloat16)
    torch.testing.assert_close(fused_loss, plain_loss, rtol=2e-3, atol=2e-3)
    for name, grad in plain_grads.items():
        assert (fused_grads[name] - grad).abs().max() <= 2e-2 * grad.abs().max(), name


def test_fused_loss_is_not_used_without_gradients():
    # evaluation (no_grad) still returns the logits, and the same loss
    model = tiny()
    model.config.fused_loss = True
    idx = torch.randint(0, 101, (2, 16))
    with torch.no_grad():
        logits, loss = model(idx, idx)
    assert logits.shape == (2, 16, 101)
    _, fused_loss = model(idx, idx)
    torch.testing.assert_close(fused_loss.detach(), loss)
