"""Rules: the checks a setting's value must pass, and the one-line message when it does not.

The ground floor of gdr's checking (it imports nothing of gdr, in the spirit of scikit-learn's
``utils/_param_validation.py``): a :class:`Rule` pairs a dotted config key with a :data:`Check`, a function of
the value and the config section the rule is applied to that returns what is wrong (``"must be a positive
integer"``) or None. The owners of settings declare their rules beside them: a settings dataclass's field in its
metadata (:func:`setting` ``rule=``; :func:`fields_rules` derives a class's table), the data loaders in
:mod:`gdr.data`; :mod:`gdr.validate` assembles them into the commands' tables. Every refusal is a
:class:`ConfigError` of one line, ``<key>=<value>: <problem> (<what the key means>)``:
``sample.n_queries=-3: must be a positive integer (the number J of sampled queries)``.

:func:`check_rules` applies rules to a composed config section; :func:`check_values` applies them to the
keyword arguments of a Python function (naming the argument instead of the config key); :func:`option_type` makes a
check the ``type=`` of a command-line option (the benchmarks'), so a flag is refused in the words of the setting.
"""
from __future__ import annotations

import argparse
import codecs
import contextlib
import difflib
import math
import numbers
import re
from dataclasses import MISSING as NO_FIELD_DEFAULT
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Sequence

from omegaconf import MISSING, DictConfig, ListConfig, OmegaConf

__all__ = ["ConfigError", "Rule", "Check", "check_rules", "check_values", "get", "show", "missing",
           "setting", "same_setting", "GroupOption", "MISSING",
           "EFFECTS", "effect_of", "rule_of", "fields_rules", "any_value", "Each", "option_type"]


class ConfigError(ValueError):
    """A config value a command cannot run with; the message names the key, the value and the fix."""


# A check gets the value and the section its rule table is applied to (the whole config, or
# ``cfg.index`` for ``gdr run``'s index rules) and returns what is wrong, or None.
Check = Callable[[Any, DictConfig], "str | None"]


@dataclass(frozen=True)
class Rule:
    key: str            # dotted path inside the section; "*" matches every key of a mapping
    check: Check
    what: str = ""      # what the key means: the end of the message

    def under(self, prefix: str) -> "Rule":
        """The same rule for the key ``<prefix>.<key>``."""
        return Rule(f"{prefix}.{self.key}", self.check, self.what)


def refusal(key: str, value: Any, problem: str, rule: Rule) -> ConfigError:
    """The one-line error ``<key>=<value>: <problem> (<what>)``."""
    return ConfigError(f"{key}={show(value)}: {problem}" + (f" ({rule.what})" if rule.what else ""))


# ---------------------------------------------------------------------------- checks

def is_int(v) -> bool:
    return isinstance(v, numbers.Integral) and not isinstance(v, bool)  # numpy integers too (the Python API)


def is_num(v) -> bool:
    return isinstance(v, numbers.Real) and not isinstance(v, bool)


def int_at_least(lo: int) -> Check:
    want = {1: "a positive integer", 0: "an integer >= 0"}.get(lo, f"an integer >= {lo}")
    return lambda v, sec: None if is_int(v) and v >= lo else f"must be {want}"


POSITIVE = int_at_least(1)
NON_NEGATIVE = int_at_least(0)


def number(lo: float | None = None, hi: float | None = None, lo_open: bool = True, hi_open: bool = False) -> Check:
    """A number in the interval; ``None`` bounds are open-ended."""
    if hi is None:
        want = f"a number {'>' if lo_open else '>='} {lo:g}" if lo is not None else "a number"
    else:
        want = f"a number in {'(' if lo_open else '['}{lo:g}, {hi:g}{')' if hi_open else ']'}"

    def check(v, sec):
        ok = is_num(v) and math.isfinite(v)  # NaN and inf are no setting's value
        ok = ok and (lo is None or (v > lo if lo_open else v >= lo))
        ok = ok and (hi is None or (v < hi if hi_open else v <= hi))
        return None if ok else f"must be {want}"

    return check


def optional(check: Check) -> Check:
    """``null`` is fine too."""
    def inner(v, sec):
        problem = None if v is None else check(v, sec)
        return problem and problem.replace("must be", "must be null or", 1)

    return inner


