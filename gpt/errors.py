"""
User errors: a mistake a user can fix (a bad flag, a missing file) is raised as UserError and
printed as one line, `error: ...`, with exit status 2 - no traceback. Ctrl-C (KeyboardInterrupt) is the
line `interrupted (Ctrl-C)` and status 130. Anything else is a bug and keeps its traceback.
"""
import sys


class UserError(Exception):
    pass


def _excepthook(kind, value, tb):
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
