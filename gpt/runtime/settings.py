"""Every setting is declared once, beside the code that owns it, as a Setting: its default, the values that make sense,
one line of documentation, when it does nothing and what a resumed run does with it. --help, the tables of
docs/configuration.md, the checks, the notes and the resume rules all come from the declarations."""
import os
import re
from dataclasses import dataclass

from gpt.runtime.errors import UserError

# What a resumed run does with a setting whose value differs from its checkpoint's run:
RUN = 'run'  # takes it: how the run is carried out, evaluated, logged and saved, the same training either way
TRAINING = 'training'  # takes it: the next step trains with the new value (a rate, the schedule, the batch, the data)
# kept(why): refuses it, saying why (the optimizer's state or the random streams depend on it)
kept = lambda why: 'kept: ' + why
MODEL = 'model'  # a model field: the weights' own, kept as its kind on GPTConfig says (gpt/training/plan.py)


@dataclass(frozen=True)
class Setting:
    check: tuple = ()  # (test of a value, what a value must be): a value that fails is one `error:` line
    resume: str = RUN  # RUN, TRAINING, kept(why), or MODEL for GPTConfig's fields
    unused: object = None  # settings -> why this one does nothing in such a run (None: it does something)
    default: object = None  # a feature's settings; a script's own have their value as the default
    doc: str = ''  # one line for --help and docs/configuration.md; a script's own have their comment


POSITIVE = (lambda v: v > 0, "positive")
NOT_NEGATIVE = (lambda v: v >= 0, "0 or more")
FRACTION = (lambda v: 0 <= v < 1, "at least 0 and below 1")
NUCLEUS = (lambda v: 0 < v <= 1, "above 0 and at most 1 (1.0: no nucleus cut)")  # top-p sampling
PORT = (lambda v: 0 <= v <= 65535, "a TCP port, 0 to 65535 (0: any free port)")
at_least = lambda low, what: (lambda v: v >= low, what)  # a check of its own: at least `low`, described as `what`
# numpy's generators take any seed >= 0, torch.manual_seed up to 2**64 - 1; the scripts add the rank, the step
# or a stream number to the seed, so below 2**63 leaves them all room
SEED = (lambda v: 0 <= v < 2**63, "at least 0 and below 2**63")


def greedy(c):
    """When sample.py's and the like's sampling settings do nothing."""
    return c['temperature'] == 0 and "temperature=0 decodes greedily (the likeliest token), so no token is drawn"


def not_resumed(c):
    return c['init_from'] != 'resume' and f"init_from={c['init_from']!r} loads that model, not out_dir's checkpoint"


def label_only(c):
    """When train.py's dataset does nothing: data_dir names the folder; a dataset of another name only labels it."""
    folder = os.path.basename(os.path.normpath(c['data_dir'])) if c['data_dir'] else c['dataset']
    return folder != c['dataset'] and (f"data_dir={c['data_dir']!r} is the data trained on (dataset only names it "
                                       f"in the run's record)")


def by_interval(c):
    """When always_save_checkpoint does nothing: checkpoint_interval other than 0 decides when to save."""
    n = c['checkpoint_interval']
    return n != 0 and (f"checkpoint_interval={n} " + ("saves every N steps" if n > 0 else "saves no checkpoints")
                       + ", not after each evaluation")


# bench.py's lists of batch sizes
BATCH_LIST = (lambda v: all(b.strip().isdigit() and int(b) > 0 for b in v.split(',') if b.strip()),
              "positive integers separated by commas (e.g. 12,32)")


def comments(source):
    """{name: comment} of a source's lines `name = value # comment` and `name: note = value # comment`."""
    found = {}
    for line in source.splitlines():
        if m := re.match(r"\s*(\w+)\s*(:.*?)?=[^#]*#\s*(.+)$", line):
            found.setdefault(m.group(1), m.group(3).strip())
    return found


def check(config, declarations):
    """A value of the right type that makes no sense (a negative rate, dropout 1.5) is one `error:` line."""
    for key, s in declarations.items():
        if s.check and key in config and not s.check[0](config[key]):
            raise UserError(f"{key}={config[key]!r} makes no sense: {key} must be {s.check[1]}")


def notes(config, declarations):
    """Lines "key=value does nothing here: why" for the settings given (config.given) that the others make do
    nothing. Notes, not errors: a config file may set what a flag then turns off."""
    given = getattr(config, 'given', ())
    whys = {key: s.unused(config) for key, s in declarations.items() if s.unused and key in given}
    return [f"{key}={config[key]!r} does nothing here: {why}" for key, why in whys.items() if why]


def resume_groups(declarations):
    """{RUN: [names], TRAINING: [names], MODEL: [names], 'kept': {name: why}}: what a resumed run does with each."""
    groups = {RUN: [], TRAINING: [], MODEL: [], 'kept': {}}
    for key, s in declarations.items():
        if s.resume.startswith('kept: '):
            groups['kept'][key] = s.resume[len('kept: '):]
        else:
            groups[s.resume].append(key)
    return groups

