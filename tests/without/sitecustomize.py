"""
Python's startup hook, for checking the suite as it runs on a machine without some optional packages (the
GPU machines have no datasets and no wandb) on one that has them. With this folder on PYTHONPATH, every
top-level package named in $NANOGPT_WITHOUT (comma-separated) is missing for this process and every process
it starts (a test's script, torchrun's ranks inherit the environment): `import datasets` raises
ModuleNotFoundError and importlib.util.find_spec("datasets") is None, as when it is not installed.
$ NANOGPT_WITHOUT=datasets,wandb PYTHONPATH=tests/without python -m pytest -q tests/test_prepare.py
"""
import os
import sys

for _name in filter(None, os.environ.get("NANOGPT_WITHOUT", "").split(",")):
    sys.modules[_name.strip()] = None  # None in sys.modules: the import system's "not importable"
