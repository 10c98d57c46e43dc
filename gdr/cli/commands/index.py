"""``gdr index`` (build prefix-code docids: :func:`gdr.stages.index.build_index`) and ``gdr index add``
(grow a GC index: :func:`gdr.stages.index_add.add_to_index`)."""
from __future__ import annotations

import shlex
from pathlib import Path

from gdr.cli.common import next_command, override_keys
from gdr.config import command_config, save_config, to_container
from gdr.data import corpus_from_config
from gdr.guard import claim_out
from gdr.rerun import data_overrides, saved_data
from gdr.stages.index import build_index
from gdr.stages.index_add import add_to_index, next_steps
from gdr.stages.settings import IndexSettings
from gdr.upgrade import refuse_format_0_gc_index
from gdr.validate import validate


def _compose(argv: list[str]):
    cfg = command_config("index", argv)
    if cfg is not None:
        validate("index", cfg)
    return cfg, cfg is None


def index_main(argv: list[str]) -> int:
    argv = list(argv)
    if argv and argv[0] == "add":
        return add_main(argv[1:])
    cfg, show = _compose(argv)
    if show:
        return 0
    claim_out("index", cfg)
    c = to_container(cfg)
    data = c.pop("data", None)
    settings = IndexSettings.from_config({k: v for k, v in c.items() if k not in ("run", "out", "index")})

    def corpus():
        return corpus_from_config(data)

    build_index(settings, cfg.out, corpus=corpus if data else None, run=cfg.run)
    save_config(cfg, cfg.out)
    print(open(Path(cfg.out) / "summary.txt", encoding="utf-8").read(), end="")
    docids = Path(cfg.out) / "docids.tsv"
    own = [f"docids={docids}", f"out_dir={cfg.out}-train"]
    run_data = saved_data(cfg.run) if not data and cfg.get("run") else None  # GC on a P: the corpus that P scored
    train = (" ".join(["gdr", "train", *data_overrides("train", run_data), *map(shlex.quote, own)]) if run_data
             else next_command(argv, "train", *own))
    print(f"next: train a retriever on these docids, `{train}`")
    return 0


_ADD_KEYS = ("run", "index", "out", "gc.chunk_rows", "plot", "progress")  # what gdr index add reads


def add_main(argv: list[str]) -> int:
    """``gdr index add run=<P-matrix run of new documents> index=<GC index folder> [out=<folder for a grown copy>]``."""
    unused = [k for k in override_keys([a for a in argv if not a.startswith("-")]) if k not in _ADD_KEYS]
    if unused:  # the index's own K, c, seed and method decide where documents go
        raise ValueError(f"gdr index add: {unused[0]}= is a key of building an index (gdr index), which an add keeps "
                         f"as the index has it; an add takes {', '.join(k + '=' for k in _ADD_KEYS)}")
    cfg, show = _compose(list(argv))
    if show:
        return 0
    if not cfg.run or not cfg.index:
        raise ValueError("usage: gdr index add run=<P-matrix run of the new documents> index=<GC index folder> "
                         "[out=<a new folder: grow a copy of the index there>]")
    claim_out("index" if cfg.out else "index add", cfg)  # the folder that is rewritten: the copy, or the index
    refuse_format_0_gc_index(cfg.index)

    res = add_to_index(cfg.index, cfg.run, chunk_rows=int(cfg.gc.chunk_rows), plot=bool(cfg.plot), out=cfg.out)
    grown = cfg.out or cfg.index
    print(f"added {len(res.codes)} documents to {grown} ({res.n_redirected} redirected from full leaves, "
          f"{res.n_new_leaves} new leaves)")
    print(next_steps(grown, cfg.run))
    return 0