def one_of(*choices: str) -> Check:
    def check(v, sec):
        if isinstance(v, str) and v in choices:
            return None
        close = difflib.get_close_matches(str(v), choices, n=1)
        return f"must be one of {' | '.join(choices)}" + (f"; did you mean {close[0]}?" if close else "")

    return check


def boolean(v, sec):
    return None if isinstance(v, bool) else "must be true or false"


def seed(v, sec):
    return None if is_int(v) and 0 <= v < 2**32 else "must be an integer in [0, 2^32)"


def option_type(check: Check, parse: Callable[[str], Any] = int) -> Callable[[str], Any]:
    """An argparse ``type=`` that parses an option's text with ``parse`` (``auto`` stays text, for the checks of
    :func:`auto_or`) and refuses what ``check`` refuses, in its words: ``argument --steps: 0: must be a positive
    integer``, at the door, not as a traceback once a model is built."""
    def convert(text: str):
        value = text
        if text != "auto":
            with contextlib.suppress(ValueError):  # text that does not parse stays text: the check refuses it
                value = parse(text)
        problem = check(value, None)
        if problem:
            raise argparse.ArgumentTypeError(f"{text}: {problem}")
        return value

    return convert


def auto_or(check: Check) -> Check:
    def inner(v, sec):
        problem = None if v == "auto" else check(v, sec)
        return problem and problem.replace("must be", "must be auto or", 1)

    return inner


def device(*fixed: str | None) -> Check:
    """``fixed`` names (auto, cpu, null), ``cuda`` or ``cuda:N``; CUDA must be there when asked for."""
    def check(v, sec):
        if v is None and None in fixed or v in fixed:
            return None
        if isinstance(v, str) and re.fullmatch(r"cuda(:\d+)?", v):
            import torch  # lazy: `gdr --help`, `import gdr` stay light

            if not torch.cuda.is_available():
                return "CUDA is not available on this machine; use cpu" + (" or auto" if "auto" in fixed else "")
            n = int(v.split(":")[1]) if ":" in v else 0
            if n >= torch.cuda.device_count():
                return f"this machine has {torch.cuda.device_count()} CUDA device(s)"
            return None
        names = ["null" if f is None else f for f in fixed] + ["cuda", "cuda:N"]
        return f"must be one of {' | '.join(names)}"

    return check


ACCELERATORS = ("auto", "cpu", "gpu", "cuda")


def accelerator(v, sec):
    """Lightning's ``accelerator``: a GPU one only where CUDA is (else Lightning fails after the model loads)."""
    if not isinstance(v, str) or v not in ACCELERATORS:
        return one_of(*ACCELERATORS)(v, sec)
    if v in ("gpu", "cuda"):
        import torch  # lazy: `gdr --help`, `import gdr` stay light

        if not torch.cuda.is_available():
            return "CUDA is not available on this machine; use cpu or auto"
    return None


# Lightning 2's precision names (the legacy short forms too)
PRECISIONS = ("bf16-mixed", "32-true", "16-mixed", "bf16-true", "16-true", "64-true", "bf16", "16", "32", "64")


def precision(v, sec):
    """``trainer.precision``: null or auto (bf16-mixed on CUDA, 32-true on the CPU) or a Lightning name."""
    if v is None or v == "auto" or str(v) in PRECISIONS:
        return None
    return "must be null, auto or one of " + " | ".join(PRECISIONS[:6])


def trainer_devices_at(trainer: str) -> Check:
    """Lightning's ``devices`` of the trainer section ``trainer``: auto, -1 (all), a positive count or a list
    of device indices; no more CUDA devices than the machine has when the accelerator is (or becomes) cuda."""
    def check(v, sec):
        if v == "auto" or v == -1:
            return None
        if isinstance(v, (list, ListConfig)) and v and all(is_int(i) and i >= 0 for i in v):
            n = max(v) + 1
        elif is_int(v) and v > 0:
            n = v
        else:
            return "must be auto, -1 (all), a positive integer or a list of device indices"
        acc = get(sec, f"{trainer}.accelerator", "auto")
        if acc in ("gpu", "cuda", "auto") and n > 1 or acc in ("gpu", "cuda"):
            import torch  # lazy: `gdr --help`, `import gdr` stay light

            have = torch.cuda.device_count() if torch.cuda.is_available() else 0
            if have and n > have:
                return f"this machine has {have} CUDA device(s)"
        return None  # no CUDA: accelerator=gpu is refused by its own rule; auto runs n CPU processes

    return check



