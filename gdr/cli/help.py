"""``gdr <command> --help``: generated from the command's composed config, its fields' help and its validation rules.

Nothing here is a second copy of the settings: the defaults come from composing ``conf/<command>.yaml``,
the meaning of each key from its field's metadata (:func:`gdr.stages.settings.generated_help`: every key of the
generated ``conf/stage/*.yaml`` and of the config groups' options ``conf/data/<name>.yaml``,
``conf/model/<name>.yaml``, the stage settings, the commands' own keys and the groups' alike; else the rule's
description in :mod:`gdr.validate`), and the allowed values from the rule itself (its message for a value no
rule accepts: ``must be a positive integer`` becomes ``a positive integer``). The config groups and their options
are the folders and files of ``conf/`` the composition chose from; the command YAML's leading comment block is the
command's description.
"""
from __future__ import annotations

import textwrap
from pathlib import Path

import yaml
from omegaconf import DictConfig, OmegaConf

from gdr.config import conf_dir, flat_leaves
from gdr.rules import get, show
from gdr.stages.command_keys import PLAN_DEVICE
from gdr.stages.settings import generated_help
from gdr.validate import TABLES

__all__ = ["command_help", "CONFIG_OF"]

# command -> the conf/<name>.yaml it composes (None: no config)
CONFIG_OF = {"sample": "sample", "score": "score", "cluster": "cluster", "index": "index", "train": "train",
             "evaluate": "evaluate", "search": "evaluate", "run": "run", "qg": "qg", "bench": None, "plan": "run"}
USAGE = {
    "search": 'gdr search "query" ["another query" ...] run_dir=<gdr train out_dir> [k=10] [--json]',
    "index": "gdr index [key=value ...]   |   gdr index add run=<P-matrix run> index=<GC index folder>",
    "bench": "gdr bench {BENCHES} [options]   (gdr bench <name> --help: the options of each)",
    "evaluate": "gdr evaluate [key=value ...] [--allow-train-split]   (--allow-train-split: score on the split "
                "the retriever was trained on, as metrics.md then says)",
    "run": "gdr run [+experiment=<name>] [key=value ...]",
    "plan": "gdr plan [+experiment=<name>] [key=value ...] device=h200|h100|a100|cpu [gpus=N]",
}
_SKIP = ("model_presets", "hydra")  # tables of presets, not settings one sets one key at a time
_HIDDEN = {"plan": ("device",)}  # the run's own device= is not what gdr plan's device= names (PLAN_OWN)
# `gdr plan`'s own keys and flags (gdr/cli/commands/plan.py), listed before the settings of the run it plans
PLAN_OWN = [
    (f"device = {PLAN_DEVICE}", "the device the run is planned for: h200 | h100 | a100 | cpu (not the run's "
                                "device=)"),
    ("gpus = 1", "GPUs of that kind the run uses"),
    ("free_gb = null", "GB of device memory free when training starts (resolves the retrievers' auto batch and how "
                       "many train at once); null = the device's own"),
    ("--recalibrate", "time this machine's CPU batches again before planning (gdr/calibrate.py)"),
    ("--check RUN_DIR", "a finished run's measured seconds beside its plan (device= from run.json)"),
    ("--write-factors", "with --check: keep the measured / predicted factors for later plans"),
]


class _Invalid:
    """A value no rule accepts: what a rule says about it is the rule's description of the valid values."""

    def __repr__(self) -> str:
        return "?"


def header(path: Path) -> str:
    """The leading ``#`` comment block of a YAML file (without Hydra's ``# @package`` line)."""
    lines = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.startswith("#"):
            break
        if not line.startswith("# @package"):
            lines.append(line[1:].strip())
    return "\n".join(lines).strip()


def _included(path: Path) -> list[str]:
    """The configs a command YAML's ``defaults`` include (``score``, ``stage/train@train``), not its group choices
    (``data: bbc``) nor ``_self_``."""
    raw = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    return [d for d in raw.get("defaults", []) if isinstance(d, str) and d != "_self_"]


