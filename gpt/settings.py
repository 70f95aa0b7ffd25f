"""
Settings that have the right type but make no sense (a negative learning rate, dropout 1.5, no layers):
the entry scripts check them right after the configurator, so each is one `error:` line before any work.
"""
import os

from gpt.errors import UserError

NUCLEUS = (lambda v: 0 < v <= 1, "above 0 and at most 1 (1.0: no nucleus cut)")  # top-p sampling


def _check(rules, config):
    for key, ok, want in rules:
        if not ok(config[key]):
            raise UserError(f"{key}={config[key]!r} makes no sense: {key} must be {want}")


def check_train(c):
    """train.py's settings."""
    init_from = c['init_from']
    if not (init_from in ('scratch', 'resume') or init_from.startswith('gpt2') or os.path.isdir(init_from)):
        raise UserError(f"unknown init_from '{init_from}': use scratch, resume, gpt2, gpt2-medium, "
                        f"gpt2-large, gpt2-xl or a folder written by transformers' save_pretrained")
    if c['eval_iters'] <= 0 or c['eval_interval'] <= 0:
        raise UserError(f"eval_iters and eval_interval must be positive (got {c['eval_iters']}, {c['eval_interval']})")
    if min(c['batch_size'], c['block_size'], c['gradient_accumulation_steps'], c['log_interval']) <= 0 \
            or c['max_iters'] < 0:
        raise UserError("batch_size, block_size, gradient_accumulation_steps and log_interval must be "
                        "positive, max_iters not negative")
    positive = (lambda v: v > 0, "positive")
    _check([('dropout', lambda v: 0 <= v < 1, "at least 0 and below 1"),
            ('learning_rate', *positive), ('min_lr', lambda v: v >= 0, "0 or more"),
            ('n_layer', *positive), ('n_head', *positive), ('n_embd', *positive),
            ('n_kv_head', lambda v: v >= 0, "0 (n_head) or more"), ('mlp_hidden', lambda v: v >= 0, "0 or more"),
            ('weight_decay', lambda v: v >= 0, "0 or more"), ('grad_clip', lambda v: v >= 0, "0 (off) or more"),
            ('beta1', lambda v: 0 <= v < 1, "at least 0 and below 1"),
            ('beta2', lambda v: 0 <= v < 1, "at least 0 and below 1"),
            ('warmup_iters', lambda v: v >= 0, "0 or more"), ('max_nonfinite_steps', *positive),
            ('keep_checkpoints', lambda v: v >= 0, "0 or more"), ('sample_top_p', *NUCLEUS),
            ('compile_scope', lambda v: v in ('model', 'blocks'), "'model' or 'blocks' (gpt/distributed.py)")], c)


def check_sample(c):
    """sample.py's settings."""
    _check([('num_samples', lambda v: v > 0, "positive"), ('max_new_tokens', lambda v: v > 0, "positive"),
            ('temperature', lambda v: v >= 0, "0 (greedy) or more"),
            ('top_k', lambda v: v >= 0, "0 (all tokens) or more"), ('top_p', *NUCLEUS)], c)
