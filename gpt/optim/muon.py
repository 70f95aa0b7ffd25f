"""Muon for the transformer blocks' weight matrices, AdamW for the rest (embeddings, lm_head, norm gains, biases), as
one torch optimizer: train.py schedules, clips, steps, saves and resumes it as it does AdamW, and the CUDA graph of
gpt/training/stepgraph.py captures it. Muon (K. Jordan et al. 2024, kellerjordan.github.io/posts/muon): step along the
nearest semi-orthogonal matrix U V^T to each matrix's momentum, found by a quintic Newton-Schulz iteration in bfloat16,
batched by shape and shared over DDP's ranks (muon_shard): docs/speedrun.md#muon says why."""
import math

import torch
import torch.distributed as dist

from gpt.optim.adamw import AdamW, WithoutDynamo
from gpt.runtime.errors import UserError
from gpt.runtime.settings import FRACTION, NOT_NEGATIVE, RUN, TRAINING, Setting, kept

# the quintic iteration's coefficients, as in modded-nanogpt (zeropower_via_newtonschulz5)
NS_COEFFICIENTS = (3.4445, -4.7750, 2.0315)

_without_muon = lambda c: c['optimizer'] != 'muon' and f"optimizer={c['optimizer']!r} trains without Muon"
_no_learned_scalars = lambda c: _without_muon(c) or (
    c['init_from'] == 'scratch' and not c['value_embeds'] and not c['skip_connections']
    and "the model has no learned scalars (value_embeds, skip_connections)")

# train.py's settings for Muon (optimizer='muon'), set like train.py's own (gpt/runtime/settings.py)
SETTINGS = dict(
    muon_lr=Setting((lambda v: v > 0, "positive (for AdamW alone: --optimizer=adamw)"), TRAINING, _without_muon,
                    0.02, "the blocks' matrices' rate, scheduled like learning_rate (KellerJordan/Muon's)"),
    muon_momentum=Setting(FRACTION, TRAINING, _without_muon, 0.95, "Nesterov momentum, as modded-nanogpt"),
    muon_weight_decay=Setting(NOT_NEGATIVE, TRAINING, _without_muon, 0.0, "decoupled weight decay of the matrices"),
    muon_nesterov=Setting((), TRAINING, _without_muon, True, "Nesterov momentum (False: plain momentum)"),
    muon_shard=Setting((), RUN, _without_muon, True, "under DDP each rank orthogonalizes its share of the "
                       "matrices, then all-gathers"),
    scalar_lr=Setting((lambda v: v >= 0, "0 (learning_rate's) or more"),
                      kept("the optimizer's state is grouped by it (the learned scalars in a group of their own or "
                           "not)"), _no_learned_scalars, 0.0,
                      "AdamW's rate for the learned scalars (value-embedding and skip weights); 0: learning_rate"),
)


def orthogonalize(G, steps=5, dtype=torch.bfloat16):
    """The approximate zeroth power U V^T of each matrix of G (..., m, n) by `steps` quintic Newton-Schulz
    iterations in `dtype` (bfloat16 on the GPU: the tensor cores' speed, accurate enough for an update)."""
    a, b, c = NS_COEFFICIENTS
    tall = G.size(-2) > G.size(-1)
    X = G.to(dtype)
    if tall:  # iterate on the wide orientation: X X^T is then the smaller Gram matrix
        X = X.mT
    X = X / (X.norm(dim=(-2, -1), keepdim=True) + 1e-7)  # spectral norm <= Frobenius norm <= 1
    shape = X.shape
    X = X.reshape(-1, *shape[-2:])  # baddbmm takes one batch dimension: a single matrix is a batch of one
    for _ in range(steps):
        A = X @ X.mT
        # b A + c A A and a X + B X with the scalings and the sum inside the matmul (baddbmm's beta and
        # alpha, added in float32 before rounding): one copy of the addend into the output, not five
        # elementwise kernels over the whole batch
        B = torch.baddbmm(A, A, A, beta=b, alpha=c)
        X = torch.baddbmm(X, B, X, beta=a)
    X = X.reshape(shape)
    return X.mT if tall else X


