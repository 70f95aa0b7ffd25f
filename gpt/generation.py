"""Fast generation (docs/generation.md): a fixed-shape key/value cache and the one-token decode step on it, captured
once as a CUDA graph and replayed every token; and GPT.generate's loop. A graph needs fixed shapes and addresses, no CPU
read-back: hence the preallocated cache, the position a device tensor, and masked attention over the whole cache."""
import torch
from torch.nn import functional as F


class KVCache:
    """Keys and values of every layer (only the key/value heads, with GQA) for up to `capacity` positions, preallocated:
    one more token runs the model on one position, attending over all slots up to its own."""

    def __init__(self, n_layer, capacity, device):
        self.kv = [None] * n_layer  # per layer, keys and values by position: (B, capacity, 2, n_kv_head, head_size)
        self.capacity = capacity
        self.pos = torch.zeros((), dtype=torch.long, device=device)  # positions already in the cache
        self.slots = torch.arange(capacity, device=device)

    def positions(self, t):
        """The positions (t,) of the next t tokens; prepares this forward's attention mask."""
        self.new = self.pos + torch.arange(t, device=self.pos.device)
        self.visible = self.slots <= self.new[:, None]  # (t, capacity)
        self.mask = None
        return self.new

    def update(self, layer, new):
        """Write this layer's new keys and values (B, t, 2, n_kv_head, head_size) at their positions, in one copy;
        return every slot's keys and values (B, n_kv_head, capacity, head_size), and the mask to attend with: 0 where
        visible and -inf elsewhere, what SDPA would make of a boolean mask in each layer, made here once per forward."""
        if self.kv[layer] is None:
            # zeros, not empty: masked slots still enter the product (with weight 0), and 0 * NaN is NaN
            self.kv[layer] = new.new_zeros((new.size(0), self.capacity, *new.shape[2:]))
        if self.mask is None:
            self.mask = new.new_zeros(self.visible.shape).masked_fill_(~self.visible, float("-inf"))
        kv = self.kv[layer]
        kv.index_copy_(1, self.new, new)
        return kv[:, :, 0].transpose(1, 2), kv[:, :, 1].transpose(1, 2), self.mask


def uses_graphs(model, device, cuda_graphs=True):
    """Whether generate() replays the decode step from a CUDA graph: asked for, on CUDA, in eval mode (dropout draws
    random numbers), and outside a distributed run (under FSDP each forward all-gathers the weights)."""
    distributed = torch.distributed.is_available() and torch.distributed.is_initialized()
    return cuda_graphs and torch.device(device).type == "cuda" and not model.training and not distributed


class Decoder:
    """Runs a model on a KVCache: the prompt once (prefill, eagerly), then one token a step, captured once and replayed
    with graphs, else eager: the same code on the same buffers, which the CPU tests check."""

    def __init__(self, n_layer, batch_size, capacity, device, graphed, key=None, compiled=False):
        self.cache = KVCache(n_layer, capacity, device)
        self.token = torch.zeros(batch_size, 1, dtype=torch.long, device=device)  # the step's input
        self.graphed, self.key, self.compiled = graphed, key, compiled
        self.graph = self.logits = self.step_model = None

    def prefill(self, model, idx):
        """Logits (B, vocab) after the prompt idx (B, T), whose keys/values fill positions 0..T-1."""
        self.cache.pos.zero_()
        return model(idx, cache=self.cache)[0][:, -1]

    def step(self, model, token):
        """Logits (B, vocab) after one more token (B, 1); with graphs the graph's own output, not to be changed."""
        self.token.copy_(token)
        if self.step_model is None:
            # compiled for this one shape: fusing the small kernels makes a token faster, for a compile at
            # the first step (the prompt, whose length varies, runs eagerly)
            self.step_model = torch.compile(model, dynamic=False) if self.compiled else model
        if not self.graphed:
            return self.step_model(self.token, cache=self.cache)[0][:, -1]
        if self.graph is None:
            self.capture(self.step_model)
        self.graph.replay()
        return self.logits

    def capture(self, model):
        """Record one step as a CUDA graph; capturing runs nothing, so the first replay takes the cache's next step."""
        pos = self.cache.pos.clone()
        # autocast's cache of cast weights would hand the graph copies that autocast frees on exit;
        # uncached, the casts are kernels of the graph (float32 weights: train.py's samples)
        no_cast_cache = torch.autocast("cuda", dtype=torch.get_autocast_dtype("cuda"),
                                       enabled=torch.is_autocast_enabled("cuda"), cache_enabled=False)
        with torch.cuda.device(self.token.device), no_cast_cache:
            # warm up on a side stream: lazy set-ups (cuBLAS workspaces, kernel choices) must not happen in
            # the capture. Each run writes this position's keys/values, which the replay writes again
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                for _ in range(3):
                    self.cache.pos.copy_(pos)
                    model(self.token, cache=self.cache)
            torch.cuda.current_stream().wait_stream(stream)
            self.cache.pos.copy_(pos)
            self.graph = torch.cuda.CUDAGraph()
            # thread_local: the process's other threads (a caller's data loader, say) may use CUDA meanwhile
            with torch.cuda.graph(self.graph, capture_error_mode="thread_local"):
                self.logits = model(self.token, cache=self.cache)[0][:, -1]


