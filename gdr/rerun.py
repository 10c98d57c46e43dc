"""The ``gdr <command> ...`` line that redoes a folder's work with the settings it was made with, and the
composition of ``conf/`` it needs (Hydra's compose API, imported when a config is composed).

The ground floor of gdr's advice: kernels, the store and the stages put a :class:`RerunCommand` in their error
messages, worked out only when the message is formatted; it imports nothing of gdr but :mod:`gdr.paths`.
"""
from __future__ import annotations

import copy
import functools
import logging
import os
import re
import shlex
from pathlib import Path
from typing import Sequence

from omegaconf import DictConfig, OmegaConf

from gdr.paths import shipped_dir

__all__ = ["conf_dir", "load_config", "rerun_command", "RerunCommand", "override_value", "flat_leaves", "saved_data",
           "data_overrides"]

log = logging.getLogger(__name__)


def conf_dir() -> Path:
    """The ``conf/`` folder: ``$GDR_CONF_DIR``, else the wheel's copy, else the checkout's ``conf/``
    (:func:`gdr.paths.shipped_dir`)."""
    return shipped_dir("conf")


def load_config(name: str, overrides: Sequence[str] = ()) -> DictConfig:
    """Compose ``conf/<name>.yaml`` with command-line ``overrides`` (Hydra grammar).

    A composition takes Hydra 0.2-0.4 s (it reads and merges a dozen YAML files), and one command composes the same
    config several times (its own, the validation's, each error's rerun advice); so each result is kept, keyed by
    the folder, the state of every YAML file in it (path, size, modification time: an edited file composes
    afresh) and the overrides, and handed out as a deep copy (~0.01 s) that the caller may change."""
    cdir = conf_dir()
    if not (cdir / f"{name}.yaml").exists():
        raise FileNotFoundError(f"no config {cdir / (name + '.yaml')}")
    return copy.deepcopy(_composed(str(cdir), _conf_state(cdir), name, tuple(overrides)))


def _conf_state(cdir: Path) -> tuple:
    """(relative path, size, modification time in ns) of every YAML file under ``cdir``, sorted."""
    out = []
    for root, _, files in os.walk(cdir):
        for f in files:
            if f.endswith(".yaml"):
                st = os.stat(os.path.join(root, f))
                out.append((os.path.relpath(os.path.join(root, f), cdir), st.st_size, st.st_mtime_ns))
    return tuple(sorted(out))


@functools.lru_cache(maxsize=64)
def _composed(cdir: str, state: tuple, name: str, overrides: tuple[str, ...]) -> DictConfig:
    """:func:`load_config`'s composition (``state`` is only its key: the folder's files as they were)."""
    from hydra import compose, initialize_config_dir  # lazy: `gdr --help`, `import gdr` stay light
    from hydra.core.global_hydra import GlobalHydra  # lazy: `gdr --help`, `import gdr` stay light

    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=cdir, version_base=None):
        cfg = compose(config_name=name, overrides=list(overrides))
    OmegaConf.resolve(cfg)
    return cfg


# ------------------------------------------------------------------------------------- advice that works
# The command -> its conf/<name>.yaml, the option naming its output folder, the config it saves there.
_SAVED = {"sample": ("sample", "out", "sample.config.yaml"), "score": ("score", "out", "score.config.yaml"),
          "cluster": ("cluster", "out", "cluster.config.yaml"), "index": ("index", "out", "config.yaml"),
          "train": ("train", "out_dir", "config.yaml")}
# a key only each command's saved config holds: a config file of that name saved by another command is not read
_OWN_KEY = {"sample": "sample", "score": "score", "cluster": "cluster", "index": "method", "train": "docids"}


def _saved_config(command: str, folder: Path) -> dict | None:
    """The config ``gdr <command>`` saved in ``folder`` (None: none, unreadable, or another command's)."""
    path = folder / _SAVED[command][2]
    if not path.is_file():
        return None
    try:
        saved = OmegaConf.to_container(OmegaConf.load(path), resolve=True)
    except Exception as e:  # an unreadable saved config: no command from it, not a second error
        log.debug("%s: %s", path, e)
        return None
    return saved if isinstance(saved, dict) and _OWN_KEY[command] in saved else None
_PLAIN = re.compile(r"[A-Za-z_./~-][\w./~-]*")
_OTHER_TYPE = re.compile(r"(?i)(null|true|false|nan|[-+]?inf|[-+]?[\d._]+(e[-+]?\d+)?)")


