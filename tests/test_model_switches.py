"""
model.py's speedrun switches (qk_norm, mlp_act='relu2', logit_softcap, zero_init_proj, pos_emb='rope',
value_embeds, skip_connections): each one's shapes, gradients reaching every parameter, what a checkpoint
records and reloads, its export refusal, which optimizer takes its parameters, a train.py run resumed, and that
generation with the KV cache still matches the uncached model.
"""
import io

import pytest
import torch
import torch.nn.functional as F
from test_checkpoint import data_dir, flags, log_rows, train  # noqa: F401 (data_dir is a fixture)

import model as model_lib
from gpt import optim
from gpt.checkpoint import model_from_checkpoint
from gpt.hf import to_hf
from gpt.runtime.errors import UserError
from model import GPT, GPTConfig

V, T = 64, 16
SWITCHES = {'qk_norm': dict(qk_norm=True), 'relu2': dict(mlp_act='relu2'), 'softcap': dict(logit_softcap=5.0),
            'zero_init_proj': dict(zero_init_proj=True), 'llama_qk_norm': dict(family='llama', qk_norm=True),
            'rope': dict(pos_emb='rope'), 'value_embeds': dict(value_embeds=1),
            'skip_connections': dict(skip_connections=True),
            'llama_value_embeds_skips': dict(family='llama', n_kv_head=1, value_embeds=1, skip_connections=True)}


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


@pytest.mark.parametrize("kw", [dict(pos_emb='rope', qk_norm=True, value_embeds=1, skip_connections=True),
                                dict(family='llama', n_kv_head=1, value_embeds=1)], ids=["speedrun", "llama"])
def test_bf16_residual_keeps_the_stream_in_bf16_and_the_loss(kw):
    """Under bf16 autocast every block and norm sees and returns bf16; the loss and gradients stay those of
    the float32 stream to bf16's rounding. Without autocast the switch changes nothing."""
    X, Y = batch()
    models = [tiny(**kw), tiny(**kw, bf16_residual=True)]
    assert all(torch.equal(models[0](X, Y)[1], m(X, Y)[1]) for m in models)  # float32: bit for bit
    seen = []
    for module in models[1].modules():
        if isinstance(module, (model_lib.Block, model_lib.LayerNorm, model_lib.RMSNorm)):
            module.register_forward_hook(lambda m, args, out: seen.append((args[0].dtype, out.dtype)))
    grads, losses = [], []
    for m in models:
        with torch.autocast('cpu', dtype=torch.bfloat16):
            loss = m(X, Y)[1]
        loss.backward()
        grads.append(torch.cat([p.grad.flatten() for p in m.parameters()]))
        losses.append(loss.item())
        assert loss.dtype == torch.float32 and 3.5 < loss.item() < 4.8
    assert len(seen) > 6 and set(seen) == {(torch.bfloat16, torch.bfloat16)}
    assert abs(models[0](X, Y)[1].item() - models[1](X, Y)[1].item()) < 1e-6  # the same weights
    assert abs(losses[0] - losses[1]) < 0.01 and losses[0] != losses[1]  # bf16's sums, not float32's
    assert F.cosine_similarity(grads[0], grads[1], dim=0) > 0.999 and grads[1].isfinite().all()


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


@pytest.mark.parametrize("switch", ['qk_norm', 'softcap', 'llama_qk_norm', 'rope', 'value_embeds', 'skip_connections',
                                    'llama_value_embeds_skips'])
def test_cached_generation_matches_uncached(switch):
    model = tiny(**SWITCHES[switch]).eval()
    prompt = torch.randint(0, V, (2, 4), generator=torch.Generator().manual_seed(3))
    a = model.generate(prompt, 8, temperature=0, use_cache=True)
    b = model.generate(prompt, 8, temperature=0, use_cache=False)
    assert torch.equal(a, b)


