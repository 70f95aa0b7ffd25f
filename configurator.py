"""Configuration overrides for the entry scripts: a script calls `config = configurator.apply(globals(), sys.argv[1:])`,
and config files and --key=value flags override its settings in order. config.given records every key a file or flag
set, whatever its value: resuming a 2-layer checkpoint with --n_layer=12 (the default) asks for 12 layers."""
import ast
import difflib
import math
import os
import sys
import types
from dataclasses import replace
from pathlib import Path

from gpt.runtime.errors import UserError
from gpt.runtime.settings import MODEL, RUN, TRAINING, Setting, comments


def _meant(key, known):
    """The setting a typo (--batchsize) most likely meant, or None. The cutoff is above difflib's 0.6, which pairs
    names merely alike (a removed hellaswag_path with hellaswag_interval)."""
    return next(iter(difflib.get_close_matches(key, list(known), n=1, cutoff=0.75)), None)


def _unknown(key, known, where):
    close = _meant(key, known)
    hint = f": did you mean {close}?" if close else " (--help lists every setting)"
    return UserError(f"unknown config key '{key}' {where}{hint}")


def _coerce(key, value, current, where):
    expected = type(current)
    if expected is float and type(value) is int:
        value = float(value)
    if expected in (int, float) and type(value) is float and not math.isfinite(value):
        # 1e400 reads as inf: no setting means anything by inf or nan
        raise UserError(f"{key} expects a finite number, got {value!r} from {where}")
    if expected is int and type(value) is float:
        if value.is_integer():  # --max_iters=1e3 or 2000.0: a whole number, written as Python writes floats
            return int(value)
        raise UserError(f"{key} expects int, got {value!r} (float) from {where}: give a whole number")
    if type(value) is expected:
        return value
    raise UserError(f"{key} expects {expected.__name__}, got {value!r} ({type(value).__name__}) from {where}: give "
                    + _KINDS.get(expected, f"one like {current!r}"))


_KINDS = {bool: "True or False", int: "a whole number", float: "a number", str: "text (quoted in a config file)"}


def _parse_value(raw, current):
    if isinstance(current, str):
        return raw  # a str setting takes the text as given: --out_dir=2024 is the folder '2024'
    if isinstance(current, bool) and raw.lower() in ("true", "false"):
        return raw.lower() == "true"
    try:
        return ast.literal_eval(raw)
    except (ValueError, SyntaxError):
        return raw


def _expand_home(key, value):
    """A folder or file setting that starts with ~: the user's home, which no shell expands after `--key=`
    (else the run would write into a folder named '~')."""
    if (key.endswith(("_dir", "_path", "_file")) or key in ("init_from", "output", "path")) and isinstance(value, str) \
            and (value == "~" or value.startswith("~/")):
        return os.path.expanduser(value)
    return value


class Config(dict):
    """The final settings, {key: value}, plus `given` (the keys files and flags set), `declared` (each setting's
    Setting) and `sources`: (config file or 'flags', {key: value} it set) in order, consecutive flags as one."""

    def __init__(self, values, given, declared=None, sources=()):
        super().__init__(values)
        self.given, self.sources = frozenset(given), tuple(sources)
        self.declared = declared or {k: Setting(default=v) for k, v in values.items()}

    def set_by(self):
        """{key: the config file that set it last, or 'flags'}, in the order they were last set."""
        last = {}
        for source, values in self.sources:
            for key in values:
                last.pop(key, None)
                last[key] = source
        return last


class _Recording(dict):
    """A config file's scope that records the line that first assigns each name (module-level code stores its
    names through __setitem__ when the scope is not exactly a dict); through a nested exec(), the exec's line."""

    def __init__(self, values, path):
        super().__init__(values)
        self.path, self.lines = path, {}

    def __setitem__(self, key, value):
        if key not in self.lines:
            frame = sys._getframe(1)
            while frame is not None and frame.f_code.co_filename != self.path:
                frame = frame.f_back
            self.lines[key] = frame.f_lineno if frame is not None else None
        super().__setitem__(key, value)


