"""
model.py's speedrun switches (qk_norm, mlp_act='relu2', logit_softcap, zero_init_proj): each one's shapes,
gradients reaching every parameter, what a checkpoint records and reloads, its export refusal, and that
generation with the KV cache still matches the uncached model.
"""
import io

import pytest
import torch
import torch.nn.functional as F

from gpt.checkpoint import model_from_checkpoint
from gpt.errors import UserError
from gpt.hf import to_hf
from model import GPT, GPTConfig

V, T = 64, 16
SWITCHES = {'qk_norm': dict(qk_norm=True), 'relu2': dict(mlp_act='relu2'), 'softcap': dict(logit_softcap=5.0),
            'zero_init_proj': dict(zero_init_proj=True), 'llama_qk_norm': dict(family='llama', qk_norm=True)}


def tiny(seed=0, **kw):
    torch.manual_seed(seed)
    return GPT(GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=T, vocab_size=V, dropout=0.0, **kw))


def batch(seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, V, (3, T), generator=g), torch.randint(0, V, (3, T), generator=g)


@pytest.mark.parametrize("switch", SWITCHES)
def test_switch_shapes_gradients_and_checkpoint(switch):
    kw = SWITCHES[switch]
    model = tiny(**kw)
    x, y = batch()
    logits, loss = model(x, y)
    assert logits.shape == (3, T, V) and loss.ndim == 0 and torch.isfinite(loss)
    loss.backward()
    # gradients reach every parameter; with zero-initialised projections the blocks' inner weights get none at
    # the first step (their output is multiplied by zero), everything else does
    for name, p in model.named_parameters():
        inner = name.endswith(('c_attn.weight', 'c_fc.weight', 'c_attn.bias', 'c_fc.bias', 'ln_1.weight',
                               'ln_1.bias', 'ln_2.weight', 'ln_2.bias'))
        if switch == 'zero_init_proj' and inner:
            assert p.grad.abs().max() == 0, name
        elif not name.endswith('c_attn.bias'):  # the key bias never matters to softmax
            assert p.grad is not None and p.grad.abs().max() > 0, name
    # the checkpoint records the switch when not default (zero_init_proj never: it is only an init)
    args = model.config.checkpoint_args()
    for k, v in kw.items():
        if k == 'zero_init_proj':
            assert k not in args
        else:
            assert args[k] == v
    f = io.BytesIO()
    torch.save({'model': model.state_dict(), 'model_args': args}, f)
    f.seek(0)
    loaded = model_from_checkpoint(torch.load(f, weights_only=True))
    assert torch.equal(loaded(x, y)[0], model(x, y)[0])


def test_defaults_are_unchanged():
    """No switch: the same config, checkpoint args and numbers as before the switches existed."""
    base = tiny()
    assert base.config.checkpoint_args() == {'block_size': T, 'vocab_size': V, 'n_layer': 2, 'n_head': 2,
                                             'n_embd': 32, 'dropout': 0.0, 'bias': True}
    for block in base.transformer.h:
        assert block.attn.c_proj.weight.std() > 0 and not block.attn.qk_norm and not block.mlp.relu2


def test_zero_init_proj_zeroes_only_the_projections():
    model, base = tiny(zero_init_proj=True), tiny()
    for (name, p), q in zip(model.named_parameters(), base.parameters()):
        if name.endswith('c_proj.weight'):
            assert p.abs().max() == 0
        else:
            assert p.shape == q.shape


def test_relu2_is_relu_squared():
    model = tiny(mlp_act='relu2')
    mlp, x = model.transformer.h[0].mlp, torch.randn(2, 5, 32)
    torch.testing.assert_close(mlp(x), mlp.c_proj(F.relu(mlp.c_fc(x)) ** 2))


def test_qk_norm_makes_attention_ignore_the_scale_of_q_and_k():
    model = tiny(qk_norm=True)
    x = torch.randn(2, T, 32)
    attn = model.transformer.h[0].attn
    out = attn(x)
    with torch.no_grad():  # scale the q and k rows of c_attn: normalised away, v untouched
        attn.c_attn.weight[:64] *= 7.0
        attn.c_attn.bias[:64] *= 7.0
    torch.testing.assert_close(attn(x), out, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("fused", [False, True], ids=["plain", "fused-loss"])
def test_softcap_bounds_logits_and_both_loss_paths_agree(fused):
    model = tiny(logit_softcap=2.0)
    x, y = batch()
    with torch.no_grad():
        model.lm_head.weight.mul_(100)  # large logits, so the cap matters
    logits, _ = model(x)
    assert logits.abs().max() <= 2.0
    model.config.fused_loss = fused
    _, loss = model(x, y)
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    # the reference: the capped logits by hand, cross-entropy by torch
    model.zero_grad()
    h = model.transformer.ln_f(model_hidden(model, x))
    ref = F.cross_entropy(2.0 * torch.tanh(model.lm_head(h) / 2.0).view(-1, V), y.view(-1))
    ref.backward()
    torch.testing.assert_close(loss, ref, rtol=1e-5, atol=1e-6)
    for n, p in model.named_parameters():
        torch.testing.assert_close(grads[n], p.grad, rtol=1e-4, atol=1e-6)


def model_hidden(model, x):
    h = model.transformer.wte(x) + model.transformer.wpe(torch.arange(x.size(1)))
    for block in model.transformer.h:
        h = block(h)
    return h


@pytest.mark.parametrize("switch", ['qk_norm', 'softcap', 'llama_qk_norm'])
def test_cached_generation_matches_uncached(switch):
    model = tiny(**SWITCHES[switch]).eval()
    prompt = torch.randint(0, V, (2, 4), generator=torch.Generator().manual_seed(3))
    a = model.generate(prompt, 8, temperature=0, use_cache=True)
    b = model.generate(prompt, 8, temperature=0, use_cache=False)
    assert torch.equal(a, b)


@pytest.mark.parametrize("kw,name", [(dict(qk_norm=True), 'qk_norm'), (dict(mlp_act='relu2'), 'mlp_act'),
                                     (dict(logit_softcap=30.0), 'logit_softcap')])
def test_export_refuses_what_transformers_cannot_compute(kw, name):
    with pytest.raises(UserError, match=f"cannot export {name}="):
        to_hf(tiny(**kw))


def test_bad_switch_values_are_user_errors():
    with pytest.raises(UserError, match="mlp_act"):
        tiny(mlp_act='swish')
    with pytest.raises(UserError, match="mlp_act"):
        tiny(mlp_act='relu2', family='llama')
    with pytest.raises(UserError, match="logit_softcap"):
        tiny(logit_softcap=-1.0)
