"""
The GPT language model in one file: GPT-2's architecture by default, or a LLaMA-style one (family='llama':
rotary positions, RMSNorm, SwiGLU MLP), with grouped-query attention and untied embeddings as options.
References:
1) OpenAI's GPT-2 TensorFlow implementation: https://github.com/openai/gpt-2/blob/master/src/model.py
2) huggingface/transformers' PyTorch implementations, whose GPT-2 and Llama weights `from_pretrained` loads
3) nanoGPT's model.py, whose checkpoints this one reads"""
import inspect
import math
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field, fields
from functools import partial

import torch
import torch.nn as nn
from torch.nn import functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from gpt import generation
from gpt.kernels import dispatch
from gpt.kernels.loss import logits_and_loss
from gpt.optim import adamw
from gpt.runtime.errors import UserError
from gpt.runtime.settings import MODEL, NOT_NEGATIVE, POSITIVE, RUN, Setting, at_least, comments

_SDPA_WITHOUT_CUDNN = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


# Every GPTConfig field is one of three kinds (docs/configuration.md says what each means for resume, export and
# checkpoints), said here once: the plan, export and the transformers bridge read it (GPTConfig.fields_of) instead
# of keeping lists of their own, so a new field cannot be forgotten by one of them
ARCHITECTURE, INITIALISATION, RUNTIME = 'architecture', 'initialisation', 'runtime'


def _field(kind, default, check=()):
    return field(default=default, metadata={'kind': kind, 'check': check})


architecture, initialisation, runtime = (partial(_field, kind) for kind in (ARCHITECTURE, INITIALISATION, RUNTIME))


