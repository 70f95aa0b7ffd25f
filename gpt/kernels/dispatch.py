"""Where gpt/kernels' Triton kernels run in place of model.py's plain PyTorch: on a CUDA GPU, uncompiled
(torch.compile fuses the plain paths by itself); their autograd bindings (norm_and_rotate, layer_norm); and their
compiles before the first step (compile_ahead, precompile). Each kernel's module imports Triton, which CPU builds
of torch lack, so model.py and train.py reach them only through here, and only where they run."""
import contextlib
import importlib.util
import threading

import torch

from gpt.kernels import ahead

HAS_TRITON = importlib.util.find_spec("triton") is not None  # torch's CUDA builds for Linux bring it


def runs_on(x):
    """Whether a Triton kernel can take tensor x here: on a CUDA GPU, outside torch.compile."""
    return x.is_cuda and not torch.compiler.is_compiling()


def loss_kernel(x):
    """gpt/kernels/cross_entropy.py's loss_and_grad_ where it runs for the hidden states x, else None."""
    if not (runs_on(x) and HAS_TRITON):
        return None
    from gpt.kernels.cross_entropy import loss_and_grad_  # imports Triton: only where it runs
    return loss_and_grad_


def qk_kernel(q):
    """norm_and_rotate (gpt/kernels/fused_qk.py's kernels) where it runs for the queries q, else None. Triton is
    not checked here: the run plan turns fused_qk off without it (gpt/runtime/hardware.py's can_fuse)."""
    return norm_and_rotate if runs_on(q) else None


def norm_kernel(x):
    """layer_norm (gpt/kernels/layer_norm.py's) where it runs for x, else None (Triton not checked: see qk_kernel)."""
    return layer_norm if runs_on(x) else None


class _NormRotate(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, cos, sin, eps):
        from gpt.kernels.fused_qk import _forward, _launch  # imports Triton: only where it runs
        rope = cos is not None
        ctx.save_for_backward(q, k, *((cos, sin) if rope else ()))
        ctx.eps, ctx.rope = eps, rope
        return _launch(_forward, q, None, cos, sin, eps, rope), _launch(_forward, k, None, cos, sin, eps, rope)

    @staticmethod
    def backward(ctx, gq, gk):
        from gpt.kernels.fused_qk import _backward, _launch
        q, k, *table = ctx.saved_tensors
        cos, sin = table if ctx.rope else (None, None)
        dq = _launch(_backward, q, gq, cos, sin, ctx.eps, ctx.rope) if gq is not None else None
        dk = _launch(_backward, k, gk, cos, sin, ctx.eps, ctx.rope) if gk is not None else None
        return dq, dk, None, None, None


def norm_and_rotate(q, k, rope, eps):
    """q (B, T, n_head, hs) and k (B, T, n_kv_head, hs), any strides but a dense last dim (views of c_attn's
    output): each row RMS-normalised where eps is not None, then rotated where rope = (cos, sin), each (T, hs)
    float32 as model.rotary makes them, by gpt/kernels/fused_qk.py's kernels. Returns new contiguous (B, T,
    heads, hs) tensors in q's dtype (under autocast: the autocast dtype, as the plain path's SDPA sees them)."""
    dtype = torch.get_autocast_dtype('cuda') if torch.is_autocast_enabled('cuda') else q.dtype
    cos, sin = (None, None) if rope is None else (r.float().contiguous() for r in rope)
    return _NormRotate.apply(q.to(dtype), k.to(dtype), cos, sin, eps)


class _LayerNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, eps):
        from gpt.kernels import layer_norm  # imports Triton: only where it runs
        y, mean, rstd = layer_norm.forward(x.reshape(-1, x.shape[-1]).contiguous(), weight, bias, eps)
        ctx.save_for_backward(x, weight, mean, rstd)
        ctx.has_bias = bias is not None
        return y.view(x.shape)

    @staticmethod
    def backward(ctx, dy):
        from gpt.kernels import layer_norm
        x, weight, mean, rstd = ctx.saved_tensors
        N = x.shape[-1]
        dx, dw, db = layer_norm.backward(x.reshape(-1, N).contiguous(), weight, dy.reshape(-1, N).contiguous(),
                                         mean, rstd)
        return dx.view(x.shape), dw.sum(0).to(weight.dtype), db.sum(0).to(weight.dtype) if ctx.has_bias else None, None


def layer_norm(x, weight, bias, eps):
    """F.layer_norm(x, (N,), weight, bias, eps) over x's last dim N, in x's dtype, by gpt/kernels/layer_norm.py's
    kernels: float32 statistics, the weight and bias read in their own dtype (bias may be None)."""
    return _LayerNorm.apply(x, weight, bias, eps)


