"""Stopping a run cleanly when the machine is taken away: SIGTERM, SIGINT or SIGHUP asks for a checkpoint and an
exit after this step (docs/checkpoints.md#preemption says what each signal does)."""
import errno
import os
import signal
import stat
import sys
from contextlib import suppress

import torch
import torch.distributed as dist

HANGUP = getattr(signal, "SIGHUP", None)  # Windows has none
LOST = (OSError, ValueError, RuntimeError)  # a print from a signal handler that failed: see say()


class StopRequest:
    """then: what check() does on a stop (train.py's: checkpoint and exit); device: where the ranks' flags meet."""

    def __init__(self, device=None, then=None):
        self.signum, self.device, self.then = None, device, then
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._handle)
        if HANGUP is not None and signal.getsignal(HANGUP) is not signal.SIG_IGN:  # nohup's choice stands
            signal.signal(HANGUP, self._handle)
            sys.stdout, sys.stderr = OutlivesTerminal(sys.stdout), OutlivesTerminal(sys.stderr)

    def _handle(self, signum, frame):
        name = signal.Signals(signum).name
        if self.signum is not None:
            if signum == HANGUP:
                return  # a terminal's hangup again, not someone asking twice
            say(f"\n{name} again: exiting now, without a checkpoint", sys.__stderr__)
            with suppress(*LOST):
                sys.stdout.flush()
            os._exit(128 + signum)
        self.signum = signum
        if signum == HANGUP:
            mute_dead_terminal()
        say(f"\n{name} received{' (the terminal closed?)' if signum == HANGUP else ''}: finishing this step (an "
            f"evaluation is abandoned), then writing a checkpoint (send "
            f"{'SIGTERM' if signum == HANGUP else 'it again'} to exit at once)")

    def requested(self):
        """Whether to stop now. Under DDP every rank must agree, or the ranks that go on would wait
        forever for the ones that stopped: any rank's signal stops them all, at the same step."""
        stop = self.signum is not None
        if dist.is_available() and dist.is_initialized():
            flag = torch.tensor([int(stop)], device=self.device)
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
            stop = bool(flag.item())
        return stop

    def check(self):
        """then() if a stop was asked for, on any rank. Called between steps and between an evaluation's batches
        (which it abandons: its partial result is never used), on every rank alike: requested() is a collective."""
        return self.requested() and self.then()

    @property
    def exit_code(self):
        return 128 + (self.signum or signal.SIGTERM)


def say(text, stream=None):
    """Print from a signal handler: it runs between any two bytecodes, maybe inside another print (RuntimeError:
    a reentrant call) or with the terminal gone (OSError); the message is then lost, never the run."""
    with suppress(*LOST):
        print(text, file=stream or sys.stdout, flush=True)


class OutlivesTerminal:
    """stdout or stderr whose write meets its terminal hung up (EIO: the kernel has sent SIGHUP, the handler has
    not run yet) sends the terminal to /dev/null, as the handler does, instead of ending the run there."""

    def __init__(self, stream):
        self.stream = stream.stream if isinstance(stream, OutlivesTerminal) else stream

    def __getattr__(self, name):
        return getattr(self.stream, name)

    def write(self, text):
        return self._outliving("write", text)

    def flush(self):
        return self._outliving("flush")

    def _outliving(self, name, *args):
        try:
            return getattr(self.stream, name)(*args)
        except OSError as e:
            if e.errno != errno.EIO:
                raise
            mute_dead_terminal()
            return getattr(self.stream, name)(*args)  # into /dev/null now; a terminal not hung up fails again


def mute_dead_terminal():
    """stdout and stderr that were a terminal now hung up go to /dev/null (a live one stays): a hung-up terminal
    is a character device that no longer answers as a terminal (isatty fails) and is not /dev/null."""
    for fd in (1, 2):
        try:
            st = os.fstat(fd)
            hung_up = stat.S_ISCHR(st.st_mode) and not os.isatty(fd) and st.st_rdev != os.stat(os.devnull).st_rdev
        except OSError:
            continue
        if hung_up:
            null = os.open(os.devnull, os.O_WRONLY)
            os.dup2(null, fd)
            os.close(null)