def path_problem(v, kind: str) -> str | None:
    if not isinstance(v, str) or not v:
        return f"must be the path of a {kind}"
    p = Path(v).expanduser()
    if not p.exists():
        return f"no such {kind}"
    if kind == "file" and p.is_dir():
        return "is a folder, not a file"
    if kind == "folder" and not p.is_dir():
        return "is a file, not a folder"
    return None


def existing(kind: str = "file or folder") -> Check:
    return lambda v, sec: path_problem(v, kind)


def folder_with(*names: str, made_by: str) -> Check:
    """A folder holding every one of ``names`` (the outputs of ``made_by``)."""
    def check(v, sec):
        problem = path_problem(v, "folder")
        if problem:
            return problem
        lacking = [n for n in names if not (Path(v).expanduser() / n).exists()]
        return f"has no {lacking[0]}: not the output folder of {made_by}" if lacking else None

    return check



def field_name(v, sec):
    return None if isinstance(v, str) and v.strip() else "must be a field name (a non-empty string)"



def string_list(*choices: str) -> Check:
    def check(v, sec):
        want = f"must be a list drawn from {', '.join(choices)}"
        if not isinstance(v, (list, ListConfig)):
            return want
        bad = [x for x in v if x not in choices]
        return f"{want} ({bad[0]!r} is not)" if bad else None

    return check


def fractions(v, sec):
    """Train/dev/test shares of a query split (titles): three numbers >= 0 that sum to 1."""
    vals = list(v) if isinstance(v, (list, ListConfig)) else None
    if vals is None or len(vals) != 3 or not all(is_num(x) and x >= 0 for x in vals):
        return "must be three numbers >= 0 for train/dev/test, e.g. [0.8, 0.1, 0.1]"
    total = float(sum(vals))
    if abs(total - 1.0) > 1e-6:
        return f"must sum to 1 (these sum to {total:g}), e.g. [0.8, 0.1, 0.1]"
    return None


def non_empty_list(v, sec):
    return None if isinstance(v, (list, ListConfig)) and len(v) > 0 else "must be a non-empty list"


def subset_of(*choices: str) -> Check:
    """A non-empty list of some of ``choices``."""
    def check(v, sec):
        ok = isinstance(v, (list, ListConfig)) and len(v) > 0 and all(x in choices for x in v)
        return None if ok else f"must be a non-empty list of {', '.join(choices)}, e.g. [{choices[0]}]"

    return check


def integer(v, sec):
    return None if is_int(v) else "must be an integer"


def text_encoding(v, sec):
    """A codec Python knows (utf-8, latin-1, cp1252 ...)."""
    try:
        codecs.lookup(v if isinstance(v, str) else "")
    except LookupError:
        return "must be a text encoding Python knows, e.g. utf-8 or latin-1"
    return None



def get(node, path: str, default=None):
    """``node.a.b`` for ``path="a.b"``; ``default`` when a key on the way is absent or not a section."""
    for part in path.split("."):
        if not isinstance(node, DictConfig) or part not in node:
            return default
        node = node[part]
    return node


def key_of(node, path: str) -> str:
    """The full override key of ``path`` under the section ``node`` (``train.trainer.max_steps`` for
    ``trainer.max_steps`` under ``train``), as a message names another setting; ``path`` where ``node`` is the root or
    no config node."""
    prefix = node._get_full_key(None) if isinstance(node, DictConfig) else ""
    return f"{prefix}.{path}" if prefix else path


def show(v) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return str(v).lower()
    if isinstance(v, (DictConfig, ListConfig)):
        v = OmegaConf.to_container(v)
    if isinstance(v, (list, dict)):
        return str(v).replace("'", "")
    if isinstance(v, str) and _reads_as_number(v):  # the text '8' is no integer: shown so, quoted
        return repr(v)
    return str(v) if str(v) else "''"