@pytest.mark.parametrize("kw,name", [(dict(qk_norm=True), 'qk_norm'), (dict(mlp_act='relu2'), 'mlp_act'),
                                     (dict(logit_softcap=30.0), 'logit_softcap'), (dict(pos_emb='rope'), 'pos_emb'),
                                     (dict(value_embeds=1), 'value_embeds'),
                                     (dict(skip_connections=True), 'skip_connections')])
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
    with pytest.raises(UserError, match="pos_emb='alibi' is not an option"):
        tiny(pos_emb='alibi')
    with pytest.raises(UserError, match="pos_emb='rope' is not an option for family llama"):
        tiny(pos_emb='rope', family='llama')
    with pytest.raises(UserError, match="rotary embeddings need an even head size"):
        GPT(GPTConfig(n_layer=2, n_head=4, n_embd=36, pos_emb='rope'))
    for n in (2, -1):  # 2 tables over 2 layers would serve layers 0, 1 as "first" and again as "last"
        with pytest.raises(UserError, match=f"value_embeds={n} must be 0 .off. or up to n_layer // 2 = 1"):
            tiny(value_embeds=n)



def deep(seed=0, n_layer=5, **kw):
    """Deeper than tiny(): with 5 layers the first and last two differ from the middle one."""
    torch.manual_seed(seed)
    return GPT(GPTConfig(n_layer=n_layer, n_head=2, n_embd=32, block_size=T, vocab_size=V, dropout=0.0, **kw))


def perturb(model, *names):
    """Move the named parameters off their initial values (0.5, 1): a test must see them used."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(names):
                p.add_(torch.randn_like(p) * 0.5)
    return model


def test_rope_positions_replace_the_learned_table():
    model = deep(n_layer=1, pos_emb='rope').eval()
    assert 'wpe' not in model.transformer and model.config.checkpoint_args()['pos_emb'] == 'rope'
    x = torch.randint(0, V, (1, 8), generator=torch.Generator().manual_seed(0))
    swapped = x[:, [1, 0, *range(2, 8)]]
    with torch.no_grad():
        # one layer's attention is a weighted sum over a set: without positions the last token cannot tell the
        # order of the first two; rotated queries and keys can
        assert not torch.allclose(model(x)[0], model(swapped)[0], atol=1e-6)
        no_positions = deep(n_layer=1).eval()
        no_positions.transformer.wpe.weight.zero_()
        torch.testing.assert_close(no_positions(x)[0], no_positions(swapped)[0])


def test_value_embeds_serve_the_first_and_last_layers():
    cfg = GPTConfig(n_layer=5, n_head=4, n_kv_head=2, n_embd=32, family='llama', value_embeds=2)
    assert [cfg.value_table(i) for i in range(5)] == [0, 1, None, 0, 1]  # modded-nanogpt's 012...012 pattern
    assert [GPTConfig(n_layer=4).value_table(i) for i in range(4)] == [None] * 4
    model = GPT(cfg)
    # a table is as wide as the values (2 key/value heads of 8: 16), not the residual stream
    assert [t.weight.shape for t in model.transformer.value_embeds] == [(cfg.vocab_size, 16)] * 2
    assert [hasattr(b.attn, 've_lambdas') for b in model.transformer.h] == [True, True, False, True, True]
    # lookup tables, like wpe: not in the parameters that cost FLOPs
    assert model.get_num_params() == GPT(GPTConfig(**{**vars(cfg), 'value_embeds': 0})).get_num_params() + 4 * 2


def test_value_embeds_mix_into_the_values():
    model, plain = perturb(deep(value_embeds=2), 'value_embeds.0.weight').eval(), deep().eval()
    missing, unexpected = plain.load_state_dict(model.state_dict(), strict=False)
    assert not missing and all('value_embeds' in k or 've_lambdas' in k for k in unexpected) and len(unexpected) == 6
    x, _ = batch()
    with torch.no_grad():
        assert not torch.allclose(model(x)[0], plain(x)[0], atol=1e-4)
        for block in model.transformer.h:  # the own values at weight 1, the tables' at 0: the plain model
            if hasattr(block.attn, 've_lambdas'):
                block.attn.ve_lambdas.copy_(torch.tensor([1.0, 0.0]))
        torch.testing.assert_close(model(x)[0], plain(x)[0])


def test_skip_connections_add_each_first_half_output_to_its_mirror_block():
    model = perturb(deep(skip_connections=True), 'skip_weights').eval()
    w, b = model.skip_weights, model.transformer.h
    assert w.shape == (2,)  # 5 layers: blocks 0, 1 feed blocks 4, 3; the middle block 2 neither
    x, _ = batch()
    with torch.no_grad():
        h0 = b[0](model.transformer.wte(x) + model.transformer.wpe(torch.arange(T)))
        h1 = b[1](h0)
        h2 = b[2](h1)
        h3 = b[3](h2 + w[1] * h1)
        h4 = b[4](h3 + w[0] * h0)
        torch.testing.assert_close(model(x)[0], model.lm_head(model.transformer.ln_f(h4))[:, -1:])


def test_muon_takes_only_the_blocks_matrices():
    """The switches' tables and scalars are AdamW's, as modded-nanogpt's (embeddings and scalars under Adam)."""
    model = deep(pos_emb='rope', value_embeds=2, skip_connections=True)
    opt = optim.build(model, dict(name='muon', learning_rate=1e-3, weight_decay=0.1, betas=(0.9, 0.95), muon_lr=0.02,
                                  muon_momentum=0.95, muon_weight_decay=0.0, muon_shard=True), 'cpu')
    groups = {id(p): g for g in opt.param_groups for p in g['params']}
    for name, p in model.named_parameters():
        if name.startswith('transformer.h.') and p.dim() == 2:
            assert groups[id(p)].get('muon'), name
        else:
            assert not groups[id(p)].get('muon'), name
            assert groups[id(p)]['weight_decay'] == (0.1 if p.dim() == 2 else 0.0), name  # tables decay, scalars not