def _sources(cdir: Path, name: str, choices: dict[str, str]) -> list[tuple[Path, str]]:
    """The YAML files a composition of ``conf/<name>.yaml`` read, each with the package it lands in: the primary
    config, the configs it includes (the first to give a key's help wins), then the chosen group options."""
    out: list[tuple[Path, str]] = []
    todo = [(name, "")]
    while todo:
        cur, package = todo.pop(0)
        path = cdir / f"{cur}.yaml"
        if not path.exists() or any(p == path for p, _ in out):
            continue
        out.append((path, package))
        for d in _included(path):  # `- score`, `- stage/train@train`
            sub, _, at = d.partition("@")
            todo.append((sub, package if at in ("", "_here_") else at))
    for group, choice in choices.items():
        if choice is None or group.startswith("hydra") or group in ("experiment",):
            continue
        grp, _, package = group.partition("@")
        package = grp.replace("/", ".") if not package else "" if package in ("_here_", "_global_") else package
        path = cdir / grp / f"{choice}.yaml"
        if path.exists():
            out.append((path, package))
    return out


def _leaves(node: dict) -> dict:
    """Dotted key -> value of every setting, without the preset tables (``model_presets``) and ``hydra``."""
    return {k: v for k, v in flat_leaves(node).items() if k.split(".")[0] not in _SKIP}


def _rules(command: str, cfg: DictConfig) -> dict[str, tuple[str, str]]:
    """dotted key -> (the rule's description, the valid values as the rule states them)."""
    out: dict[str, tuple[str, str]] = {}
    for prefix, rules in TABLES.get(command, []):
        sec = get(cfg, prefix) if prefix else cfg
        for rule in rules:
            try:
                said = rule.check(_Invalid(), sec) or ""
            except Exception:  # a rule that needs a real value to say anything
                said = ""
            said = said.split(";")[0]
            valid = said[len("must be "):] if said.startswith("must be ") else ""
            out[f"{prefix}.{rule.key}" if prefix else rule.key] = (rule.what, valid)
    return out


def _matches(key: str, pattern: str) -> bool:
    a, b = key.split("."), pattern.split(".")
    return len(a) == len(b) and all(q in ("*", k) for k, q in zip(a, b))


def _group_choices(cdir: Path, overrides: list[str]) -> list[str]:
    """The overrides that choose a config group's option (``data=trec``, ``+experiment=bbc``): what the settings
    listed depend on; other overrides (values) are left to the command itself."""
    out = []
    for o in overrides:
        key, eq, _ = o.lstrip("+~").partition("=")
        if eq and "." not in key and (cdir / key.split("@")[0]).is_dir():
            out.append(o)
    return out


def _compose(cdir: Path, name: str, chosen: list[str]) -> tuple[DictConfig, list[str], str | None]:
    """(``conf/<name>.yaml`` composed with the group choices ``chosen`` and Hydra's own config, the choices it
    took, a line naming a choice that does not exist, after which the defaults are composed instead)."""
    from hydra import compose, initialize_config_dir  # lazy: `gdr --help`, `import gdr` stay light
    from hydra.core.global_hydra import GlobalHydra  # lazy: `gdr --help`, `import gdr` stay light
    from hydra.errors import HydraException  # lazy: `gdr --help`, `import gdr` stay light

    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(cdir), version_base=None):
        try:
            return compose(config_name=name, overrides=chosen, return_hydra_config=True), chosen, None
        except HydraException as e:
            note = f"{' '.join(chosen)}: {str(e).splitlines()[0]} (the defaults follow)"
            return compose(config_name=name, return_hydra_config=True), [], note


def _plan_own_lines() -> list[str]:
    lines = ["", "gdr plan's own keys and flags:"]
    for head, text in PLAN_OWN:
        body = textwrap.wrap(text, width=110 - 46)
        lines += [f"  {head:<44}{body[0]}", *(" " * 46 + x for x in body[1:])]
    return lines


