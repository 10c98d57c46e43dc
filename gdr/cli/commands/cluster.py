"""``gdr cluster``: one command from a dataset to a clustering result.

Samples queries and scores P (reusing a finished P matrix whose manifest matches; :mod:`gdr.stages.score`),
then clusters and evaluates it (:func:`gdr.stages.cluster.cluster_run`) into the out folder.
"""
from __future__ import annotations

import logging
from pathlib import Path

from omegaconf import OmegaConf

from gdr.cli.common import compose, lm_settings, section
from gdr.config import save_config, to_container
from gdr.data import corpus_from_config
from gdr.io import what_differs
from gdr.stages.cluster import cluster_run
from gdr.stages.sample import sample_queries
from gdr.stages.score import queries_of_run, score_queries
from gdr.stages.settings import ClusterSettings, SampleSettings, ScoreSettings
from gdr.store import load_run, score_folder
from gdr.validate import check_corpus

log = logging.getLogger(__name__)


def _say_replaced(saved: Path, now: dict) -> None:
    """A clustering of other settings in the folder is replaced (its P is reused): said, naming what changed."""
    if not saved.is_file():
        return
    changed = what_differs(to_container(OmegaConf.load(saved)), {"cluster": now}, ["cluster"])
    if changed:
        log.warning("%s: replacing the clustering of other settings (%s); P and its queries are reused",
                    saved.parent, changed)


def cluster_main(argv: list[str]) -> int:
    cfg = compose("cluster", argv)
    out = Path(cfg.out)
    corpus = corpus_from_config(to_container(cfg.data))
    c = ClusterSettings.from_config(section(cfg, "cluster"))
    if corpus.labels is None and c.n_clusters is None:
        raise SystemExit(f"corpus {corpus.name!r} has no labels: set cluster.n_clusters=K")
    check_corpus("cluster", cfg, corpus)  # before sampling and scoring, naming the full key
    suffix = f".{'-'.join(c.restrict_labels)}" if c.restrict_labels else ""
    _say_replaced(out / f"cluster{suffix}.config.yaml", section(cfg, "cluster"))
    out.mkdir(parents=True, exist_ok=True)
    lm = lm_settings(cfg).build()
    # an older run's unchanged queries and P entries (gdr score's reuse_from, else queries_from's run)
    reuse = cfg.get("reuse_from") or cfg.get("queries_from")
    reuse = score_folder(reuse) if reuse else None
    if cfg.get("queries_from"):  # the queries of another run (gdr score's queries_from), not sampled
        queries = queries_of_run(lm, cfg.queries_from, out)
    else:
        queries = sample_queries(lm, corpus, out, SampleSettings.from_config(section(cfg, "sample")),
                                 progress=cfg.progress, reuse_from=reuse)
    score_queries(lm, corpus, queries, out, ScoreSettings.from_config(section(cfg, "score")), progress=cfg.progress,
                  reuse_from=reuse)
    del lm
    result, table = cluster_run(corpus, load_run(out), out, c, device=str(cfg.device))
    save_config(cfg, out, f"cluster{suffix}.config.yaml")
    print()
    if result["labels"] is not None:
        print(table)
    for kk, desc in enumerate(result["methods"]["GC"]["descriptions"]):
        print(f"cluster {kk}: " + " | ".join(q for q, _ in desc[:3]))
    print(f"\nresults in {out}")
    print(f"next: build GC docids from its P, `gdr index method=gc run={out} out={out}-gc`")
    return 0