def _reads_as_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def matches(node, parts: list[str], done: tuple[str, ...] = ()) -> Iterator[tuple[str, Any]]:
    """(dotted key, value) for every key of ``node`` matching ``parts``; absent keys match nothing."""
    if not parts:
        yield ".".join(done), node
        return
    if node is None:  # an unused optional section, e.g. `data: null` of `gdr index`
        return
    if not isinstance(node, DictConfig):
        where = ".".join(done)
        raise ConfigError(f"{where}={show(node)}: must be a section of keys, such as {where}.{parts[0]}")
    keys = [str(k) for k in node.keys()] if parts[0] == "*" else [parts[0]] if parts[0] in node else []
    for key in keys:
        yield from matches(node[key], parts[1:], done + (key,))


def missing(node, done: str = "") -> Iterator[str]:
    """Dotted keys whose value is Hydra's mandatory ``???``, depth first."""
    if isinstance(node, DictConfig):
        items = [(k, f"{done}{k}") for k in node.keys()]
    else:
        items = [(i, f"{done.rstrip('.')}[{i}]") for i in range(len(node))]
    for key, path in items:
        if OmegaConf.is_missing(node, key):
            yield path
        elif not OmegaConf.is_interpolation(node, key):
            child = node[key]
            if isinstance(child, (DictConfig, ListConfig)):
                yield from missing(child, f"{path}.")


OPT_POSITIVE = optional(POSITIVE)
FILE = optional(existing("file"))


# ---------------------------------------------------------------------------- applying rules

def check_rules(section: DictConfig, rules: Sequence[Rule], prefix: str = "") -> None:
    """Raise :class:`ConfigError` for the first value of ``section`` that one of ``rules`` refuses; the message
    names the key under ``prefix`` (``index.`` for ``gdr run``'s index section)."""
    for rule in rules:
        for key, value in matches(section, rule.key.split(".")):
            problem = rule.check(value, section)
            if problem:
                raise refusal(f"{prefix}.{key}" if prefix else key, value, problem, rule)


def check_values(values: Mapping[str, Any], rules: Sequence[Rule], keys: Mapping[str, str] | None = None,
                 nest: str = "", shown: str = "") -> None:
    """Raise :class:`ConfigError` for the first keyword argument (or dataclass field) in ``values`` that
    ``rules`` refuse, naming the argument (``temperature=-1.0: must be a number > 0 (sampling temperature)``).

    Each value sits at the config key of its rule: ``keys[name]``, else ``<nest>.<name>`` (or ``name``), so the
    rules that compare keys (``leaf_size`` with ``n_clusters``) see the other values. ``shown`` is put before
    the name (``sampling.``)."""
    keys = keys or {}
    tree: dict = {}
    names: dict[str, str] = {}  # config key -> the argument's name
    for name, value in values.items():
        key = keys.get(name) or (f"{nest}.{name}" if nest else name)
        names[key] = name
        *parents, leaf = key.split(".")
        node = tree
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    cfg = OmegaConf.create(tree, flags={"allow_objects": True})
    for rule in rules:
        for key, value in matches(cfg, rule.key.split(".")):
            problem = rule.check(value, cfg)
            if problem:
                top = max((k for k in names if key == k or key.startswith(k + ".")), key=len)
                raise refusal(f"{shown}{names[top]}{key[len(top):]}", value, problem, rule)


# ---------------------------------------------------------------------------- settings fields

# What a setting does to its stage's result, in its field's metadata (``effect``): the stage keys
# (gdr.pipeline's stage inputs, gdr.stages.train's trained_on.json) are derived from it.
EFFECTS = {
    "result": "changes what the stage computes: keys the stage",
    "speed": "changes only speed, I/O or progress output, never the result: no part of the stage's key",
    "resume": "keys the stage, but a resumed `gdr train` may change it (how long and on what it runs, how often it "
              "validates and saves)",
}


def any_value(v, sec):
    """The rule of a setting nothing can be checked of before it is used (a free-form name, a section of a model's
    own keys): every value passes."""
    return None


@dataclass(frozen=True)
class Each:
    """The rule of a mapping setting whose every value is a section of ``cls``'s keys (``cluster.variants``: each
    variant overrides some of ``cluster.gc``): the rules of ``cls``'s fields, under ``<key>.*``."""

    cls: type


