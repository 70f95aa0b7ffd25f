"""
The training step as one CUDA graph: the forward and backward of every micro-step, the gradient clipping
and the optimizer's update, recorded once and replayed every iteration. train.py and bench.py use it
where `cuda_graph=True` (one CUDA GPU).

Why: a step is hundreds of kernels (thousands for GPT-2), each launched from Python. For a small model
(shakespeare_char) the GPU runs them faster than the CPU launches them, so the step is bound by the CPU;
even GPT-2 124M compiled at B=12 spends about as long launching a step as the GPU spends running it. A
graph launches the whole step at once. It runs the very same kernels, so it computes the same thing.

What a graph needs: fixed shapes and addresses, and no value read back on the CPU inside it. So each
step's batches are copied into fixed input buffers; the learning rate is a tensor on the GPU that fused
AdamW reads (capturable); a NaN/inf gradient norm skips the update on the GPU, through the optimizer's
found_inf flag, instead of an `if` on the CPU; and the gradients live in the graph's memory, overwritten
(not accumulated) by each replay's first backward, so there is no zero_grad between steps.
"""
import torch


class StepGraph:
    """One training step of `accum` micro-batches (B, T) on fixed buffers. Made after the optimizer has
    its state (or none yet) and before the first step; then run() every iteration. graphed=False runs the
    same code eagerly on the same buffers, the way the CPU tests check it."""

    def __init__(self, model, optimizer, ctx, grad_clip, accum, batch_size, block_size, device, graphed=True):
        self.model, self.optimizer, self.ctx, self.graphed = model, optimizer, ctx, graphed
        self.params = [p for group in optimizer.param_groups for p in group['params']]
        self.max_norm = grad_clip or float('inf')  # inf: only measure the norm
        self.x = torch.zeros((accum, batch_size, block_size), dtype=torch.long, device=device)
        self.y = torch.zeros_like(self.x)
        self.lr = torch.zeros((), dtype=torch.float32, device=device)
        for group in optimizer.param_groups:
            group['lr'] = self.lr  # one tensor, set before each replay
            group['capturable'] = True  # lets torch's optimizer be captured (fused AdamW runs the same kernels)
        self.graph = self.out = None

    def body(self, update=True):
        """Forward and backward of each micro-batch in the buffers, clip, update. Returns the mean loss
        and the gradient norm before clipping, as tensors. update=False skips the update (the warm-up)."""
        accum = self.x.size(0)
        loss_sum = torch.zeros((), dtype=torch.float32, device=self.x.device)
        for i in range(accum):
            with self.ctx:
                _, loss = self.model(self.x[i], self.y[i])
                loss = loss / accum
            loss_sum += loss.detach()
            loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(self.params, self.max_norm)
        # fused AdamW leaves the weights, its moments and its step count alone where found_inf is 1
        self.optimizer.found_inf = (~torch.isfinite(norm) | (not update)).float()
        self.optimizer.step()
        del self.optimizer.found_inf
        return loss_sum, norm

    def run(self, X, Y, next_batch, lr):
        """One step on the batch X, Y and (with gradient accumulation) the next ones from next_batch().
        Returns the batch for the step after, the mean loss and the gradient norm; a non-finite norm means
        the update was skipped."""
        for i in range(self.x.size(0)):
            if i:
                X, Y = next_batch()
            self.x[i].copy_(X)
            self.y[i].copy_(Y)
        self.lr.fill_(lr)
        if not self.graphed:
            self.optimizer.zero_grad(set_to_none=True)
            out = self.body()
        else:
            if self.graph is None:
                self.capture()
            self.graph.replay()
            out = self.out
        return *next_batch(), *out  # the next step's first batch, read while the GPU runs this one

    def capture(self):
        """Warm up, then record body() as torch.cuda.graphs' documentation does. The warm-up runs compile,
        cuBLAS set-up and the optimizer's first-step state, but skips its updates and gives back the random
        numbers it drew (dropout), so the run is the one it would be without the graph."""
        device = self.x.device
        rng = torch.cuda.get_rng_state(device)
        stream = torch.cuda.Stream(device)
        stream.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(stream):
            for _ in range(3):
                self.optimizer.zero_grad(set_to_none=True)
                self.body(update=False)
        torch.cuda.current_stream(device).wait_stream(stream)
        torch.cuda.set_rng_state(rng, device)
        # gradients set to None: the captured backward allocates them in the graph's memory and writes them
        self.optimizer.zero_grad(set_to_none=True)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.out = self.body()


def problem(device_type, distributed, dtype, activation_checkpointing):
    """Why the step cannot be a graph here (None if it can): it needs one CUDA GPU, no GradScaler (its
    checks read values back on the CPU) and no activation checkpointing (it saves and restores the random
    state on the CPU)."""
    if device_type != 'cuda':
        return f"needs a CUDA GPU, not {device_type}"
    if distributed:
        return "one GPU only, not under torchrun"
    if dtype == 'float16':
        return "float16's GradScaler reads values back on the CPU: use dtype=bfloat16"
    if activation_checkpointing:
        return "not with activation_checkpointing"
    return None


def can_graph(cuda_graph, device_type, distributed, dtype, activation_checkpointing):
    """Whether to replay the step from a graph: asked for, and able to work here (else say why not)."""
    why = cuda_graph and problem(device_type, distributed, dtype, activation_checkpointing)
    if why:
        print(f"cuda_graph: off ({why})")
    return bool(cuda_graph and not why)
