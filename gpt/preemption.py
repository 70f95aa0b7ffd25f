"""
Stopping a run cleanly when the machine is taken away. SIGTERM (what schedulers and torchrun send) or
SIGINT (Ctrl-C) asks the training loop to finish its current step, write a checkpoint and exit with a
message saying how to resume. A second signal exits at once, without a checkpoint.
"""
import os
import signal
import sys

import torch
import torch.distributed as dist


class StopRequest:

    def __init__(self):
        self.signum = None
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._handle)

    def _handle(self, signum, frame):
        if self.signum is not None:
            print(f"\n{signal.Signals(signum).name} again: exiting now, without a checkpoint", file=sys.__stderr__,
                  flush=True)
            sys.stdout.flush()
            os._exit(128 + signum)
        self.signum = signum
        print(f"\n{signal.Signals(signum).name} received: finishing this step, then writing a checkpoint "
              f"(send it again to exit at once)", flush=True)

    def requested(self, device=None):
        """Whether to stop now. Under DDP every rank must agree, or the ranks that go on would wait
        forever for the ones that stopped: any rank's signal stops them all, at the same step."""
        stop = self.signum is not None
        if dist.is_available() and dist.is_initialized():
            flag = torch.tensor([int(stop)], device=device)
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
            stop = bool(flag.item())
        return stop

    @property
    def exit_code(self):
        return 128 + (self.signum or signal.SIGTERM)