def setting(default: Any = None, help: str = "", *, factory: Callable[[], Any] | None = None,
            effect: str | None = None, indexers: tuple[str, ...] = (), rule: "Check | Each | None" = None,
            rule_help: str | None = None):
    """A settings dataclass field: its default (``factory`` for a mutable one), ``help``, what the key means, and
    ``effect``, what it does to the stage's result (one of :data:`EFFECTS`), in its metadata, the one place
    ``--help``, the generated ``conf/stage/*.yaml`` and the stage keys read them from. ``indexers``: the docid
    indexers whose ids a setting of ``gdr index`` decides. ``rule``: the :data:`Check` its value must pass (its
    section's other keys at hand, :func:`rule_of`; :func:`any_value` where nothing can be checked, an :class:`Each`
    for a mapping of sections); ``rule_help``: what the key means at the end of a refusal, in place of ``help``
    (``""``: nothing)."""
    if effect is not None and effect not in EFFECTS:
        raise ValueError(f"effect={effect!r}: must be one of {', '.join(EFFECTS)}")
    metadata = {"help": help, "effect": effect, "indexers": tuple(indexers), "rule": rule, "rule_help": rule_help}
    if factory is not None:
        return field(default_factory=factory, metadata=metadata)
    return field(default=default, metadata=metadata)


def same_setting(cls, name: str, help: str | None = None, *, effect: str | None = None,
                 indexers: tuple[str, ...] = (), rule: "Check | Each | None" = None, rule_help: str | None = None):
    """A field that is ``cls``'s setting ``name`` in another section (the flat clustering's ``alpha`` is generative
    clustering's): its default (or default factory), help, effect and rule read from there, ``help``, ``effect``,
    ``rule`` and ``rule_help`` in place of theirs (a new ``help`` is the refusal's too, unless ``rule_help`` is
    given)."""
    f = cls.__dataclass_fields__[name]
    said = f.metadata.get("help", "") if help is None else help
    effect = f.metadata.get("effect") if effect is None else effect
    if rule_help is None and help is None:  # a new help is the refusal's too
        rule_help = f.metadata.get("rule_help")
    rule = f.metadata.get("rule") if rule is None else rule
    same = dict(effect=effect, indexers=indexers, rule=rule, rule_help=rule_help)
    if f.default_factory is not NO_FIELD_DEFAULT:
        return setting(help=said, factory=f.default_factory, **same)
    return setting(f.default, said, **same)


def effect_of(f) -> str | None:
    """The :data:`EFFECTS` entry a settings field declares (None: it declares none)."""
    return f.metadata.get("effect")


def fields_rules(cls, prefix: str = "", keys: Mapping[str, str] | None = None,
                 sections: Callable[[type, str], tuple] = lambda cls, name: ()) -> tuple[Rule, ...]:
    """The rules the fields of the settings dataclass ``cls`` declare, keyed ``<prefix><name>`` (or ``keys[name]``),
    those of a field's ``sections`` (the dataclasses whose fields are its keys) and of an :class:`Each` under it;
    :func:`any_value` checks nothing and is left out."""
    out: list[Rule] = []
    for f in fields(cls):
        key = (keys or {}).get(f.name) or prefix + f.name
        check, inner = f.metadata.get("rule"), sections(cls, f.name)
        if isinstance(check, Each):
            inner, key = (check.cls,), key + ".*"
        for section in inner:
            out += fields_rules(section, key + ".", sections=sections)
        rule = rule_of(f, key)
        if rule is not None and rule.check is not any_value:
            out.append(rule)
    return tuple(out)


def rule_of(f, key: str) -> Rule | None:
    """The :class:`Rule` a settings field declares (``rule=``), at the dotted config ``key``; what it says is the
    field's ``rule_help``, else its help. None: it declares none, or an :class:`Each` (see :func:`fields_rules`)."""
    check = f.metadata.get("rule")
    if check is None or isinstance(check, Each):
        return None
    said = f.metadata.get("rule_help")
    return Rule(key, check, f.metadata.get("help", "") if said is None else said)


@dataclass(frozen=True)
class GroupOption:
    """One option of a config group (``conf/<group>/<name>.yaml``) written from a dataclass: the leading comment
    ``about`` it, the ``keys`` it holds (in the dataclass's order), the ``values`` it sets in place of the defaults
    and the ``help`` it gives a key in place of the field's."""

    about: str
    keys: tuple[str, ...]
    values: Mapping[str, Any] = field(default_factory=dict)
    help: Mapping[str, str] = field(default_factory=dict)
