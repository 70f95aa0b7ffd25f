"""
User errors: a mistake a user can fix (a bad flag, a missing file) is raised as UserError and
printed as one line, `error: ...`, with exit status 2 - no traceback. Ctrl-C (KeyboardInterrupt) is the
line `interrupted (Ctrl-C)` and status 130. Anything else is a bug and keeps its traceback.

on_failure(callback): what a script has changed and must put back if it stops on any of these, e.g.
gpt/rundir.py's Claim.undo (an earlier run's files moved back when a run fails before its first step).
The hook calls it, not atexit: atexit runs at every exit, a successful one too, and cannot tell them apart,
while the hook runs exactly when an exception ends the script (not at sys.exit, nor when the process is
killed: then nothing runs, and what was set aside stays aside, named by the note that moved it).
"""
import sys

_failure_callbacks = []  # the process's, as atexit's are: added by on_failure, called once by the hook


class UserError(Exception):
    pass


def on_failure(callback):
    """Call `callback()` if the script ends on an uncaught exception, before its message is printed (so the
    message stays the last line). The callback says itself when it has nothing left to do (Claim.settle)."""
    _failure_callbacks.append(callback)


def _run_failure_callbacks():
    while _failure_callbacks:
        callback = _failure_callbacks.pop()  # last registered first, as atexit
        try:
            callback()
        except Exception as e:  # putting back what it can must not hide the error that ended the run
            print(f"note: could not undo what the run changed ({type(e).__name__}: {e})",
                  file=sys.__stderr__ or sys.stderr, flush=True)


def _excepthook(kind, value, tb):
    _run_failure_callbacks()
    if issubclass(kind, KeyboardInterrupt):  # Ctrl-C outside the training loop (which stops cleanly itself)
        print("interrupted (Ctrl-C)", file=sys.__stderr__ or sys.stderr, flush=True)
        sys.exit(130)  # 128 + SIGINT, as a shell reports it
    if issubclass(kind, UserError):
        # the real stderr: torch.distributed wraps this hook and buffers sys.stderr while it runs,
        # and the exit below would skip printing that buffer
        print(f"error: {value}", file=sys.__stderr__ or sys.stderr, flush=True)
        sys.exit(2)  # sys.exit inside the hook sets the interpreter's exit status
    sys.__excepthook__(kind, value, tb)


def install():
    """Entry scripts call this once so an uncaught UserError prints one line and exits with 2."""
    sys.excepthook = _excepthook
