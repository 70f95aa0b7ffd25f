"""The language model's loss (GPT.forward's logits_and_loss): nanoGPT's lm_head and F.cross_entropy, or with
fused_loss the chunked linear + cross-entropy, LinearCrossEntropy, which never makes the (B, T, vocab) logits."""
import torch
from torch.nn import functional as F

from gpt.kernels import dispatch


def logits_and_loss(model, x, targets, reduction="mean"):
    """The logits and loss of a GPT's final hidden states x (B, T, n_embd) for targets (B, T), -1 ignored;
    reduction='none' gives the loss of every position (B, T), 0 where ignored. Training with fused_loss (a mean
    loss, gradients enabled) returns no logits: the loss and its gradient come a chunk of positions at a time."""
    cfg = model.config
    b, t = x.shape[:2]
    if reduction == "mean" and cfg.fused_loss and torch.is_grad_enabled():
        return None, LinearCrossEntropy.apply(x.view(b * t, -1), model.lm_head.weight, targets.reshape(-1),
                                              cfg.loss_chunk, cfg.logit_softcap)
    logits = model.head(x)
    loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1), ignore_index=-1, reduction=reduction)
    return logits, loss.view(b, t) if reduction == "none" else loss


class LinearCrossEntropy(torch.autograd.Function):
    """Mean cross-entropy of logits = x @ weight.T (targets of -1 ignored), computed with its gradient a chunk
    of rows at a time in the forward pass, so only one chunk's logits exist at once. The plain path keeps the
    bf16 logits, their fp32 copy, the log-softmax and its gradient for all B x T positions, B x T x vocab_size
    numbers each. Same math as lm_head + F.cross_entropy under autocast: the matmuls in the autocast dtype, the
    softmax in fp32, the same FLOPs (the backward matmuls just run early)."""

    @staticmethod
    def forward(ctx, x, weight, targets, chunk, softcap=0.0):
        device = x.device.type
        dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else x.dtype
        w = weight.to(dtype)  # cast once, not once per chunk and matmul
        valid = targets != -1
        count = valid.sum().clamp(min=1)
        loss = torch.zeros((), dtype=torch.float32, device=x.device)
        grad_x, grad_w = torch.empty_like(x), torch.zeros_like(weight, dtype=torch.float32)
        kernel = dispatch.loss_kernel(x)  # the Triton kernel on a GPU, uncompiled: the same math
        for i in range(0, x.size(0), chunk):
            xs, ts = x[i:i + chunk].to(dtype), targets[i:i + chunk]
            logits = xs @ w.t()
            if kernel:
                chunk_loss, grad = kernel(logits, ts.contiguous(), softcap).sum(), logits  # now the gradient
            else:
                chunk_loss, grad = _loss_and_grad(logits, ts, softcap, dtype)
            loss += chunk_loss
            grad_x[i:i + chunk] = grad @ w
            grad_w += (grad.t() @ xs).float()
        ctx.save_for_backward(grad_x, grad_w.to(weight.dtype), count)
        return loss / count

    @staticmethod
    def backward(ctx, grad_loss):
        grad_x, grad_w, count = ctx.saved_tensors
        scale = grad_loss / count
        return grad_x * scale.to(grad_x.dtype), grad_w * scale.to(grad_w.dtype), None, None, None


def _loss_and_grad(logits, targets, softcap, dtype):
    """A chunk's summed loss, and its gradient d (summed loss) / d logits in dtype, zero where the target is -1
    (gpt/kernels/cross_entropy.py's kernel computes the same on a GPU, in one pass)."""
    logits, valid, ts = logits.float(), targets != -1, targets.clamp(min=0)
    if softcap:  # logit soft-capping: cap * tanh(z / cap), whose derivative is 1 - tanh^2
        capped = torch.tanh(logits / softcap)
        logits = softcap * capped
    lse = torch.logsumexp(logits, dim=-1)
    loss = torch.where(valid, lse - logits.gather(1, ts[:, None]).squeeze(1), 0.0).sum()
    # d loss / d logits = (softmax - one_hot(target)) / count, zero at ignored positions; the 1 / count
    # waits for the backward, where it cannot underflow in fp16. All elementwise, so that compiled,
    # one kernel reads the logits and writes their gradient in the matmul dtype, with no fp32 copy
    one_hot = torch.arange(logits.size(1), device=logits.device) == ts[:, None]
    grad = (torch.exp(logits - lse[:, None]) - one_hot.float()) * valid[:, None]
    if softcap:
        grad = grad * (1 - capped * capped)
    return loss, grad.to(dtype)
