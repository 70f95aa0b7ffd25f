"""Triton's kernels compiled by processes started at launch, so that a cold start pays Triton's start and its
compiles beside `import torch`, not after it (docs/speedrun.md#start-up).

Each compiler (`python -m gpt.kernels.ahead`) imports Triton, not torch, builds Triton's C utilities and starts
LLVM on an empty kernel, then waits for train.py to send the kernels the run will call (dispatch.compile_ahead:
Triton's specialization data of each, and the GPU's target). It compiles them into Triton's cache on disk with
their C launchers, never starting CUDA, and precompile loads them from there. A compiler that fails costs time
only: precompile compiles what is not in the cache.
"""
import contextlib
import importlib.util
import json
import os
import subprocess
import sys

COMPILERS = 5  # the fused kernels a step can call: QK's and LayerNorm's forward and backward, and the loss


def start():
    """The compilers where there is an NVIDIA GPU and Triton, else none: each a Python without torch, silent."""
    gpu = os.path.exists('/proc/driver/nvidia') or os.path.exists('/dev/dxg')  # the NVIDIA driver (/dev/dxg: WSL's)
    if not (gpu and sys.executable and importlib.util.find_spec('triton')):
        return []
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = {**os.environ, 'PYTHONPATH': os.pathsep.join([root, *filter(None, [os.environ.get('PYTHONPATH')])])}
    return [subprocess.Popen([sys.executable, '-m', 'gpt.kernels.ahead'], env=env, stdin=subprocess.PIPE,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for _ in range(COMPILERS)]


def send(compilers, specs, target):
    """Each compiler its share of specs and the target (Triton's: (90, 32) for 9.0); no specs end them."""
    for i, compiler in enumerate(compilers):
        with contextlib.suppress(BrokenPipeError), compiler.stdin:  # one that died: precompile compiles its share
            compiler.stdin.write(json.dumps(dict(specs=specs[i::len(compilers)], target=target)).encode())


def finish(compilers):
    """Wait for the compilers; their exit codes (0: every kernel sent is in Triton's cache)."""
    return [compiler.wait() for compiler in compilers]


def _empty(x):  # the kernel that starts Triton's compiler (LLVM, ptxas) before there is work
    pass


def compile_sent():
    """One compiler's life: ready Triton, then compile what train.py sends (stdin: send's JSON; none: exit)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.backends.nvidia.driver import CudaDriver, CudaLauncher, CudaUtils, libcuda_dirs
    from triton.compiler import ASTSource
    from triton.runtime import driver
    try:  # the C that Triton builds with gcc links libcuda: none to build on a machine without it (the tests')
        build_c = bool(libcuda_dirs()) and bool(CudaUtils())  # Triton's C utilities for CUDA
    except AssertionError:
        build_c = False
    triton.compile(ASTSource(triton.jit(_empty), {'x': '*fp32'}), target=GPUTarget('cuda', 90, 32))  # any GPU's
    if not (work := json.loads(sys.stdin.read() or '{}')).get('specs'):
        return
    target = GPUTarget('cuda', *work['target'])
    stand_in = CudaDriver.__new__(CudaDriver)  # tells Triton the device and target, asks CUDA nothing
    stand_in.get_current_device, stand_in.get_current_target = (lambda: 0), (lambda: target)
    driver.set_active(stand_in)
    for spec in work['specs']:
        module, name = json.loads(spec)['name'].rsplit('.', 1)
        kernel = getattr(importlib.import_module(module), name).preload(spec)
        if build_c:
            CudaLauncher(kernel.src, kernel.metadata)  # its launcher


if __name__ == '__main__':
    compile_sent()