def override_value(v) -> str:
    """``v`` in Hydra's override grammar (strings that would parse as another type, or hold other
    characters, are quoted)."""
    if v is None:
        return "null"
    if isinstance(v, bool):
        return str(v).lower()
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, (list, tuple)):
        return "[" + ",".join(override_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ",".join(f"{k}:{override_value(x)}" for k, x in v.items()) + "}"
    v = str(v)
    if _PLAIN.fullmatch(v) and not _OTHER_TYPE.fullmatch(v):
        return v
    return "'" + v.replace("\\", "\\\\").replace("'", "\\'") + "'"


def flat_leaves(d: dict, prefix: str = "") -> dict:
    """``{"a": {"b": 1}, "c": []}`` -> ``{"a.b": 1, "c": []}`` (lists and empty mappings are values)."""
    out = {}
    for k, v in d.items():
        if isinstance(v, dict) and v:
            out.update(flat_leaves(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def rerun_command(command: str, folder: str | os.PathLike) -> str:
    """The ``gdr <command> ...`` line that redoes the work of ``folder`` with the settings it was made with.

    The settings come from the config the command saved there (``gdr run``'s stage folders hold one too):
    every key whose value differs from ``conf/<command>.yaml``'s default becomes an override, keys of the
    command's sections that the default lacks a ``+key=`` one; the output option points at ``folder``.
    Without a saved config of that command: ``gdr <command> <out option>=<folder>`` (callers that cannot
    vouch for that give :class:`RerunCommand` a ``fallback``)."""
    name, option, _ = _SAVED[command]
    folder = Path(folder)
    saved_cfg = _saved_config(command, folder)
    args = [] if saved_cfg is None else _overrides(name, saved_cfg, skip=option)
    args.append(f"{option}={folder}")
    return " ".join(["gdr", command, *(shlex.quote(a) for a in args)])


def _overrides(name: str, saved: dict, skip: str | None = None) -> list[str]:
    """The overrides that turn ``conf/<name>.yaml`` into ``saved``: the corpus's ``data=`` group first, then every
    key of ``saved`` (but ``skip``) whose value differs from the default, ``+key=`` for one the default lacks."""
    args: list[str] = []
    base = OmegaConf.to_container(load_config(name), resolve=True)
    group = _data_group(saved.get("data"), base.get("data"))
    if group is not None:  # the corpus's config group first (`gdr index`'s is null): its keys are compared
        args.append(f"data={group}")
        base = OmegaConf.to_container(load_config(name, args), resolve=True)
    flat = flat_leaves(base)
    for key, value in flat_leaves(saved).items():
        if key in (skip, "hydra") or key.split(".")[0] == "hydra":
            continue
        if key in flat:
            if value != flat[key]:
                args.append(f"{key}={override_value(value)}")
        elif isinstance(base.get(key.split(".")[0]), dict):
            args.append(f"+{key}={override_value(value)}")
    return args


def saved_data(folder: str | os.PathLike) -> dict | None:
    """The ``data:`` section of the config a gdr command saved in ``folder`` (``gdr index``, ``score``, ``cluster``,
    ``sample`` or ``train``; the first that names a corpus; an index made from ``run=`` that run's), or None."""
    for command in ("index", "score", "cluster", "sample", "train"):
        saved = _saved_config(command, Path(folder))
        if saved is not None and isinstance(saved.get("data"), dict) and saved["data"].get("name"):
            return saved["data"]
        if command == "index" and saved is not None and saved.get("run"):  # a GC index made from a P folder
            return saved_data(saved["run"])
    return None


def saved_model(folder: str | os.PathLike) -> dict | None:
    """The ``model:`` section (the query generator) of the config that sampled and scored the P in ``folder``
    (``gdr score``, ``cluster`` or ``sample``, or a ``gdr run`` score stage's), or None."""
    for command in ("score", "cluster", "sample"):
        saved = _saved_config(command, Path(folder))
        if saved is not None and isinstance(saved.get("model"), dict):
            return saved["model"]
    return None


def data_overrides(command: str, data: dict) -> list[str]:
    """The overrides of ``gdr <command>`` (``score``, ``train`` ...) that load the corpus ``data`` (a saved config's
    ``data:`` section, :func:`saved_data`), shell-quoted."""
    return [shlex.quote(a) for a in _overrides(_SAVED[command][0], {"data": data})]


def _data_group(saved, default) -> str | None:
    """The ``data=`` group a rebuilt command needs: none when the command's default group holds the saved corpus's
    keys; else the group named like the saved corpus, or ``beir`` for a folder (``data.name=<folder>``)."""
    if not isinstance(saved, dict):
        return None
    name = str(saved.get("name"))
    own = (conf_dir() / "data" / f"{name}.yaml").is_file()
    if isinstance(default, dict) and (not own or default.get("name") == name):
        return None
    return name if own else "beir"


class RerunCommand:
    """:func:`rerun_command`, worked out only when the message holding it is formatted (an error path), since
    composing the command's default config takes a Hydra composition."""

    def __init__(self, command: str, folder: str | os.PathLike, template: str = "{}", fallback: str | None = None):
        self.args = (command, folder)
        self.template = template  # the text around the command: "run `{}` (it re-scores what is damaged)"
        self.fallback = fallback  # the text when the folder holds no saved config (no command can be rebuilt)

    def __str__(self) -> str:
        command, folder = self.args
        if self.fallback is not None and _saved_config(command, Path(folder)) is None:
            return self.fallback
        return self.template.format(rerun_command(command, folder))

    __format__ = lambda self, spec: format(str(self), spec)  # noqa: E731
