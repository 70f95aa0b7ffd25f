"""
dev/fp8_matmul.py, the FP8 bound of docs/records/2026-11-27-speedrun.md: its per-tensor quantization on the CPU (float8
casts run anywhere), its refusal where there is no FP8 GPU, and on an H100 the table itself.
"""
import importlib.util
import os

import pytest
import torch
from conftest import ROOT, run

spec = importlib.util.spec_from_file_location("fp8_matmul", os.path.join(ROOT, "dev", "fp8_matmul.py"))
fp8 = importlib.util.module_from_spec(spec)
spec.loader.exec_module(fp8)


@pytest.mark.parametrize("dtype", [fp8.E4M3, fp8.E5M2], ids=["e4m3", "e5m2"])
def test_quantize_keeps_the_tensor_within_the_formats_precision(dtype):
    g = torch.Generator().manual_seed(0)
    for magnitude in (1e-4, 1.0, 1e4):  # the scale puts any range into the format's
        x = torch.randn(64, 96, generator=g) * magnitude
        q, scale = fp8.quantize(x, dtype)
        assert q.dtype == dtype and scale.dtype == torch.float32 and scale.dim() == 0
        assert q.float().abs().max() == torch.finfo(dtype).max  # the largest entry lands on the format's top
        back = q.float() * scale
        # e4m3 keeps 3 mantissa bits (relative step 2^-3), e5m2 2 bits: each entry within half a step, except
        # the smallest, which fall below the format's normal range
        step = 2.0 ** -(3 if dtype == fp8.E4M3 else 2)
        big = x.abs() > x.abs().max() * 2 ** -6
        assert ((back - x).abs()[big] <= x.abs()[big] * step / 2 * 1.0001).all()
        assert (back - x).norm() / x.norm() < step / 2


@pytest.mark.skipif(torch.cuda.is_available() and torch.cuda.get_device_capability() >= (8, 9),
                    reason="this GPU runs FP8: the table is measured, not refused")
def test_without_an_fp8_gpu_one_error_line():
    r = run("dev/fp8_matmul.py", check=False)
    assert r.returncode != 0 and r.stderr.strip().splitlines() == [
        "error: FP8 matmuls need a CUDA GPU of compute capability 8.9 or newer (H100, L4, ...): run this on one"]


@pytest.mark.cuda
def test_the_table_on_an_fp8_gpu():
    if torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("needs compute capability 8.9 or newer")
    out = run("dev/fp8_matmul.py", "--tokens=2048", "--n_layer=2", "--iters=3").stdout
    rows = [line for line in out.splitlines() if line.startswith("| head") or line.startswith("| MLP")]
    assert len(rows) == 9
    assert all(float(line.split("|")[-2]) < 0.1 for line in rows)  # each product within FP8's error
