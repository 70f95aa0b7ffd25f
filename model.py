"""
The GPT language model, GPT-2 architecture, in one file.
References:
1) OpenAI's GPT-2 TensorFlow implementation: https://github.com/openai/gpt-2/blob/master/src/model.py
2) huggingface/transformers' PyTorch implementation, whose weights `from_pretrained` loads
3) nanoGPT's model.py, whose checkpoints this one reads
"""
import inspect
import math
from contextlib import nullcontext
from dataclasses import dataclass

import torch
import torch.nn as nn
from torch.nn import functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import hardware

_SDPA_WITHOUT_CUDNN = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


@dataclass
class GPTConfig:
    block_size: int = 1024
    vocab_size: int = 50304  # GPT-2's 50257 padded up to a multiple of 64 for efficiency
    n_layer: int = 12
    n_head: int = 12
    n_embd: int = 768
    dropout: float = 0.0
    bias: bool = True  # bias in Linears and LayerNorms, like GPT-2; False is a bit better and faster


class LayerNorm(nn.Module):
    """LayerNorm with an optional bias (PyTorch's has no bias=False before 2.1, and we keep nanoGPT's keys)."""

    def __init__(self, ndim, bias):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(ndim))
        self.bias = nn.Parameter(torch.zeros(ndim)) if bias else None

    def forward(self, x):
        return F.layer_norm(x, self.weight.shape, self.weight, self.bias, 1e-5)


class KVCache:
    """Keys and values of every layer for the positions seen so far, preallocated to block_size,
    so generating one more token runs the model on one position instead of the whole context."""

    def __init__(self, n_layer, capacity):
        self.kv = [None] * n_layer
        self.capacity = capacity
        self.pos = 0  # number of positions already in the cache

    def update(self, layer, k, v):
        """Store this layer's new keys/values (B, nh, T, hs) and return all of them so far."""
        B, nh, T, hs = k.shape
        if self.kv[layer] is None:
            self.kv[layer] = (k.new_empty(B, nh, self.capacity, hs), v.new_empty(B, nh, self.capacity, hs))
        ck, cv = self.kv[layer]
        ck[:, :, self.pos:self.pos + T] = k
        cv[:, :, self.pos:self.pos + T] = v
        return ck[:, :, :self.pos + T], cv[:, :, :self.pos + T]


class CausalSelfAttention(nn.Module):

    def __init__(self, config, layer_idx):
        super().__init__()
        assert config.n_embd % config.n_head == 0
        self.layer_idx = layer_idx
        # key, query, value projections for all heads, in a batch
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.attn_dropout = config.dropout
        self.resid_dropout = nn.Dropout(config.dropout)
        self.n_head = config.n_head
        self.n_embd = config.n_embd

    def forward(self, x, cache=None):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        # (B, T, C) -> (B, nh, T, hs)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        mask, is_causal, kernels = None, True, nullcontext()
        if cache is not None:
            # the key length changes every token, and cuDNN attention builds a new plan for each new shape
            # (~2 ms of CPU per call on an H100, 40 ms per GPT-2 token), so generation leaves it out
            kernels = sdpa_kernel(_SDPA_WITHOUT_CUDNN)
            k, v = cache.update(self.layer_idx, k, v)
            if cache.pos > 0:
                # the new queries sit at positions pos..pos+T-1 and see every cached key up to their own;
                # is_causal would align the mask to the top-left corner, which is wrong here
                is_causal = False
                if T > 1:
                    mask = torch.ones(T, k.size(2), dtype=torch.bool, device=x.device).tril(diagonal=cache.pos)
        # flash attention kernels where the device has them
        dropout = self.attn_dropout if self.training else 0.0
        with kernels:
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout, is_causal=is_causal)
        y = y.transpose(1, 2).contiguous().view(B, T, C)  # re-assemble all head outputs side by side
        return self.resid_dropout(self.c_proj(y))


class MLP(nn.Module):

    def __init__(self, config):
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=config.bias)
        self.gelu = nn.GELU(approximate="tanh")  # GPT-2's own GELU ("gelu_new"), so its weights give its logits
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x):
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))