def command_help(command: str, summary: str, overrides: list[str] | tuple[str, ...] = ()) -> str:
    """The text of ``gdr <command> --help``; ``summary``: the command's one-line description; ``overrides``: the
    command line's other arguments, whose group choices (``data=trec``) pick the settings listed, with their
    defaults and meanings."""
    name = CONFIG_OF.get(command)
    usage = USAGE.get(command, f"gdr {command} [key=value ...]")
    if command == "bench":
        from gdr.bench import BENCHES  # lazy: `gdr --help`, `import gdr` stay light

        usage = usage.replace("{BENCHES}", "{" + "|".join(BENCHES) + "}")
    lines = [f"usage: {usage}", "", f"gdr {command}: {summary}."]
    if name is None:
        return "\n".join(lines)
    cdir = conf_dir()
    described = header(cdir / f"{name}.yaml")
    if described:
        lines += ["", *described.splitlines()]
    full, chosen, note = _compose(cdir, name, _group_choices(cdir, list(overrides)))
    lines += ["", note] if note else []
    choices = dict(OmegaConf.to_container(full.hydra.runtime.choices))
    cfg = OmegaConf.masked_copy(full, [k for k in full.keys() if k != "hydra"])
    comments: dict[str, str] = {}
    for path, package in _sources(cdir, name, choices):
        rel = path.relative_to(cdir).as_posix()
        if path.parent == cdir:
            continue  # a command YAML: a defaults list, no keys of its own
        for key, text in generated_help(rel).items():  # a generated file: its keys' help is its fields' metadata
            comments.setdefault(f"{package}.{key}" if package else key, text)
    rules = _rules("search" if command == "search" else command, cfg)

    groups = [(g.split("@")[0], c) for g, c in choices.items() if not g.startswith("hydra") and c is not None
              and (cdir / g.split("@")[0]).is_dir() and not g.startswith(("stage/", "experiment"))]
    if command == "run":
        groups.append(("experiment", choices.get("experiment")))
    if groups:
        lines += ["", "config groups (choose with group=<option>; an experiment with +experiment=<name>):"]
        for grp, choice in groups:
            options = sorted(p.stem for p in (cdir / grp).glob("*.yaml"))
            mark = "(chosen)" if any(c.lstrip("+~").split("=")[0].split("@")[0] == grp for c in chosen) else "(default)"
            shown = " | ".join(f"{o} {mark}" if o == choice else o for o in options)
            lines.append(f"  {('+' if grp == 'experiment' else '') + grp:<12} {shown}")

    lines += _plan_own_lines() if command == "plan" else []
    lines += ["", "settings (key = default: meaning; the values the check before any work accepts):"]
    raw = OmegaConf.to_container(cfg, resolve=False)
    hidden = _HIDDEN.get(command, ())
    for key, value in ((k, v) for k, v in _leaves(raw).items() if k not in hidden):
        meaning = comments.get(key, "")
        rule = next((r for pat, r in rules.items() if _matches(key, pat)), None)
        if rule:
            meaning = meaning or rule[0]
        if not meaning and not rule:
            continue  # neither commented nor checked: see --cfg
        valid = rule[1] if rule else ""
        text = " ".join(x for x in (meaning, f"[{valid}]" if valid and valid not in meaning else "") if x)
        head = f"  {key} = {show(value)}"
        if len(head) <= 44:
            body = textwrap.wrap(text, width=110 - 46) or [""]
            lines.append(f"{head:<46}{body[0]}".rstrip())
            lines += [" " * 46 + b for b in body[1:]]
        else:
            lines.append(head)
            lines += [" " * 46 + b for b in textwrap.wrap(text, width=110 - 46)]
    lines += ["", f"`gdr {command} --cfg [key=value ...]` prints the whole composed config; overrides use Hydra's "
                  "grammar (a new key needs a leading +).",
              "Every setting is checked before any model or corpus loads; an error names the key and the fix."]
    if command != "search":
        lines += ["SIGTERM / Ctrl-C stop within seconds with one line and exit 143 / 130; rerun the same command "
                  "to resume."]
    return "\n".join(lines)