def test_train_py_resumes_a_run_with_the_switches(data_dir, tmp_path):  # noqa: F811
    """train.py end to end: 8 steps at once, or 4 then a resume to 8, with Muon; the checkpoint records the
    switches, and a resume that asks for another value of one is refused, naming it."""
    args = ["--optimizer=muon", "--pos_emb=rope", "--value_embeds=1", "--skip_connections=True"]
    whole, halves = tmp_path / "whole", tmp_path / "halves"
    train(data_dir, whole, *flags(max_iters=8, dropout=0.0), *args)
    train(data_dir, halves, *flags(max_iters=4, dropout=0.0), *args)
    ckpt = torch.load(halves / "ckpt.pt", weights_only=True)
    assert {k: ckpt["model_args"][k] for k in ("pos_emb", "value_embeds", "skip_connections")} == dict(
        pos_emb='rope', value_embeds=1, skip_connections=True)
    assert "skip_weights" in ckpt["model"] and "transformer.value_embeds.0.weight" in ckpt["model"]
    wrong = train(data_dir, halves, *flags(max_iters=8, dropout=0.0, init_from="resume"), "--optimizer=muon",
                  "--skip_connections=False", check=False)
    assert wrong.returncode == 2 and "skip_connections=False (model: True)" in wrong.stderr
    train(data_dir, halves, *flags(max_iters=8, dropout=0.0, init_from="resume"), "--optimizer=muon")
    a, b = log_rows(whole), log_rows(halves)
    assert len(a) >= 8 and [(r["loss"], r["lr"]) for r in a] == [(r["loss"], r["lr"]) for r in b]
    assert wrong.stderr.strip().splitlines() == [next(line for line in wrong.stderr.splitlines()
                                                      if line.startswith("error:"))]