@dataclass
class GPTConfig:
    block_size: int = architecture(1024)
    vocab_size: int = architecture(50304)  # GPT-2's 50257 padded up to a multiple of 64 for efficiency
    n_layer: int = architecture(12)
    n_head: int = architecture(12)
    n_embd: int = architecture(768)
    dropout: float = runtime(0.0)
    bias: bool = architecture(True)  # bias in Linears and LayerNorms, like GPT-2; False is a bit better and faster
    # the fields below are not nanoGPT's: a checkpoint records them only where they differ from these defaults
    family: str = architecture('gpt2')  # 'gpt2': learned positions, LayerNorm, GELU MLP; 'llama': RoPE, RMSNorm, SwiGLU
    n_kv_head: int = architecture(0, at_least(0, "0 (n_head) or more"))  # key/value heads (0: n_head); fewer: GQA
    mlp_hidden: int = architecture(0, NOT_NEGATIVE)  # MLP width (0: 4 x n_embd for gpt2, about 8/3 for llama)
    rope_theta: float = architecture(10000.0, POSITIVE)  # llama: base of the rotary position embeddings' frequencies
    tie_embeddings: bool = architecture(True)  # the output projection is the token embedding (GPT-2's; LLaMA's not)
    norm_eps: float = architecture(1e-5)  # of LayerNorm / RMSNorm (a Llama from transformers brings its own)
    # switches of the modded-nanogpt speedrun (docs/speedrun.md), all off by default
    qk_norm: bool = architecture(False)  # RMSNorm (without a gain) on each head's queries and keys before attention
    mlp_act: str = architecture('gelu')  # gpt2's MLP: 'gelu' (GPT-2's tanh GELU) or 'relu2' (ReLU squared)
    logit_softcap: float = architecture(0.0)  # > 0: logits = cap * tanh(logits / cap), in training and generation
    pos_emb: str = architecture('learned')  # gpt2's positions: 'learned' (GPT-2's wpe table) or 'rope' (rotary)
    value_embeds: int = architecture(0)  # N value embedding tables for the first and last N layers (0: none)
    skip_connections: bool = architecture(False)  # U-net skips from the first half's blocks to their mirrors
    zero_init_proj: bool = initialisation(False)  # residual projections start at zero: each block the identity
    fused_loss: bool = runtime(False)  # the head and loss a chunk at a time, no full logits (gpt/kernels/loss.py)
    loss_chunk: int = runtime(4096)  # positions per chunk: its fp32 logits are loss_chunk x vocab_size
    fused_qk: bool = runtime(False)  # QK-norm and rotary embeddings in one Triton kernel (a CUDA GPU, uncompiled)
    fused_norm: bool = runtime(False)  # gpt2's LayerNorm as a Triton kernel each way (a CUDA GPU, uncompiled)
    bf16_residual: bool = runtime(False)  # under bf16 autocast the residual stream in bf16: half the bytes, coarser

    def __post_init__(self):
        if self.family not in ('gpt2', 'llama'):
            raise UserError(f"unknown model family '{self.family}': use gpt2 or llama")
        self.n_kv_head = self.n_kv_head or self.n_head
        if self.n_embd % self.n_head:  # each head gets an equal share of the width
            heads = sorted(range(1, self.n_embd + 1), key=lambda d: (self.n_embd % d, abs(d - self.n_head)))[:2]
            raise UserError(f"n_head={self.n_head} does not divide n_embd={self.n_embd}: give an n_head that does "
                            f"(e.g. {' or '.join(map(str, sorted(heads)))}) or an n_embd that {self.n_head} divides")
        if self.n_head % self.n_kv_head:  # query heads share key/value heads in equal groups
            raise UserError(f"n_kv_head={self.n_kv_head} does not divide n_head={self.n_head}: give an n_kv_head "
                            f"that does, or 0 (as many as n_head)")
        if self.pos_emb not in ('learned', 'rope') or (self.pos_emb != 'learned' and self.family != 'gpt2'):
            raise UserError(f"pos_emb='{self.pos_emb}' is not an option for family {self.family}: use learned or "
                            f"rope (family gpt2; llama's positions are always rotary)")
        if self.rotary and (self.n_embd // self.n_head) % 2:
            raise UserError(f"rotary embeddings need an even head size, not {self.n_embd // self.n_head}")
        if not 0 <= self.value_embeds <= self.n_layer // 2:
            raise UserError(f"value_embeds={self.value_embeds} must be 0 (off) or up to n_layer // 2 = "
                            f"{self.n_layer // 2}: each table serves one of the first and one of the last layers")
        if self.mlp_act not in ('gelu', 'relu2') or (self.mlp_act != 'gelu' and self.family != 'gpt2'):
            raise UserError(f"mlp_act='{self.mlp_act}' is not an option for family {self.family}: use gelu or "
                            f"relu2 (family gpt2; llama's MLP is SwiGLU)")
        if not self.logit_softcap >= 0:
            raise UserError(f"logit_softcap must be 0 (off) or positive, not {self.logit_softcap}")
        if not self.mlp_hidden:
            # llama: 8/3 x n_embd (three matrices, as many weights as GPT-2's two of 4 x), up to a multiple of 64
            self.mlp_hidden = 4 * self.n_embd if self.family == 'gpt2' else -(-8 * self.n_embd // (3 * 64)) * 64

    @property
    def rotary(self):
        """Whether positions are rotary embeddings of queries and keys (else GPT-2's learned table)."""
        return self.family == 'llama' or self.pos_emb == 'rope'

    def value_table(self, layer):
        """The index of the value embedding table this layer mixes in, or None: table i serves layer i and
        layer n_layer - value_embeds + i (modded-nanogpt's 012...012 pattern), the middle layers none."""
        first_of_last = self.n_layer - self.value_embeds
        if layer < self.value_embeds:
            return layer
        return layer - first_of_last if layer >= first_of_last else None

    @classmethod
    def fields_of(cls, kind):
        return tuple(f.name for f in fields(cls) if f.metadata['kind'] == kind)

    @classmethod
    def architecture_fields(cls):
        """What the model computes: the fields a resumed or pretrained model keeps, export carries or refuses."""
        return cls.fields_of(ARCHITECTURE)

    @classmethod
    def settings(cls):
        """The fields beyond nanoGPT's, the loss's and norm_eps (the model switches train.py takes besides n_layer,
        n_head, ...) as Settings; a resumed or pretrained model keeps its architecture and initialisation (plan.py)."""
        with open(inspect.getsourcefile(cls), encoding='utf-8') as f:  # not getsource: it parses the whole file,
            source = f.read()  # at every launch
        docs = comments(source[source.index(f'\nclass {cls.__name__}'):])  # the fields' own lines come first
        return {f.name: Setting(f.metadata.get('check', ()), RUN if f.metadata['kind'] == RUNTIME else MODEL,
                                default=f.default, doc=docs.get(f.name, ''))
                for f in fields(cls) if f.name not in NANOGPT_ARGS + ('fused_loss', 'loss_chunk', 'norm_eps')}

    def checkpoint_args(self):
        """model_args for a checkpoint: nanoGPT's keys, plus the other architecture fields where they differ
        from their defaults - so a GPT-2 checkpoint is still one nanoGPT reads, and a checkpoint without them is
        GPT-2. Initialisation and runtime fields (but nanoGPT's dropout) describe a run, not the model."""
        default = GPTConfig(n_embd=self.n_embd, n_head=self.n_head)  # n_kv_head, mlp_hidden follow these
        return {k: v for k, v in asdict(self).items()
                if k in NANOGPT_ARGS or (k in self.fields_of(ARCHITECTURE) and v != getattr(default, k))}


NANOGPT_ARGS = ('n_layer', 'n_head', 'n_embd', 'block_size', 'bias', 'vocab_size', 'dropout')  # nanoGPT's model_args


class RMSNorm(nn.Module):
    """LLaMA's norm: scale by the root mean square, no centring, no bias; computed in float32 as in
    transformers' Llama, so its weights give its logits."""

    def __init__(self, ndim, eps=1e-5):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(ndim))
        self.eps = eps

    def forward(self, x):
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight.type_as(x) * x32.type_as(x)  # a bf16 residual stream (bf16_residual) stays bf16


class LayerNorm(nn.LayerNorm):
    """nn.LayerNorm, but a bf16 input (bf16_residual) gives a bf16 output, the statistics still in float32:
    autocast would run it in float32 and hand the next matmul a float32 copy to cast back. fused_norm: the same
    math by gpt/kernels/layer_norm.py's kernels, where they run."""

    def __init__(self, config):
        super().__init__(config.n_embd, eps=config.norm_eps, bias=config.bias)  # nanoGPT's keys, bias or none
        self.config = config  # the model's own, whose runtime fields (fused_norm) a run may change

    def forward(self, x):
        if self.config.fused_norm and (fused := dispatch.norm_kernel(x)) is not None:
            return fused(x, self.weight, self.bias, self.eps)
        if x.dtype == torch.float32:
            return super().forward(x)
        with torch.autocast(x.device.type, enabled=False):
            bias = None if self.bias is None else self.bias.to(x.dtype)
            return F.layer_norm(x, self.normalized_shape, self.weight.to(x.dtype), bias, self.eps)


def make_norm(config):
    return RMSNorm(config.n_embd, config.norm_eps) if config.family == 'llama' else LayerNorm(config)


def rotary(positions, head_size, theta):
    """cos and sin (T, head_size) of the rotary embedding's angles at these positions, in float32, laid out
    as transformers' Llama does: the frequencies twice over, for rotate_half's two halves."""
    # 1 / theta^(2i / d) computed as transformers does (not theta^-(2i / d), which rounds differently)
    dims = torch.arange(0, head_size, 2, device=positions.device, dtype=torch.float32)
    inv_freq = 1.0 / (theta ** (dims / head_size))
    angles = positions.float()[:, None] * inv_freq[None, :]
    angles = torch.cat((angles, angles), dim=-1)
    return angles.cos(), angles.sin()


def apply_rotary(x, cos, sin):
    """Rotate each (first half, second half) pair of x (B, nh, T, hs) by its position's angle."""
    x1, x2 = x.chunk(2, dim=-1)
    rotated = torch.cat((-x2, x1), dim=-1)  # transformers' rotate_half
    return (x * cos + rotated * sin).type_as(x)


class CausalSelfAttention(nn.Module):
    def __init__(self, config, layer_idx):
        super().__init__()
        self.layer_idx = layer_idx
        self.n_head, self.n_kv_head = config.n_head, config.n_kv_head
        self.head_size = config.n_embd // config.n_head
        self.qk_norm, self.norm_eps = config.qk_norm, config.norm_eps
        self.config = config  # the model's own, whose runtime fields (fused_qk) a run may change
        # query, key and value projections for all heads, in a batch (fewer key/value heads with GQA)
        self.c_attn = nn.Linear(config.n_embd, (self.n_head + 2 * self.n_kv_head) * self.head_size, bias=config.bias)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.attn_dropout = config.dropout
        self.resid_dropout = nn.Dropout(config.dropout)
        # with a value embedding table: the weights of this layer's own values and of the table's, modded-nanogpt's
        # 0.5 and 0.5 to start. Layers without a table keep their values as they are (modded-nanogpt scales them
        # by a learned scalar too, which c_attn's value rows can learn as well)
        if config.value_table(layer_idx) is not None:
            self.ve_lambdas = nn.Parameter(torch.tensor([0.5, 0.5]))

    def forward(self, x, cache=None, rope=None, ve=None):
        B, T, C = x.size()
        hs, kv_size = self.head_size, self.n_kv_head * self.head_size
        qkv = self.c_attn(x)
        q, k, v = qkv.split([C, kv_size, kv_size], dim=2)
        if ve is not None:  # value embeddings: each token's vector from this layer's table, mixed into its value
            v = self.ve_lambdas[0] * v + self.ve_lambdas[1] * ve
        q, k = q.view(B, T, self.n_head, hs), k.view(B, T, self.n_kv_head, hs)
        # fused_qk: the Triton kernel where it runs (gpt/kernels/fused_qk.py), the same math as the plain path
        fused = dispatch.qk_kernel(q) if self.config.fused_qk and (self.qk_norm or rope is not None) else None
        if fused is not None:
            q, k = fused(q, k, rope, self.norm_eps if self.qk_norm else None)
        q, k = q.transpose(1, 2), k.transpose(1, 2)  # (B, T, nh, hs) -> (B, nh, T, hs)
        if self.qk_norm and fused is None:  # each head's queries and keys to unit RMS: logits cannot blow up
            q, k = F.rms_norm(q, (hs,), eps=self.norm_eps), F.rms_norm(k, (hs,), eps=self.norm_eps)
        if rope is not None and fused is None:
            q, k = apply_rotary(q, *rope), apply_rotary(k, *rope)
        v = v.view(B, T, self.n_kv_head, hs).transpose(1, 2)
        mask, kernels = None, nullcontext()
        if cache is not None:
            # every prompt length is a new shape, for which cuDNN attention builds a new plan (CPU time at
            # every call), so generation leaves it out
            kernels = sdpa_kernel(_SDPA_WITHOUT_CUDNN)
            # the new keys and values by position, (B, T, 2, n_kv_head, hs): without rotary embeddings (and
            # QK-norm, value embeddings) a view of qkv, so the cache takes both in one copy
            as_computed = rope is None and not self.qk_norm and ve is None
            new = (qkv[..., C:].view(B, T, 2, self.n_kv_head, hs) if as_computed else
                   torch.stack((k.transpose(1, 2), v.transpose(1, 2)), dim=2))
            # a generation.KVCache: the keys of its whole capacity, and a mask of those each query may see
            k, v, mask = cache.update(self.layer_idx, new)
        if self.n_kv_head != self.n_head:
            # grouped-query attention: key/value head j serves query heads j*g .. j*g+g-1 (transformers'
            # repeat_kv); expanding here runs on every torch and every SDPA kernel, unlike enable_gqa
            k = k.repeat_interleave(self.n_head // self.n_kv_head, dim=1)
            v = v.repeat_interleave(self.n_head // self.n_kv_head, dim=1)
        dropout = self.attn_dropout if self.training else 0.0
        with kernels:
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout, is_causal=mask is None)
        y = y.transpose(1, 2).contiguous().view(B, T, C)  # re-assemble all head outputs side by side
        return self.resid_dropout(self.c_proj(y))


class MLP(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, config.mlp_hidden, bias=config.bias)
        self.gelu = nn.GELU(approximate="tanh")  # GPT-2's own GELU ("gelu_new"), so its weights give its logits
        self.relu2 = config.mlp_act == 'relu2'  # or ReLU squared (So et al. 2021, Primer; modded-nanogpt)
        self.c_proj = nn.Linear(config.mlp_hidden, config.n_embd, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x):
        h = self.c_fc(x)
        return self.dropout(self.c_proj(F.relu(h).square() if self.relu2 else self.gelu(h)))


class SwiGLU(nn.Module):
    """LLaMA's MLP: silu(gate(x)) * up(x), projected back; gate and up are one Linear (one matmul)."""

    def __init__(self, config):
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 2 * config.mlp_hidden, bias=config.bias)  # [gate; up]
        self.c_proj = nn.Linear(config.mlp_hidden, config.n_embd, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x):
        gate, up = self.c_fc(x).chunk(2, dim=-1)
        return self.dropout(self.c_proj(F.silu(gate) * up))


class Block(nn.Module):
    def __init__(self, config, layer_idx):
        super().__init__()
        self.ln_1 = make_norm(config)
        self.attn = CausalSelfAttention(config, layer_idx)
        self.ln_2 = make_norm(config)
        self.mlp = SwiGLU(config) if config.family == 'llama' else MLP(config)

    def forward(self, x, cache=None, rope=None, ve=None):
        x = x + self.attn(self.ln_1(x), cache, rope, ve)
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, config):
        super().__init__()
        assert config.vocab_size is not None and config.block_size is not None
        self.config = config
        kv_size = config.n_kv_head * (config.n_embd // config.n_head)
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(config.vocab_size, config.n_embd),
            # GPT-2 learns a table of positions; llama (and pos_emb='rope') rotates queries and keys instead
            **({} if config.rotary else {'wpe': nn.Embedding(config.block_size, config.n_embd)}),
            # value embeddings: one more table of tokens (of the values' width) per pair of layers that mix it,
            # initialised and trained as wte is (docs/speedrun.md)
            **({'value_embeds': nn.ModuleList([nn.Embedding(config.vocab_size, kv_size)
                                               for _ in range(config.value_embeds)])} if config.value_embeds else {}),
            drop=nn.Dropout(config.dropout),
            h=nn.ModuleList([Block(config, i) for i in range(config.n_layer)]),
            ln_f=make_norm(config),
        ))
        if config.skip_connections:  # U-net: the weight of each first-half block's output, modded-nanogpt's 1
            self.skip_weights = nn.Parameter(torch.ones(config.n_layer // 2))
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        if config.tie_embeddings:
            # weight tying: the output projection is the token embedding (paperswithcode.com/method/weight-tying)
            self.transformer.wte.weight = self.lm_head.weight
        if config.rotary:  # the angles' cos and sin at every position, once: compiled, each layer's kernels would
            # otherwise recompute them (pow, cos, sin) for every element of q and k (docs/llama.md has the cost)
            self.register_buffer('rope', self.rope_table(), persistent=False)
        self.apply(self._init_weights)
        # GPT-2 scales the init of the residual projections by 1/sqrt(2 * n_layer); zero_init_proj zeroes them
        for pn, p in self.named_parameters():
            if pn.endswith("c_proj.weight") and config.zero_init_proj:
                torch.nn.init.zeros_(p)
            elif pn.endswith("c_proj.weight"):
                torch.nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))

    def rope_table(self, device=None):
        c = self.config
        return torch.stack(rotary(torch.arange(c.block_size, device=device), c.n_embd // c.n_head, c.rope_theta))

    def _apply(self, fn, recurse=True):
        # nn.Module's moves and casts, then the rotary table computed again, on the device that uses it and in
        # float32: casting the weights to bf16 for generation must not round it
        super()._apply(fn, recurse)
        if self.config.rotary:
            self.rope = self.rope_table(self.rope.device)
        return self

    def get_num_params(self, non_embedding=True):
        """Number of parameters; by default without the embedding tables that are only looked up: the
        position and value embeddings, and the token embeddings unless they are the lm_head's weights too."""
        n_params = sum(p.numel() for p in self.parameters())
        if non_embedding:
            for name in ('wpe', 'value_embeds'):
                if name in self.transformer:
                    n_params -= sum(p.numel() for p in self.transformer[name].parameters())
            if not self.config.tie_embeddings:
                n_params -= self.transformer.wte.weight.numel()
        return n_params

    def _init_weights(self, module):
        if isinstance(module, (nn.Linear, nn.Embedding)):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            torch.nn.init.zeros_(module.bias)

    def forward(self, idx, targets=None, cache=None, reduction="mean"):
        """Logits and loss for a batch of token ids (B, T). Targets of -1 are ignored; reduction='none' gives the loss
        of every position (B, T), 0 where ignored. Without targets, only the last position's logits are computed (all
        that generation needs). With a KVCache (generation.py), idx holds only the new positions."""
        b, t = idx.size()
        if cache is None:
            assert t <= self.config.block_size, \
                f"cannot forward a sequence of length {t}, block size is only {self.config.block_size}"
            pos = torch.arange(0, t, dtype=torch.long, device=idx.device)
        else:
            pos = cache.positions(t)  # a tensor on the device (no Python int), so a step can be a CUDA graph
        x, rope = self.transformer.wte(idx), None
        if 'wpe' in self.transformer:
            x = x + self.transformer.wpe(pos)
        else:
            rope = (self.rope[:, :t] if cache is None else self.rope[:, pos]).unbind(0)
        if self.config.bf16_residual and torch.is_autocast_enabled(x.device.type):
            x = x.to(torch.get_autocast_dtype(x.device.type))  # the plan allows it under bf16 autocast only
        x = self.transformer.drop(x)
        tables = [table(idx).to(x.dtype) for table in self.transformer.value_embeds] if self.config.value_embeds else []
        half = self.config.n_layer // 2 if self.config.skip_connections else 0
        skips = []  # U-net: the outputs of the first `half` blocks, the last one on top
        for i, block in enumerate(self.transformer.h):
            if i >= self.config.n_layer - half:  # the second half's blocks take their mirror block's output
                x = x + self.skip_weights[len(skips) - 1] * skips.pop()
            j = self.config.value_table(i)
            x = block(x, cache, rope, None if j is None else tables[j])
            if i < half:
                skips.append(x)
        if cache is not None:
            cache.pos += t
        x = self.transformer.ln_f(x)
        if targets is not None:
            return logits_and_loss(self, x, targets, reduction)  # gpt/kernels/loss.py: plain or fused
        # a slice keeps the time dimension (and, unlike nanoGPT's list index [-1], copies nothing from the CPU,
        # which a CUDA graph capture refuses)
        return self.head(x[:, -1:, :]), None

    def head(self, x):
        """The logits of the final hidden states x: lm_head, soft-capped where logit_softcap is set (in
        float32: tanh saturates, and bf16 would round the capped logits coarsely)."""
        logits, cap = self.lm_head(x), self.config.logit_softcap
        return cap * torch.tanh(logits.float() / cap) if cap else logits

    def crop_block_size(self, block_size):
        """Shrink the context, e.g. to fine-tune GPT-2 (1024) at a smaller block size."""
        assert block_size <= self.config.block_size
        self.config.block_size = block_size
        if 'wpe' in self.transformer:
            self.transformer.wpe.weight = nn.Parameter(self.transformer.wpe.weight[:block_size])
        else:  # rotary: the cos and sin of the positions left (a transformers Llama may come with 131,072)
            self.rope = self.rope_table(self.rope.device)

    @classmethod
    def from_pretrained(cls, model_type, override_args=None):
        """GPT-2 weights through transformers: a hub name (gpt2, gpt2-medium, gpt2-large, gpt2-xl) or a local folder
        written by save_pretrained, or a Llama folder. Only `dropout` may be overridden; gpt/hf/__init__.py converts."""
        override_args = override_args or {}
        assert all(k == "dropout" for k in override_args), f"only dropout can be overridden, got {override_args}"
        from gpt import hf  # imported here: transformers is slow to import, and only this needs it
        model_args, state_dict = hf.load_pretrained(model_type, override_args.get("dropout", 0.0))
        model = cls(GPTConfig(**model_args))
        model.load_state_dict(state_dict)
        return model

    def hidden_matrices(self):
        """The blocks' weight matrices, each with the row counts of the matrices it fuses (c_attn: q, k, v;
        SwiGLU's c_fc: gate, up) or None: what Muon orthogonalizes (docs/speedrun.md#muon; the rest is AdamW's)."""
        cfg = self.config
        kv = cfg.n_kv_head * (cfg.n_embd // cfg.n_head)
        fc = [cfg.mlp_hidden] * 2 if cfg.family == 'llama' else None
        return [m for b in self.transformer.h for m in ((b.attn.c_attn.weight, [cfg.n_embd, kv, kv]),
                (b.attn.c_proj.weight, None), (b.mlp.c_fc.weight, fc), (b.mlp.c_proj.weight, None))]

    def learned_scalars(self):
        """The learned mixing weights of value_embeds and skip_connections (none without them): what the
        scalar_lr setting trains at its own rate (gpt/optim/muon.py), as modded-nanogpt's scalars."""
        lambdas = [b.attn.ve_lambdas for b in self.transformer.h if hasattr(b.attn, 've_lambdas')]
        return ([self.skip_weights] if self.config.skip_connections else []) + lambdas

    def configure_optimizers(self, weight_decay, learning_rate, betas, device_type):
        """nanoGPT's AdamW (train.py's optimizer='adamw'; gpt/optim/__init__.py builds the others)."""
        return adamw.configure(self, weight_decay, learning_rate, betas, device_type)

    def flops_per_token(self):
        """Training FLOPs per token (forward + backward), PaLM paper Appendix B."""
        N = self.get_num_params()
        cfg = self.config
        L, H, Q, T = cfg.n_layer, cfg.n_head, cfg.n_embd // cfg.n_head, cfg.block_size
        return 6 * N + 12 * L * H * Q * T

    def estimate_mfu(self, fwdbwd_per_iter, dt, peak_flops=312e12):
        """Model FLOPs utilization: achieved FLOP/s over the device's peak_flops (nanoGPT's default: an A100's bf16
        312 TFLOP/s; gpt/runtime/hardware.py's peak_flops(device) knows others); None when it is unknown (0 or None)."""
        if not peak_flops:
            return None
        flops_per_iter = self.flops_per_token() * self.config.block_size * fwdbwd_per_iter
        return flops_per_iter / dt / peak_flops

    # nanoGPT's model.generate: gpt/generation.py's generate (under no_grad), which says what each argument does
    generate = generation.generate