class Block(nn.Module):

    def __init__(self, config, layer_idx):
        super().__init__()
        self.ln_1 = LayerNorm(config.n_embd, bias=config.bias)
        self.attn = CausalSelfAttention(config, layer_idx)
        self.ln_2 = LayerNorm(config.n_embd, bias=config.bias)
        self.mlp = MLP(config)

    def forward(self, x, cache=None):
        x = x + self.attn(self.ln_1(x), cache)
        x = x + self.mlp(self.ln_2(x))
        return x


class GPT(nn.Module):

    def __init__(self, config):
        super().__init__()
        assert config.vocab_size is not None
        assert config.block_size is not None
        self.config = config
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(config.vocab_size, config.n_embd),
            wpe=nn.Embedding(config.block_size, config.n_embd),
            drop=nn.Dropout(config.dropout),
            h=nn.ModuleList([Block(config, i) for i in range(config.n_layer)]),
            ln_f=LayerNorm(config.n_embd, bias=config.bias),
        ))
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        # weight tying: the output projection is the token embedding (https://paperswithcode.com/method/weight-tying)
        self.transformer.wte.weight = self.lm_head.weight
        self.apply(self._init_weights)
        # GPT-2 scales the init of the residual projections by 1/sqrt(2 * n_layer)
        for pn, p in self.named_parameters():
            if pn.endswith("c_proj.weight"):
                torch.nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))

    def get_num_params(self, non_embedding=True):
        """Number of parameters; by default without the position embeddings (the token embeddings count,
        since they are the lm_head's weights too)."""
        n_params = sum(p.numel() for p in self.parameters())
        if non_embedding:
            n_params -= self.transformer.wpe.weight.numel()
        return n_params

    def _init_weights(self, module):
        if isinstance(module, nn.Linear):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                torch.nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def forward(self, idx, targets=None, cache=None, reduction="mean"):
        """Logits and loss for a batch of token ids (B, T). Targets of -1 are ignored; reduction='none'
        gives the loss of every position (B, T), 0 where ignored. Without targets, only the last position's
        logits are computed (all that generation needs). With a KVCache, idx holds only the new positions."""
        b, t = idx.size()
        start = cache.pos if cache is not None else 0
        assert start + t <= self.config.block_size, \
            f"cannot forward a sequence of length {start + t}, block size is only {self.config.block_size}"
        pos = torch.arange(start, start + t, dtype=torch.long, device=idx.device)
        x = self.transformer.drop(self.transformer.wte(idx) + self.transformer.wpe(pos))
        for block in self.transformer.h:
            x = block(x, cache)
        if cache is not None:
            cache.pos += t
        x = self.transformer.ln_f(x)
        if targets is not None:
            logits = self.lm_head(x)
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1), ignore_index=-1,
                                   reduction=reduction)
            if reduction == "none":
                loss = loss.view(b, t)
        else:
            logits = self.lm_head(x[:, [-1], :])  # a list index keeps the time dimension
            loss = None
        return logits, loss

    def crop_block_size(self, block_size):
        """Shrink the context, e.g. to fine-tune GPT-2 (1024) at a smaller block size."""
        assert block_size <= self.config.block_size
        self.config.block_size = block_size
        self.transformer.wpe.weight = nn.Parameter(self.transformer.wpe.weight[:block_size])

    @classmethod
    def from_pretrained(cls, model_type, override_args=None):
        """GPT-2 weights through transformers: a hub name (gpt2, gpt2-medium, gpt2-large, gpt2-xl) or a
        local folder written by save_pretrained. Only `dropout` may be overridden."""
        override_args = override_args or {}
        assert all(k == "dropout" for k in override_args), f"only dropout can be overridden, got {override_args}"
        from transformers import GPT2LMHeadModel
        print(f"loading GPT-2 weights from {model_type}")
        model_hf = GPT2LMHeadModel.from_pretrained(model_type)
        hf = model_hf.config
        config = GPTConfig(block_size=hf.n_positions, vocab_size=hf.vocab_size, n_layer=hf.n_layer,
                           n_head=hf.n_head, n_embd=hf.n_embd, bias=True,
                           dropout=override_args.get("dropout", 0.0))
        model = GPT(config)
        sd = model.state_dict()
        sd_hf = {k: v for k, v in model_hf.state_dict().items()
                 if not k.endswith((".attn.masked_bias", ".attn.bias"))}  # causal-mask buffers, not weights
        missing = set(sd) - set(sd_hf)
        assert not missing, f"weights missing from {model_type}: {sorted(missing)[:5]}"
        # GPT-2 stores these as Conv1D weights, the transpose of a Linear's
        transposed = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")
        with torch.no_grad():
            for k, v in sd_hf.items():
                if k.endswith(transposed):
                    v = v.t()
                assert v.shape == sd[k].shape, f"{k}: {tuple(v.shape)} does not fit {tuple(sd[k].shape)}"
                sd[k].copy_(v)
        return model

    def configure_optimizers(self, weight_decay, learning_rate, betas, device_type, fused=True):
        # every weight matrix and embedding decays; biases and norm gains do not
        params = [p for p in self.parameters() if p.requires_grad]
        decay_params = [p for p in params if p.dim() >= 2]
        nodecay_params = [p for p in params if p.dim() < 2]
        optim_groups = [
            {"params": decay_params, "weight_decay": weight_decay},
            {"params": nodecay_params, "weight_decay": 0.0},
        ]
        print(f"num decayed parameter tensors: {len(decay_params)}, with {sum(p.numel() for p in decay_params):,} parameters")
        print(f"num non-decayed parameter tensors: {len(nodecay_params)}, with {sum(p.numel() for p in nodecay_params):,} parameters")
        # the fused kernel is much faster where it exists
        use_fused = fused and "fused" in inspect.signature(torch.optim.AdamW).parameters and device_type == "cuda"
        optimizer = torch.optim.AdamW(optim_groups, lr=learning_rate, betas=betas, **({"fused": True} if use_fused else {}))
        print(f"using fused AdamW: {use_fused}")
        return optimizer

    def flops_per_token(self):
        """Training FLOPs per token (forward + backward), PaLM paper Appendix B."""
        N = self.get_num_params()
        cfg = self.config
        L, H, Q, T = cfg.n_layer, cfg.n_head, cfg.n_embd // cfg.n_head, cfg.block_size
        return 6 * N + 12 * L * H * Q * T

    def estimate_mfu(self, fwdbwd_per_iter, dt, peak_flops=None):
        """Model FLOPs utilization: achieved FLOP/s over the peak of the device the model is on (from the
        table in hardware.py, or `peak_flops` when given). None when the peak is unknown (CPU, MPS)."""
        peak_flops = peak_flops or hardware.peak_flops(self.lm_head.weight.device)
        if not peak_flops:
            return None
        flops_per_iter = self.flops_per_token() * self.config.block_size * fwdbwd_per_iter
        return flops_per_iter / dt / peak_flops

    @torch.no_grad()
    def generate(self, idx, max_new_tokens, temperature=1.0, top_k=None, use_cache=True, generator=None,
                 vocab_limit=None):
        """Continue the sequences idx (B, T) by max_new_tokens tokens. temperature 0 is greedy decoding;
        vocab_limit keeps ids below the tokenizer's size when the model's vocabulary is padded.
        With the KV cache each new token costs one position; once a sequence outgrows block_size it is
        cropped to the last block_size tokens, exactly as without the cache."""
        cache = None
        for _ in range(max_new_tokens):
            if idx.size(1) > self.config.block_size:
                # the window slides, so every position's embedding changes: recompute from scratch
                idx_cond, cache = idx[:, -self.config.block_size:], None
            elif use_cache and cache is not None:
                idx_cond = idx[:, cache.pos:]
            else:
                idx_cond = idx
                if use_cache and idx.size(1) < self.config.block_size:
                    cache = KVCache(self.config.n_layer, self.config.block_size)
            logits, _ = self(idx_cond, cache=cache)
            logits = logits[:, -1, :vocab_limit]
            if temperature == 0:
                idx_next = logits.argmax(dim=-1, keepdim=True)
            else:
                logits = logits / temperature
                if top_k is not None:
                    v, _ = torch.topk(logits, min(top_k, logits.size(-1)))
                    logits[logits < v[:, [-1]]] = -float("Inf")
                probs = F.softmax(logits.float(), dim=-1)
                idx_next = torch.multinomial(probs, num_samples=1, generator=generator)
            idx = torch.cat((idx, idx_next), dim=1)
        return idx
