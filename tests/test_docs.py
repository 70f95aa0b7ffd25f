"""
The promise `python train.py --help` ends with: every setting is described in docs/configuration.md. The
settings are read from the code as it is - train.py's globals between its first two `# ----` lines, and the
sections it hands the configurator (GPTConfig.options(), gpt/optim/muon.py's and gpt/runtime/distributed.py's OPTIONS) -
so a setting added anywhere without a line in the docs fails here.
"""
import ast
import os
import re

from gpt.optim import muon
from gpt.runtime import distributed
from model import GPTConfig

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def train_settings():
    """The names train.py's configurator takes: its plain globals in the settings block (not the sections,
    which are dicts built by calls), and the sections' keys."""
    with open(os.path.join(ROOT, "train.py"), encoding="utf-8") as f:
        source = f.read()
    marks = [i for i, line in enumerate(source.splitlines(), 1) if line.startswith("# ----")][:2]
    assert len(marks) == 2, "train.py's settings block lies between two '# ----' lines"
    names = [target.id for node in ast.parse(source).body
             if isinstance(node, ast.Assign) and marks[0] < node.lineno < marks[1]
             and not isinstance(node.value, ast.Call) for target in node.targets if isinstance(target, ast.Name)]
    sections = [GPTConfig.options(), muon.OPTIONS, distributed.OPTIONS]
    return list(dict.fromkeys(names + [name for section in sections for name in section]))


def documented():
    """Every `name` in the first cell of a table row of docs/configuration.md."""
    with open(os.path.join(ROOT, "docs", "configuration.md"), encoding="utf-8") as f:
        rows = [line for line in f if line.startswith("|")]
    return {name for row in rows for name in re.findall(r"`(\w+)`", row.split("|")[1])}


def test_every_train_setting_is_in_a_table_of_configuration_md():
    settings = train_settings()
    assert {"out_dir", "batch_size", "family", "muon_lr", "ddp_bucket_mb"} <= set(settings)  # the parse works
    missing = [name for name in settings if name not in documented()]
    assert not missing, f"settings without a row in docs/configuration.md: {missing}"
