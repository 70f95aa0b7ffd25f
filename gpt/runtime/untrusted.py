"""Reading files from outside the run (checkpoints, transformers weights): torch.load restricted to tensors and plain
data, so that no file can run code, and every way such a file can be wrong one line naming it (UserError).
docs/checkpoints.md#untrusted-files says what is refused and why."""
import pickle
import re
import zipfile

import torch

from gpt.runtime.errors import UserError

# how torch.save's legacy (pre-zip) files begin: pickle protocol 2, then torch's magic number as a long
LEGACY_START = b"\x80\x02\x8a\nl\xfc\x9cF\xf9 j\xa8P\x19"


def safe_load(path):
    """torch.load(weights_only=True) onto the CPU, its failures one line each; torch's advice for a refused
    pickle (weights_only=False, which would run the file's code) is never passed on."""
    try:
        with open(path, "rb") as f:
            start = f.read(len(LEGACY_START))
    except OSError as e:
        raise UserError(f"{path} could not be read ({e.strerror or e})")
    if not zipfile.is_zipfile(path) and start != LEGACY_START and start:
        # torch.load would read any other file as a legacy pickle and fail with whatever that decoding hit
        raise UserError(f"{path} is not a PyTorch checkpoint (neither torch.save's zip format nor its legacy "
                        f"one): point out_dir or the path at the ckpt.pt a run wrote")
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - whatever a damaged file makes the unpickler raise is the file's fault
        text = str(e)
        if isinstance(e, pickle.UnpicklingError) and (refused := re.search(r"GLOBAL ([\w.]+)", text)):
            raise UserError(f"{path} is unsafe, not loaded: it holds an object of class {refused.group(1)}, and "
                            f"loading that could run code (checkpoints may hold only tensors and plain data); "
                            f"if you trust the file, re-save it without that entry")
        if "weights_only" in text or "WeightsUnpickler" in text:  # refused for another reason than a class
            detail = re.search(r"WeightsUnpickler error:\s*([^.\n]+)", text)  # e.g. Unsupported operand 105
            raise UserError(f"{path} is unsafe, not loaded: it holds more than tensors and plain data"
                            + (f" ({detail.group(1).strip()[:200]})" if detail else "") + ", and loading that could "
                            "run code; if you trust the file, re-save it with only tensors and plain data")
        reason = text.strip().splitlines()[0] if text.strip() else type(e).__name__
        raise UserError(f"{path} is not a readable checkpoint (truncated or corrupted): {reason[:200]}")


def first_non_finite(state_dict):
    return next((k for k, v in state_dict.items() if v.is_floating_point() and not torch.isfinite(v).all()), None)
