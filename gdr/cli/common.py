"""What every command does before it calls the library: compose, validate, lock the out folder, and turn
the composed config's sections into the stages' settings."""
from __future__ import annotations

import contextlib
import shlex
import sys
from pathlib import Path
from typing import Iterator, Sequence

from hydra.core.override_parser.overrides_parser import OverridesParser

from gdr.config import command_config, save_config, to_container
from gdr.data import corpus_from_config
from gdr.data.splits import split_queries
from gdr.guard import LOCK_FILE, claim_out
from gdr.stages.settings import LMSettings
from gdr.validate import validate

__all__ = ["compose", "config_saved", "corpus_and_queries", "lm_settings", "section", "override_keys", "in_section",
           "without_section", "next_command"]


def compose(name: str, argv: list[str], lock: str | None = None, before_claim=None):
    """The validated config of command ``name`` with its out folder claimed (``gdr.guard``); ``--cfg``
    prints it and exits 0. ``lock``: the name the lock is taken under (default ``name``); ``before_claim``:
    a check of the inputs (``cfg -> None``, raising) that runs before the out folder is made."""
    cfg = command_config(name, argv)
    if cfg is None:  # --cfg: printed
        sys.exit(0)
    validate(name, cfg)
    if before_claim is not None:
        before_claim(cfg)
    claim_out(lock or name, cfg)  # the out folder: writable, and this process's alone (gdr.guard)
    return cfg


def section(cfg, key: str, **overrides) -> dict:
    """A config section as a plain dict (for ``<Settings>.from_config``)."""
    return {**to_container(cfg[key]), **overrides}


def lm_settings(cfg):
    """The query generator of a composed config (``model:``, ``device``, ``threads``)."""
    return LMSettings.from_config(to_container(cfg.model), device=str(cfg.get("device") or LMSettings.device),
                                threads=cfg.get("threads"))


@contextlib.contextmanager
def config_saved(cfg, out: str | Path, name: str = "config.yaml", write: bool = True) -> Iterator[None]:
    """Save ``cfg`` into ``out`` as ``name`` around a command's work that may be refused (a folder of other inputs):
    at once only into a new folder (nothing in it but its lock), so that it says what it is being built from, and
    again when the work is done. A refused command leaves the folder's configs as they were, still those its files
    were made with. ``write``: False on a process that writes no config (a launched rank > 0)."""
    Path(out).mkdir(parents=True, exist_ok=True)
    if write and all(p.name == LOCK_FILE for p in Path(out).iterdir()):
        save_config(cfg, out, name)
    yield
    if write:
        save_config(cfg, out, name)


def corpus_and_queries(cfg):
    """``gdr train`` / ``gdr evaluate``: make ``out_dir``, then load the corpus and the query split the command names.
    Returns (config as a dict, out folder, corpus, queries or None)."""
    c = to_container(cfg)
    out = Path(c["out_dir"])
    out.mkdir(parents=True, exist_ok=True)
    corpus = corpus_from_config(c["data"])
    qs = split_queries(c["queries"], c["data"], set(corpus.doc_ids), c["data"].get("docs_tsv"))
    return c, out, corpus, qs


def override_keys(argv: Sequence[str]) -> list[str]:
    """The key each Hydra override of ``argv`` sets, in order (``+model.name=x`` -> ``model.name``, ``data=bbc``
    -> ``data``, ``~seed`` -> ``seed``), read by Hydra's own overrides parser (quoted values may hold ``=``)."""
    return [o.key_or_group for o in OverridesParser.create().parse_overrides(list(argv))]


def in_section(key: str, section: str) -> bool:
    """Whether override key ``key`` sets ``section`` or something inside it (``data.path`` is in ``data``)."""
    return key == section or key.startswith(section + ".")


def without_section(argv: Sequence[str], section: str) -> list[str]:
    """``argv`` without the overrides that set something in ``section``."""
    return [a for a, k in zip(argv, override_keys(argv)) if not in_section(k, section)]


def next_command(argv: Sequence[str], command: str, *extra: str, keep: Sequence[str] = ("data",)) -> str:
    """The ``gdr <command> ...`` line to type next, as a printed ``next:`` line shows it: the overrides of ``argv``
    that set a section of ``keep`` (the corpus: ``data=r5 data.n_docs=800``), else ``data=<your corpus>`` where
    ``data`` is kept but none was given, then ``extra`` (``key=value``), each shell-quoted."""
    kept = [(a, k) for a, k in zip(argv, override_keys(argv)) if any(in_section(k, s) for s in keep)]
    corpus = [] if "data" not in keep or any(in_section(k, "data") for _, k in kept) else ["data=<your corpus>"]
    return " ".join(["gdr", command, *corpus, *(shlex.quote(a) for a, _ in kept), *map(shlex.quote, extra)])