def _bare_annotations(tree):
    """A file's module-level statements `name: value` (a YAML line): annotations, which assign nothing."""
    todo = list(tree.body)
    while todo:
        node = todo.pop(0)
        if isinstance(node, ast.AnnAssign) and node.value is None and isinstance(node.target, ast.Name):
            yield node
        elif not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            todo.extend(child for child in ast.iter_child_nodes(node) if isinstance(child, ast.stmt))


def _run_config_file(path, config):
    """{key: (value, where: file and line)} of the settings a config file assigns, in order; a file that sets none, a
    line that assigns nothing (`batch_size: 16`) or a name no setting has is one error naming file and line."""
    if not os.path.isfile(path):
        raise UserError(f"config file {path} not found (arguments are config files or --key=value flags)")
    scope = _Recording({**config, "__file__": path}, path)  # __file__: a file can find files beside it
    try:
        text = Path(path).read_text(encoding="utf-8")
        tree = ast.parse(text, path)
        code = compile(tree, path, "exec")
    except (SyntaxError, ValueError) as e:  # UnicodeDecodeError is a ValueError
        where = f" at line {e.lineno}" if getattr(e, "lineno", None) else ""
        raise UserError(f"config file {path} is not valid Python{where}: {getattr(e, 'msg', e)} (a config file is "
                        f"Python: key = value lines)")
    except OSError as e:  # no permission, or not a regular file after all
        raise UserError(f"config file {path} could not be read ({e.strerror or e})")
    for node in _bare_annotations(tree):  # before it runs: a YAML value (out-test) may not even evaluate
        name = node.target.id
        meant = name if name in config else _meant(name, config)
        if meant is None:
            raise _unknown(name, config, f"in {path} line {node.lineno}")
        raise UserError(f"config file {path} line {node.lineno}: `{ast.get_source_segment(text, node)}` sets "
                        f"nothing (Python reads it as an annotation; a config file is Python, not YAML): write "
                        f"{meant} = {ast.get_source_segment(text, node.annotation)}")
    try:
        exec(code, scope)
    except (UserError, KeyboardInterrupt):  # Ctrl-C while a file runs stays Ctrl-C
        raise
    except BaseException as e:  # SystemExit too: a config file cannot end the run with status 0, unseen
        tb, line = e.__traceback__, None
        while tb is not None:  # the last line of the file itself that the error passed through
            line = tb.tb_lineno if tb.tb_frame.f_code.co_filename == path else line
            tb = tb.tb_next
        what = (f"it exits (SystemExit({e.code!r})), and a config file may only set values"
                if isinstance(e, SystemExit) else f"{type(e).__name__}: {e}")
        if isinstance(e, NameError) and e.name:  # a flag's unquoted text or lowercase true is a name in Python
            what += (f": write {e.name.capitalize()}" if e.name.lower() in ("true", "false", "none") else
                     f" (text in a config file is quoted: '{e.name}')")
        raise UserError(f"config file {path} failed" + (f" at line {line}" if line else "") + f": {what}")
    overrides = {}
    for key, line in scope.lines.items():
        value, where = scope[key], f"{path} line {line}" if line else path
        if key in config:  # whatever its value: a function or class given to a setting is refused, not skipped
            overrides[key] = value, where
        elif not (key.startswith("_") or isinstance(value, (types.ModuleType, types.FunctionType, type))):
            raise _unknown(key, config, f"in {where}")  # imports, helpers and private names: the file's own
    if not overrides:
        raise UserError(f"config file {path} sets no setting: a config file is Python that assigns settings, one "
                        f"a line (batch_size = 16); --help lists them")
    return overrides


# where --help sends a script's users: configuration.md describes every train.py setting (tests/test_docs.py
# holds it to that); the other scripts' settings are their comments, with more on the page named
DOCS = {"train.py": "docs/configuration.md", "sample.py": "docs/generation.md", "export.py": "docs/export.md",
        "hellaswag.py": "docs/fineweb.md", "bench.py": "docs/benchmarks.md", "dashboard.py": "docs/monitoring.md",
        "plot.py": "docs/monitoring.md", "convert_checkpoint.py": "docs/scaling.md",
        "check_generation.py": "docs/generation.md"}


