"""
Launch to the first training step, shorter, without changing the run (issue 23; docs/speedrun.md's startup table).

torch.optim imports torch._dynamo at the first optimizer, compiled or not (Optimizer.__init__ calls
add_param_group, which torch wraps in torch._disable_dynamo; step() and zero_grad() import it too): ~0.8 s on
a CPU, ~3 s on the GPU machines. No constructor argument avoids it (foreach, fused and Muon's own optimizer all
go through Optimizer), so train.py imports it in a background thread while the model is built, whose
initialisation is torch kernels that release the GIL (Preload).
"""
import importlib
import threading


class Preload:
    """Import a module in a background thread. Start it only around work that imports nothing, and wait()
    before anything else may import: two threads importing modules that import each other can deadlock (Python
    then raises in one of them). A failed import is left for the main thread's own import to report."""

    def __init__(self, name):
        self.thread = threading.Thread(target=self._load, args=(name,), name=f"import {name}", daemon=True)
        self.thread.start()

    @staticmethod
    def _load(name):
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 - the main thread imports it again and says what is wrong
            pass

    def wait(self):
        self.thread.join()