class MuonAdamW(WithoutDynamo, torch.optim.Optimizer):
    """Param groups with 'muon': True take Muon steps; the others are handed to adamw.py's AdamW, which shares this
    optimizer's groups and state, so state_dict() and load_state_dict() hold both. A Muon group's step size is
    group['lr'] * group['lr_scale']: the schedule sets every group's 'lr' to the AdamW rate; lr_scale (muon_lr /
    learning_rate) keeps Muon's in proportion. Its 'splits' cut a fused matrix into the matrices it stands for (c_attn:
    q, k and v), each orthogonalized on its own, as modded-nanogpt's separate q, k, v."""

    def __init__(self, muon_groups, adamw_groups, momentum=0.95, nesterov=True, ns_steps=5, fused=None, shard=True,
                 **adamw_args):
        adamw = AdamW(adamw_groups, fused=fused, **adamw_args)  # fills the AdamW groups' defaults
        for group in muon_groups:
            group.update(muon=True, momentum=momentum, nesterov=nesterov, ns_steps=ns_steps)
            for key, default in (('splits', None), ('lr_scale', 1.0), ('weight_decay', 0.0)):
                group.setdefault(key, default)
        for group in adamw.param_groups:
            group['muon'] = False
        super().__init__(adamw.param_groups + muon_groups, {})
        self._adamw = adamw
        self.shard = shard  # share the orthogonalization over the ranks of a process group, when there is one
        self._link()

    def _link(self):
        """Point the inner AdamW at this optimizer's AdamW groups and state (load_state_dict replaces both)."""
        self._adamw.param_groups = [g for g in self.param_groups if not g['muon']]
        self._adamw.state = self.state

    def load_state_dict(self, state_dict):
        super().load_state_dict(state_dict)
        self._link()

    @torch.no_grad()
    def step(self, closure=None):
        assert closure is None, "MuonAdamW takes no closure"
        # the CUDA graph's non-finite flag (gpt/training/stepgraph.py): 1 skips the whole update, on the GPU
        self._adamw.found_inf = found_inf = getattr(self, 'found_inf', None)
        self._adamw.step()
        del self._adamw.found_inf
        self._muon_step(found_inf)

    def _muon_step(self, found_inf):
        # Few, large kernels: each op runs once for a whole group or stack, not once per matrix. found_inf
        # (the CUDA graph's flag) enters as a rate of zero and a momentum left as it is, never as a CPU branch.
        buckets, rates = self._pieces(found_inf)
        # one batched iteration per shape (tall pieces transposed), every all-gather launched before any wait
        steps = []
        for ns_steps, runs in buckets.values():
            pieces = [piece.mT if tall else piece for (_, tall, _), items in runs.items() for _, piece in items]
            steps.append((runs, self._orthogonalize_shared(torch.stack(pieces), ns_steps)))
        for runs, (out, work) in steps:
            if work is not None:
                work.wait()
            for ((i, tall, dtype), items), run in zip(runs.items(), out.split([len(v) for v in runs.values()])):
                self._apply([target for target, _ in items], run.mT if tall else run, rates[i], dtype)

    def _pieces(self, found_inf):
        """Every Muon group's momentum step and weight decay, and the pieces to orthogonalize, by shape:
        {(m, n) with m <= n: (ns_steps, {(rate index, tall, dtype): [(target rows, piece)]})}, each shape's
        pieces in runs that share a step size, an orientation and a dtype, and the groups' step sizes."""
        skip = None if found_inf is None else found_inf > 0
        buckets, rates = {}, []
        for group in (g for g in self.param_groups if g['muon']):
            if not (params := [p for p in group['params'] if p.grad is not None]):
                continue
            rate = group['lr'] * group['lr_scale']  # a float, or a 0-dim tensor (the CUDA graph's rate)
            rates.append(rate if found_inf is None else rate * (1 - found_inf))  # zero on a skipped step
            targets = []
            for p, update in zip(params, self._momentum(group, params, skip)):
                splits = group['splits'] or [p.size(0)]
                for rows, piece, target in zip(splits, update.split(splits), p.split(splits)):
                    _, runs = buckets.setdefault(tuple(sorted(piece.shape)), (group['ns_steps'], {}))
                    runs.setdefault((len(rates) - 1, rows > p.size(1), p.dtype), []).append((target, piece))
                    targets.append(target)
            if group['weight_decay']:  # decoupled; before the update or after: it reads no weight
                torch._foreach_mul_(targets, 1 - rates[-1] * group['weight_decay'])
        return buckets, rates

    def _momentum(self, group, params, skip):
        """Each matrix's momentum moved (1 - momentum) of the way to its gradient, and the update to
        orthogonalize: the gradient moved `momentum` of the way to the new momentum (Nesterov) or the
        momentum itself. Where skip (a 0-dim bool tensor) is true, the momentum stays as it is."""
        m = group['momentum']
        bufs = []
        for p in params:
            if 'momentum_buffer' not in self.state[p]:
                self.state[p]['momentum_buffer'] = torch.zeros_like(p)
            bufs.append(self.state[p]['momentum_buffer'])
        grads = [p.grad for p in params]
        if skip is not None:  # a skipped step's gradient may be inf or NaN, which even a lerp by 0 would
            # spread: lerping the momentum towards itself instead leaves it unchanged
            grads = [torch.where(skip, buf, grad) for buf, grad in zip(bufs, grads)]
        torch._foreach_lerp_(bufs, grads, 1 - m)
        return torch._foreach_lerp(grads, bufs, m) if group['nesterov'] else bufs

    @staticmethod
    def _apply(targets, updates, lr, dtype):
        """targets[i] -= lr * scale * updates[i], scale = sqrt(max(1, rows / cols)), for a run of orthogonalized pieces
        (k, rows, cols): scaled as one stack in the parameters' dtype, subtracted by one multi-tensor op."""
        scale = math.sqrt(max(1.0, updates.size(-2) / updates.size(-1)))
        updates = updates.to(dtype, memory_format=torch.contiguous_format)  # the rows' own layout
        updates.mul_(lr * scale if scale != 1.0 else lr)
        torch._foreach_sub_(targets, list(updates.unbind(0)))

    def _orthogonalize_shared(self, stacked, steps):
        """orthogonalize(stacked) as (result, pending all-gather or None): all of it here alone (or shard=False); under
        DDP this rank's ceil(k / world_size) matrices (the last padded with zeros), all-gathered."""
        if not (self.shard and dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1):
            return orthogonalize(stacked, steps), None
        world, rank, k = dist.get_world_size(), dist.get_rank(), stacked.size(0)
        per = -(-k // world)
        mine = stacked[rank * per:(rank + 1) * per]
        if len(mine) < per:  # every rank sends as many
            mine = torch.cat([mine, mine.new_zeros((per - len(mine), *mine.shape[1:]))])
        part = orthogonalize(mine, steps).contiguous()
        out = part.new_empty((per * world, *part.shape[1:]))
        return out[:k], dist.all_gather_into_tensor(out, part, async_op=True)


def configure(muon_params, adamw_params, learning_rate, muon_lr, weight_decay, muon_weight_decay, betas,
              momentum, device_type, shard=True, scalars=(), scalar_lr=0.0, nesterov=True):
    """optimizer='muon': muon_params [(weight, splits or None)], the blocks' matrices; adamw_params the rest (1-D ones
    undecayed). scalar_lr > 0 puts the `scalars` in an AdamW group of their own (lr_scale scalar_lr / learning_rate)."""
    if not 0 <= momentum < 1 or muon_lr <= 0 or scalar_lr < 0:
        raise UserError(f"muon_momentum must be in [0, 1), muon_lr positive and scalar_lr 0 or more (got {momentum}, "
                        f"{muon_lr}, {scalar_lr})")
    muon_ids, scalar_ids = {id(p) for p, _ in muon_params}, {id(p) for p in scalars} if scalar_lr else set()
    adamw_params = [p for p in adamw_params if id(p) not in muon_ids]
    by_split = {}
    for p, splits in muon_params:
        by_split.setdefault(tuple(splits) if splits else None, []).append(p)
    muon_groups = [dict(params=ps, splits=list(s) if s else None, lr=learning_rate, lr_scale=muon_lr / learning_rate,
                        weight_decay=muon_weight_decay) for s, ps in by_split.items()]
    adamw_groups = [dict(params=[p for p in adamw_params if p.dim() >= 2], weight_decay=weight_decay),
                    dict(params=[p for p in adamw_params if p.dim() < 2 and id(p) not in scalar_ids], weight_decay=0.0)]
    if scalar_ids:
        adamw_groups.append(dict(params=[p for p in adamw_params if id(p) in scalar_ids], weight_decay=0.0,
                                 lr_scale=scalar_lr / learning_rate))
    n_muon, n_adamw = sum(p.numel() for p, _ in muon_params), sum(p.numel() for p in adamw_params)
    n_scalars = sum(p.numel() for p in adamw_params if id(p) in scalar_ids)
    print(f"muon: {len(muon_params)} matrices, {n_muon:,} parameters, lr {muon_lr}; adamw: {len(adamw_params)} "
          f"tensors, {n_adamw:,} parameters, lr {learning_rate}" + (f"; learned scalars: {n_scalars}, at lr "
          f"{scalar_lr}" if scalar_ids else ""))
    return MuonAdamW(muon_groups, adamw_groups, momentum=momentum, nesterov=nesterov, lr=learning_rate, betas=betas,
                     fused=device_type == 'cuda' or None, shard=shard)
