"""The training step as one CUDA graph (cuda_graph=True, one CUDA GPU, or under torchrun with ddp_sync='hooks'
over NCCL, whose all-reduces the graph records too): every micro-step's forward and backward, the clipping and
the update, recorded once and replayed every iteration (docs/benchmarks.md). A graph needs fixed shapes and
addresses and no value read back on the CPU: the batches are copied into fixed buffers, the learning rate is a
GPU tensor that fused AdamW reads (capturable), and train_step skips a non-finite update on the GPU. The
evaluations' forward gets a graph of its own (EvalGraph)."""
import torch

from gpt.training.step import train_step


class StepGraph:
    """train_step (gpt/training/step.py) over `accum` micro-batches (B, T) in fixed buffers; made after the optimizer
    has its state (or none yet), before the first step. graphed=False: the same code eagerly, as CPU tests run it."""

    def __init__(self, model, optimizer, ctx, grad_clip, accum, batch_size, block_size, device, graphed=True,
                 scaler=None, warmups=3):
        self.model, self.optimizer, self.ctx, self.graphed = model, optimizer, ctx, graphed
        self.warmups = warmups  # 1 is enough uncompiled; a compiled model may recompile: 3, as torch's docs do
        self.grad_clip, self.accum = grad_clip, accum
        self.scaler = scaler or torch.amp.GradScaler(torch.device(device).type, enabled=False)
        self.x = torch.zeros((accum, batch_size, block_size), dtype=torch.long, device=device)
        self.y = torch.zeros_like(self.x)
        self.lr = torch.zeros((), dtype=torch.float32, device=device)
        for group in optimizer.param_groups:  # tensors, set before each replay: one for every group at the
            # schedule's rate, its own for an AdamW group at a multiple of it (gpt/training/step.py's set_lr)
            scaled = not group.get('muon') and group.get('lr_scale', 1.0) != 1.0
            group['lr'] = torch.zeros_like(self.lr) if scaled else self.lr
            group['capturable'] = True  # lets torch's optimizer be captured (fused AdamW runs the same kernels)
        self.graph = self.out = None
        self.eval_loss = EvalGraph(model, ctx, warmups) if graphed else None  # estimate_loss's `forward`

    def body(self, update=True):
        """train_step on the buffers; update=False skips the update (the warm-up)."""
        self.optimizer.held = not update
        try:
            return train_step(self.model, self.optimizer, self.scaler, zip(self.x, self.y), self.accum, self.ctx,
                              self.grad_clip)
        finally:
            del self.optimizer.held

    def run(self, batches):
        """One step on the accum micro-batches (X, Y) from `batches`: train_step's (mean loss, gradient norm). The
        iterator is finished after the replay is launched: its work after the last batch overlaps the GPU's."""
        batches = iter(batches)
        for i in range(self.accum):
            X, Y = next(batches)
            self.x[i].copy_(X)
            self.y[i].copy_(Y)
        if not self.graphed:
            out = self.body()
        else:
            if self.graph is None:
                self.capture()
            self.graph.replay()
            out = self.out
        next(batches, None)
        return out

    def capture(self):
        """Warm up, then record body(). The warm-up runs compile, cuBLAS set-up and the optimizer's first-step state,
        but skips its updates and gives back the random numbers it drew (dropout): the run is as without the graph. The
        step ends with zero_grad(set_to_none): in the graph each replay's first backward writes the gradients afresh
        (GradSync's, zeroed in place, add into the same buckets, whose all-reduces are in the graph)."""
        rng = torch.cuda.get_rng_state(self.x.device)

        def warm_up():
            for _ in range(self.warmups):
                self.body(update=False)
            torch.cuda.set_rng_state(rng, self.x.device)

        self.graph, self.out = record(warm_up, self.body, self.x.device)


class EvalGraph:
    """The evaluations' forward, model(X, Y)'s loss under ctx, replayed from a graph of its own: eagerly a small model
    waits on the CPU launching kernels. Recorded at the first batch, in eval mode; one graph serves every evaluation."""

    def __init__(self, model, ctx, warmups=1):
        self.model, self.ctx, self.warmups, self.graph, self.x = model, ctx, warmups, None, None

    def body(self):
        with self.ctx:  # entered inside the recording, as train_step's: the weights' casts are in the graph
            return self.model(self.x, self.y)[1]

    def __call__(self, X, Y):
        """The loss of batch (X, Y): the graph's own output, overwritten by the next call."""
        if self.x is None or self.x.shape != X.shape:
            self.x, self.y = X.clone(), Y.clone()
            self.capture()
        self.x.copy_(X)
        self.y.copy_(Y)
        self.graph.replay()
        return self.loss

    def capture(self):
        self.graph, self.loss = record(lambda: [self.body() for _ in range(self.warmups)], self.body, self.x.device)


def record(warm_up, body, device):
    """warm_up() on a side stream (the first calls' set-ups: kernel choices, cuBLAS workspaces, compiles), then
    body() recorded as a CUDA graph, as torch.cuda.graphs' documentation does; returns the graph and its output."""
    stream = torch.cuda.Stream(device)
    stream.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(stream):
        warm_up()
    torch.cuda.current_stream(device).wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        return graph, body()


def problem(device_type, distributed, dtype, activation_checkpointing):
    """Why the step cannot be a graph here, or None: it needs a CUDA GPU, under torchrun (distributed: (parallelism,
    ddp_sync, backend)) GradSync's collectives over NCCL, no GradScaler and no activation checkpointing."""
    if device_type != 'cuda':
        return f"needs a CUDA GPU, not {device_type}"
    parallelism, sync, backend = distributed or ('', '', '')
    if distributed and ((parallelism, sync) != ('ddp', 'hooks') or 'nccl' not in (backend or 'nccl').lower()):
        return "under torchrun, only with ddp_sync='hooks' over NCCL: torch's DDP wrapper and FSDP2 are not captured"
    if dtype == 'float16':
        return "float16's GradScaler reads values back on the CPU: use dtype=bfloat16"
    if activation_checkpointing:
        return "not with activation_checkpointing"
    return None


def can_graph(cuda_graph, device_type, distributed, dtype, activation_checkpointing, verbose=True):
    """Whether to replay the step from a graph: asked for, and able to work here (else, verbose, say why not)."""
    why = cuda_graph and problem(device_type, distributed, dtype, activation_checkpointing)
    if why and verbose:
        print(f"cuda_graph: off ({why})")
    return bool(cuda_graph and not why)