def usage(declared, script):
    """What --help prints: the call, every setting with its default and documentation, and where they are described."""
    name = os.path.basename(script)
    lines = [f"usage: python {name} [config_file.py ...] [--key=value ...]",
             "Config files (Python files that assign settings) and --key=value flags apply in order; later ones "
             "win.", "Settings, with their defaults:"]
    lines += [f"  --{key}={s.default!r}" + (f"  # {s.doc}" if s.doc else "") for key, s in declared.items()]
    if name == "train.py":
        lines.append(f"Every setting is described in {DOCS[name]}.")
    elif name in DOCS:
        lines.append(f"More in {DOCS[name]}.")
    return "\n".join(lines)


def markdown(declared):
    """Each setting and what a resumed run does with it, as a markdown table (docs/configuration.md's)."""
    resume = {RUN: "takes it", TRAINING: "trains with it", MODEL: "keeps the model's"}
    rows = ["| setting | default | meaning | on resume |", "| --- | --- | --- | --- |"]
    for key, s in declared.items():
        doc = s.doc.replace("|", "\\|")
        rows.append(f"| `{key}` | `{s.default!r}` | {doc} | {resume.get(s.resume, s.resume)} |")
    return "\n".join(rows)


def apply(g, argv, *sections):
    """Apply the config files and --key=value flags of `argv` to the globals `g` and to `sections` (dicts of name ->
    Setting or -> default, updated in place); return the final Config. -h/--help prints the settings and exits."""
    script = g.get("__file__") or sys.argv[0]
    notes = {k: v for k, v in g.get("__annotations__", {}).items() if isinstance(v, Setting) and k in g}
    if not notes:  # a script that declares no setting: its public module-level globals of plain types (nanoGPT's)
        notes = {k: Setting() for k, v in g.items() if not k.startswith("_") and isinstance(v, (bool, int, float, str))}
    try:  # a setting's documentation is the comment on its line
        docs = comments(Path(script).read_text(encoding="utf-8"))
    except OSError:
        docs = {}
    declared = {k: replace(s, default=g[k], doc=docs.get(k, s.doc)) for k, s in notes.items()}
    home = dict.fromkeys(declared, g)  # where a setting's value is written back: the globals, or a plain dict section
    for section in sections:
        for k, v in section.items():
            if k not in declared:
                declared[k] = v if isinstance(v, Setting) else Setting(default=v)
                if not isinstance(v, Setting):
                    home[k] = section
    values = {k: s.default for k, s in declared.items()}
    if {"-h", "--help", "--help=markdown"} & set(argv):
        print(usage(declared, script) if {"-h", "--help"} & set(argv) else markdown(declared))
        raise SystemExit(0)
    sources = []  # (config file or 'flags', {key: value}), in order
    for arg in argv:
        if "=" in arg:
            if not arg.startswith("--"):
                raise UserError(f"cannot parse argument {arg!r}: write --key=value")
            key, _, raw = arg[2:].partition("=")
            if key not in values:
                raise _unknown(key, values, f"(from {arg})")
            overrides, source = {key: (_parse_value(raw, values[key]), arg)}, "flags"
        elif arg.startswith("-"):
            raise UserError(f"flag {arg} has no value: write {arg}=VALUE")
        else:
            overrides, source = _run_config_file(arg, values), arg
        for key, (value, where) in overrides.items():
            values[key] = _coerce(key, _expand_home(key, value), values[key], where)
        if source != "flags" or not sources or sources[-1][0] != "flags":
            sources.append((source, {}))
        sources[-1][1].update({key: values[key] for key in overrides})
    for key, where in home.items():
        where[key] = values[key]
    config = Config(values, {key for _, given in sources for key in given}, declared, sources)
    # nanoGPT's echo of the overrides, one line for each config file and one for the flags: the settings whose
    # value differs from the default, under the file or flag that gave it (the whole config: log.jsonl)
    groups = {}
    for key, source in config.set_by().items():
        if config[key] != config.declared[key].default:
            groups.setdefault(source, []).append(f"{key}={config[key]!r}")
    for source, pairs in groups.items():
        print(f"config from {source}: " + " ".join(pairs))
    return config
