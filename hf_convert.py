"""
GPT (family='llama') <-> transformers' LlamaForCausalLM: the config, and the weights. Ours fuse what Llama
keeps apart - attn.c_attn is [q_proj; k_proj; v_proj] and mlp.c_fc is [gate_proj; up_proj], stacked by rows -
and our rotary embedding uses transformers' rotate_half layout, so no weight is permuted.

    config, state_dict = to_hf_llama(model)    # export: LlamaForCausalLM(config).load_state_dict(state_dict)
    model = from_hf_llama(hf_model)            # import; GPT.from_pretrained(folder) calls load_hf_llama
"""
import torch

from errors import UserError
from model import GPT, GPTConfig


def _key_map(cfg):
    """[(our key, [(transformers key, rows), ...])]: each of our tensors is its transformers tensors stacked."""
    C, H, kv = cfg.n_embd, cfg.mlp_hidden, cfg.n_kv_head * (cfg.n_embd // cfg.n_head)
    pairs = [("transformer.wte.weight", [("model.embed_tokens.weight", cfg.vocab_size)]),
             ("transformer.ln_f.weight", [("model.norm.weight", C)]),
             ("lm_head.weight", [("lm_head.weight", cfg.vocab_size)])]
    for i in range(cfg.n_layer):
        ours, theirs = f"transformer.h.{i}.", f"model.layers.{i}."
        pairs += [(ours + "ln_1.weight", [(theirs + "input_layernorm.weight", C)]),
                  (ours + "ln_2.weight", [(theirs + "post_attention_layernorm.weight", C)])]
        for kind in ("weight", "bias") if cfg.bias else ("weight",):
            pairs += [
                (ours + f"attn.c_attn.{kind}", [(theirs + f"self_attn.{p}_proj.{kind}", n)
                                                for p, n in (("q", C), ("k", kv), ("v", kv))]),
                (ours + f"attn.c_proj.{kind}", [(theirs + f"self_attn.o_proj.{kind}", C)]),
                (ours + f"mlp.c_fc.{kind}", [(theirs + f"mlp.{p}_proj.{kind}", H) for p in ("gate", "up")]),
                (ours + f"mlp.c_proj.{kind}", [(theirs + f"mlp.down_proj.{kind}", C)]),
            ]
    return pairs


def to_hf_llama(model):
    """(transformers.LlamaConfig, state dict for LlamaForCausalLM) of a llama-family GPT. The tensors are
    views of the model's own (no copies); with tied embeddings lm_head.weight is embed_tokens.weight."""
    from transformers import LlamaConfig
    cfg = model.config
    if cfg.family != "llama":
        raise UserError(f"to_hf_llama needs a llama-family model, not family '{cfg.family}'")
    config = LlamaConfig(
        vocab_size=cfg.vocab_size, hidden_size=cfg.n_embd, intermediate_size=cfg.mlp_hidden,
        num_hidden_layers=cfg.n_layer, num_attention_heads=cfg.n_head, num_key_value_heads=cfg.n_kv_head,
        head_dim=cfg.n_embd // cfg.n_head, max_position_embeddings=cfg.block_size, rms_norm_eps=cfg.norm_eps,
        rope_theta=cfg.rope_theta, attention_bias=cfg.bias, mlp_bias=cfg.bias, hidden_act="silu",
        tie_word_embeddings=cfg.tie_embeddings)
    ours = model.state_dict()
    state_dict = {}
    for key, parts in _key_map(cfg):
        for (name, _), tensor in zip(parts, ours[key].split([n for _, n in parts])):
            state_dict[name] = tensor
    return config, state_dict


def _rope_theta(c):
    """The rotary base of a LlamaConfig (transformers 5 keeps it in rope_parameters, 4 in rope_theta);
    scaled variants (Llama 3.1's 'llama3', 'linear', 'yarn', ...) are refused rather than run wrongly."""
    rope = getattr(c, "rope_parameters", None) or getattr(c, "rope_scaling", None) or {}
    kind = rope.get("rope_type", rope.get("type", "default"))
    if kind != "default":
        raise UserError(f"this Llama uses rope_type '{kind}'; only plain rotary embeddings are supported")
    return float(rope.get("rope_theta", getattr(c, "rope_theta", 10000.0)))


def from_hf_llama(hf_model, dropout=0.0):
    """A llama-family GPT with the weights of a transformers LlamaForCausalLM."""
    c = hf_model.config
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    mlp_bias = getattr(c, "mlp_bias", False)
    if c.hidden_act != "silu" or head_dim * c.num_attention_heads != c.hidden_size or c.attention_bias != mlp_bias:
        raise UserError(f"unsupported Llama variant (hidden_act {c.hidden_act}, head_dim {head_dim} x "
                        f"{c.num_attention_heads} heads vs hidden_size {c.hidden_size}, attention_bias "
                        f"{c.attention_bias}, mlp_bias {mlp_bias})")
    config = GPTConfig(family="llama", block_size=c.max_position_embeddings, vocab_size=c.vocab_size,
                       n_layer=c.num_hidden_layers, n_head=c.num_attention_heads, n_embd=c.hidden_size,
                       n_kv_head=c.num_key_value_heads or c.num_attention_heads, mlp_hidden=c.intermediate_size,
                       rope_theta=_rope_theta(c), norm_eps=c.rms_norm_eps, bias=c.attention_bias,
                       tie_embeddings=bool(c.tie_word_embeddings), dropout=dropout)
    model = GPT(config)
    theirs = hf_model.state_dict()
    if config.tie_embeddings:
        theirs.setdefault("lm_head.weight", theirs["model.embed_tokens.weight"])
    with torch.no_grad():
        model.load_state_dict({key: torch.cat([theirs[name] for name, _ in parts])
                               for key, parts in _key_map(config)})
    return model


def load_hf_llama(folder, dropout=0.0):
    """from_hf_llama of a folder written by LlamaForCausalLM.save_pretrained."""
    from transformers import LlamaForCausalLM
    print(f"loading Llama weights from {folder}")
    return from_hf_llama(LlamaForCausalLM.from_pretrained(folder), dropout)