def compile_ahead(compilers, cfg, batch_sizes, dtype, device, compiled):
    """Send gpt/kernels/ahead.py's compilers, started at launch, the kernels that precompile will call, and this
    GPU's target; nothing to compile (a CPU run, compile=True, no fused kernel) ends them."""
    specs, target = [], None
    if compilers and not compiled and torch.device(device).type == 'cuda' and HAS_TRITON:
        from triton.runtime import driver
        with torch.cuda.device(device):  # Triton asks CUDA for the current device and its target
            specs, target = specializations(cfg, batch_sizes, dtype), driver.active.get_current_target()
    ahead.send(compilers, specs, target and (target.arch, target.warp_size))
    # precompile's loads need Triton's cache key, a hash of its 400 MB library that runs without the GIL: hashed
    # while the compilers work (twice at worst, never wrong); a Triton without the function hashes it then
    if specs:
        with contextlib.suppress(ImportError):
            from triton.runtime.cache import triton_key
            threading.Thread(target=triton_key, daemon=True).start()


def specializations(cfg, batch_sizes, dtype):
    """Triton's specialization data (JITFunction.preload's input) of each kernel variant that warm_ups calls on
    stand-ins in CPU memory; nothing compiles or launches (a jit_cache_hook that returns True skips both)."""
    if not (jobs := warm_ups(cfg, batch_sizes, dtype, 'cpu')):
        return []
    from triton import knobs
    specs = []

    def record(*, compile, **_):
        specs.append(compile['specialization_data'])
        return True
    knobs.runtime.jit_cache_hook, kept = record, knobs.runtime.jit_cache_hook
    try:
        for job in jobs:
            job()
    finally:
        knobs.runtime.jit_cache_hook = kept
    return list(dict.fromkeys(specs))


def precompile(model, batch_sizes, dtype, compiled, compilers=()):
    """Load the Triton kernels that the run will call before its first evaluation (or compile those that no
    compiler did: a cold cache would compile them at their first calls). batch_sizes: the training micro-batch's,
    then the evaluations'. compilers: gpt/kernels/ahead.py's, waited for first: their kernels are in the cache."""
    ahead.finish(compilers)
    device = next(model.parameters()).device
    if compiled or device.type != 'cuda' or not HAS_TRITON:
        return
    with torch.cuda.device(device):
        for job in warm_ups(model.config, batch_sizes, dtype, device):
            job()
    torch.cuda.synchronize(device)


def warm_ups(cfg, batch_sizes, dtype, device):
    """precompile's jobs: each calls kernels once on stand-ins of the run's tensors (the shapes, strides and dtype
    that pick a variant; one that missed would cost time, never correctness). tests/test_precompile.py checks
    that they call every variant a step and an evaluation call."""
    if not (cfg.fused_qk or cfg.fused_loss or cfg.fused_norm):  # the plan keeps each only where it has work
        return []
    from gpt.kernels import cross_entropy, fused_qk, layer_norm  # imports Triton: only where it runs
    dtype, T, hs = getattr(torch, dtype), cfg.block_size, cfg.n_embd // cfg.n_head
    rope, eps = cfg.rotary, cfg.norm_eps if cfg.qk_norm else None
    cos = sin = torch.zeros(T, hs, device=device) if rope else None
    widths = [cfg.n_head * hs, cfg.n_kv_head * hs, cfg.n_kv_head * hs]
    views = [x.view(B, T, -1, hs) for B in dict.fromkeys(batch_sizes)  # q and k: views of c_attn's output
             for x in torch.empty(B, T, sum(widths), dtype=dtype, device=device).split(widths, -1)[:2]]

    def forward():
        for x in views:
            fused_qk._launch(fused_qk._forward, x, None, cos, sin, eps, rope)

    def backward():  # the gradient as SDPA's backward leaves it: laid out as q (flash) or as (B, heads, T, hs)
        for x in views[:2]:
            B, _, H, D = x.shape
            for g in (torch.empty(B, T, H, D, dtype=dtype, device=device),
                      torch.empty(B, H, T, D, dtype=dtype, device=device).transpose(1, 2)):
                fused_qk._launch(fused_qk._backward, x, g, cos, sin, eps, rope)

    def loss():
        rows = min(cfg.loss_chunk, batch_sizes[0] * T)
        logits = torch.empty(rows, cfg.vocab_size, dtype=dtype, device=device)
        cross_entropy.loss_and_grad_(logits, torch.zeros(rows, dtype=torch.long, device=device), cfg.logit_softcap)

    def norms():  # the stream's dtype (model.py); forward at every batch size, backward at the training one's
        w = torch.empty(cfg.n_embd, device=device)
        for B in dict.fromkeys(batch_sizes):
            x = torch.empty(B * T, cfg.n_embd, dtype=dtype if cfg.bf16_residual else torch.float32, device=device)
            _, mean, rstd = layer_norm.forward(x, w, w if cfg.bias else None, cfg.norm_eps)
            if B == batch_sizes[0]:
                layer_norm.backward(x, w, torch.empty_like(x), mean, rstd)

    return [forward, backward] * cfg.fused_qk + [loss] * cfg.fused_loss + [norms] * cfg.fused_norm