def decoder(model, batch_size, capacity, device, cuda_graphs=True, compile_step=False):
    """A Decoder for this shape, graphed where uses_graphs says; a graphed one stays on the model (`del model._decoder`
    frees it), reused while nothing it captured changes (sample.py's num_samples runs)."""
    if not uses_graphs(model, device, cuda_graphs):
        return Decoder(model.config.n_layer, batch_size, capacity, device, graphed=False, compiled=compile_step)
    key = (batch_size, capacity, str(device), torch.is_autocast_enabled("cuda"), torch.get_autocast_dtype("cuda"),
           compile_step, tuple((p.data_ptr(), p.dtype) for p in model.parameters()))
    kept = model.__dict__.get("_decoder")
    if kept is None or kept.key != key:
        model.__dict__.pop("_decoder", None)  # free its graph and cache before making the next
        model._decoder = Decoder(model.config.n_layer, batch_size, capacity, device, graphed=True, key=key,
                                 compiled=compile_step)
    return model._decoder


@torch.no_grad()
def generate(model, idx, max_new_tokens, temperature=1.0, top_k=None, use_cache=True, generator=None,
             vocab_limit=None, progress=None, top_p=None, eot=None, cuda_graphs=True, compile_step=False):
    """Continue the sequences idx (B, T) by max_new_tokens tokens (temperature 0: greedy; top_p: nucleus sampling after
    top_k). vocab_limit keeps ids below the tokenizer's size (a padded vocabulary); progress() is called after each new
    token. With eot each sequence stops at its first new eot (later positions hold eot), and generation ends once all
    have (checked every 8 tokens: a wait for the GPU). use_cache=False recomputes every token."""
    block_size, steps = model.config.block_size, None
    if top_p is not None and not 0 < top_p <= 1:
        raise ValueError(f"top_p must be in (0, 1], got {top_p}")
    done = None if eot is None else torch.zeros(idx.size(0), 1, dtype=torch.bool, device=idx.device)
    if use_cache and idx.size(1) < block_size:
        # a multiple of 64 (rows aligned for the attention kernels, fewer shapes to capture), yet no
        # bigger than this generation needs: a model from transformers may have a huge block_size
        capacity = min(block_size, -(-(idx.size(1) + max_new_tokens) // 64) * 64)
        steps = decoder(model, idx.size(0), capacity, idx.device, cuda_graphs, compile_step)
    for i in range(max_new_tokens):
        if idx.size(1) > block_size:
            # the window slides, so every position's embedding changes: recompute from scratch
            logits = model(idx[:, -block_size:])[0][:, -1]
        elif steps is not None:
            logits = steps.prefill(model, idx) if i == 0 else steps.step(model, idx[:, -1:])
        else:
            logits = model(idx)[0][:, -1]
        idx_next = next_token(logits[:, :vocab_limit], temperature, top_k, top_p, generator)
        if done is not None:
            idx_next = idx_next.masked_fill(done, eot)  # a stopped sequence stays stopped
            done = done | (idx_next == eot)
        idx = torch.cat((idx, idx_next), dim=1)
        if progress is not None:
            progress()
        if done is not None and i % 8 == 7 and bool(done.all()):
            # all stopped: the rest would be eot, which the caller cuts off anyway
            return torch.cat((idx, idx.new_full((idx.size(0), max_new_tokens - 1 - i), eot)), dim=1)
    return idx


def next_token(logits, temperature, top_k=None, top_p=None, generator=None):
    """The next token (B, 1) of each sequence, from its logits (B, vocab): the likeliest at temperature 0,
    else drawn from softmax(logits / temperature), cut to the top_k tokens, then to the top_p nucleus."""
    if temperature == 0:
        return logits.argmax(dim=-1, keepdim=True)
    logits = logits / temperature
    if top_k is not None:
        # the k-th largest logit: unsorted top-k and its min (sorting the k costs more)
        v, _ = torch.topk(logits, min(top_k, logits.size(-1)), sorted=False)
        # masked_fill, not logits[mask] = ...: boolean indexing may wait for the GPU
        logits = logits.masked_fill(logits < v.min(dim=-1, keepdim=True).values, -float("Inf"))
    if top_p is not None and top_p < 1:
        logits = top_p_filter(logits, top_p)
    probs = F.softmax(logits.float(), dim=-1)
    # torch.multinomial's own draw for one sample (argmax of probs / Exponential(1) noise), the same tokens
    # from the same generator, without its input checks (three reductions and an assert on CUDA, each token)
    noise = torch.empty_like(probs).exponential_(1, generator=generator)
    return (probs / noise).argmax(dim=-1, keepdim=True)


def top_p_filter(logits, top_p):
    """logits (B, V), -inf outside the nucleus: the fewest likeliest tokens whose probabilities sum to top_p or more."""
    sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
    probs = torch.softmax(sorted_logits.float(), dim=-1)
    # a token is out when the likelier ones before it already reach top_p
    out = (probs.cumsum(dim=-1) - probs) >= top_p
    return logits.masked_fill(out.scatter(-1, order, out), -float("inf"))


def until_eot(ids, eot, start):
    """A generated sequence up to its first eot after the prompt's `start` tokens (eot left out), else all of it."""
    return ids if eot is None or eot not in ids[start:] else ids[:ids.index(eot, start)]
