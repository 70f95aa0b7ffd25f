"""
The promise `python train.py --help` ends with: every setting is described in docs/configuration.md. Its table
of settings is derived from the declarations (`python train.py --help=markdown`), so a setting added anywhere,
or a declaration changed, without the docs following fails here.
"""
import os
import subprocess
import sys

from conftest import declarations

import configurator

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BEGIN, END = "<!-- settings: python train.py --help=markdown -->", "<!-- end of settings -->"


def documented_table():
    with open(os.path.join(ROOT, "docs", "configuration.md"), encoding="utf-8") as f:
        text = f.read()
    assert BEGIN in text and END in text, "configuration.md holds the generated table between its two markers"
    return text.split(BEGIN)[1].split(END)[0].strip()


def test_configuration_md_holds_the_table_the_declarations_give():
    declared = declarations()
    assert {"out_dir", "batch_size", "family", "muon_lr", "ddp_bucket_mb", "dashboard"} <= set(declared)
    assert documented_table() == configurator.markdown(declared), \
        "docs/configuration.md's table is stale: paste `python train.py --help=markdown` between its markers"
    assert all(s.doc for s in declared.values()), [k for k, s in declared.items() if not s.doc]


def test_help_markdown_is_that_table():
    r = subprocess.run([sys.executable, os.path.join(ROOT, "train.py"), "--help=markdown"], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == documented_table(), r.stderr[-2000:]
