"""
The torch versions the requirements allow (2.11, the GPU machines', to 2.13, CI's) must all run this code. A
torch API whose signature changed between them broke every GPU run once (torch.random.fork_rng's device_type:
None is the current accelerator in 2.13, a TypeError in 2.11). This test finds every torch function and class
the project's code names (attribute chains on torch's modules and `from torch... import` names, by parsing the
tracked .py files), reads its signature in this torch and in the other one ($TORCH_OTHER_PYTHON, which .ci/run
sets to its torch 2.11 environment), and fails on each difference the code could meet that is not in
REVIEWED: a parameter one version lacks that a call here passes, or a default that differs, passed or not.
A parameter only one version has and no call here passes cannot matter, and passes.

Run this file as a script to print the collected signatures as JSON (what the test reads from the other
torch).
"""
import ast
import importlib
import inspect
import json
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# name -> why its difference between the tested versions is safe here; each entry was read against both sources
REVIEWED = {
    "torch.random.fork_rng": "device_type's default is 'cuda' in 2.11 and None (the current accelerator) in "
                             "2.13: gpt/training/plan.py always passes a device type, which both accept",
    "torch.compile": "backend's default is 'inductor' in 2.11 and None in 2.13, which means inductor there; no call "
                     "here passes a backend but tests/test_hellaswag.py's own counting backend",
    "torch.nn.parallel.DistributedDataParallel": "broadcast_buffers' default is True in 2.11 and None in 2.13, "
                                                 "which means True unless forward_sync_buffers is given (it is not)",
    "torch.cuda._is_in_bad_fork": "a C function of no arguments in CUDA builds, a lambda of none in CPU builds "
                                  "(which have no CUDA to fork); gpt/runtime/hardware.py passes none",
}


def _chain(node):
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(reversed(parts))
    return None


def torch_names():
    """{torch API name: set of keyword names the project's calls pass to it} over the tracked .py files."""
    files = subprocess.run(["git", "ls-files", "*.py"], cwd=ROOT, capture_output=True, text=True,
                           check=True).stdout.split()
    names = {}
    for path in files:
        tree = ast.parse(open(os.path.join(ROOT, path)).read())
        aliases = {}  # local name -> the torch name it stands for
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("torch"):
                for a in node.names:
                    aliases[a.asname or a.name] = f"{node.module}.{a.name}"
            elif isinstance(node, ast.Import):
                for a in node.names:
                    if a.name.startswith("torch"):
                        aliases[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
        for node in ast.walk(tree):
            chain = _chain(node) if isinstance(node, (ast.Attribute, ast.Name)) else None
            head, _, rest = (chain or "").partition(".")
            if head in aliases:
                names.setdefault(aliases[head] + ("." + rest if rest else ""), set())
            if isinstance(node, ast.Call):
                chain = _chain(node.func)
                head, _, rest = (chain or "").partition(".")
                if head in aliases:
                    called = aliases[head] + ("." + rest if rest else "")
                    names.setdefault(called, set()).update(k.arg for k in node.keywords if k.arg)
    return names


def _resolve(name):
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
            break
        except ImportError:
            continue
    for p in parts[i:]:
        obj = getattr(obj, p)
    return obj


def _plain(text):
    """A default's repr without the addresses that differ between processes (<function f at 0x7f...>)."""
    return re.sub(r" at 0x[0-9a-f]+", "", text)


def signatures():
    """{name: {parameter: [kind, default repr]} or a string (missing, no signature)} in this torch."""
    out = {}
    for name in sorted(torch_names()):
        try:
            obj = _resolve(name)
        except Exception as e:  # a name this torch lacks
            out[name] = f"missing ({type(e).__name__})"
            continue
        try:
            params = inspect.signature(obj).parameters.values()
        except (TypeError, ValueError):  # a value (ReduceOp.MAX), or a C function: its tests are what checks it
            out[name] = "no signature"
            continue
        out[name] = {p.name: [p.kind.name, None if p.default is p.empty else _plain(repr(p.default))] for p in params}
    return out


def differences(ours, theirs, passed):
    """[(name, what)] the code could meet: see the module's docstring."""
    found = []
    for name in sorted(set(ours) | set(theirs)):
        a, b = ours.get(name), theirs.get(name)
        if a == b:
            continue
        if not (isinstance(a, dict) and isinstance(b, dict)):
            found.append((name, f"{a!r} here, {b!r} in the other torch"))
            continue
        for param in sorted(set(a) | set(b)):
            if param not in a or param not in b:
                if param in passed.get(name, ()):
                    found.append((name, f"the code passes {param}, which one version lacks"))
            elif a[param][1] != b[param][1]:
                found.append((name, f"{param}'s default is {a[param][1]} here, {b[param][1]} in the other torch"))
    return found


def test_the_code_names_torch_apis_and_a_changed_signature_is_found():
    """The collector sees the project's torch calls (with their keywords), and a difference is reported."""
    names = torch_names()
    assert "device_type" in names["torch.random.fork_rng"] and "torch.nn.functional.scaled_dot_product_attention" \
        in names and len(names) > 100, sorted(names)[:20]
    a = {"f": {"x": ["POSITIONAL_OR_KEYWORD", None], "d": ["KEYWORD_ONLY", "'cuda'"]}}
    b = {"f": {"x": ["POSITIONAL_OR_KEYWORD", None], "d": ["KEYWORD_ONLY", "None"], "new": ["KEYWORD_ONLY", "1"]}}
    assert differences(a, b, {"f": set()}) == [("f", "d's default is 'cuda' here, None in the other torch")]
    assert len(differences(a, b, {"f": {"new"}})) == 2 and differences(a, a, {}) == []


@pytest.mark.skipif(not os.environ.get("TORCH_OTHER_PYTHON"), reason="TORCH_OTHER_PYTHON (a Python with another "
                    "torch, as .ci/run makes) is not set")
def test_every_torch_api_used_means_the_same_in_both_torch_versions():
    other = os.environ["TORCH_OTHER_PYTHON"]
    r = subprocess.run([other, os.path.abspath(__file__)], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]
    version = subprocess.run([other, "-c", "import torch; print(torch.__version__)"], capture_output=True,
                             text=True).stdout.strip()
    import torch
    assert version.split("+")[0] != torch.__version__.split("+")[0], "TORCH_OTHER_PYTHON has this same torch"
    found = [(name, what) for name, what in differences(signatures(), json.loads(r.stdout), torch_names())
             if name not in REVIEWED]
    assert not found, (f"torch {torch.__version__} and {version} differ where this code calls them; check each "
                       f"call against both versions, then add the name to REVIEWED with the reason it is safe:\n"
                       + "\n".join(f"  {name}: {what}" for name, what in found))


if __name__ == "__main__":
    sys.path.insert(0, ROOT)
    json.dump(signatures(), sys.stdout, indent=1, sort_keys=True)
