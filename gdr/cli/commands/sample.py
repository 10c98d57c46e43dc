"""``gdr sample`` and ``gdr score``: compose the config, call :mod:`gdr.stages.sample` / :mod:`gdr.stages.score`."""
from __future__ import annotations

import logging
from pathlib import Path

from gdr.cli.common import (
    compose,
    config_saved,
    in_section,
    lm_settings,
    next_command,
    override_keys,
    section,
    without_section,
)
from gdr.config import to_container
from gdr.data import corpus_from_config
from gdr.device import dist_info
from gdr.rerun import saved_model
from gdr.stages import score
from gdr.stages.doc_queries import sample_doc_queries
from gdr.stages.sample import sample_queries
from gdr.stages.settings import SampleSettings, ScoreSettings
from gdr.store import score_folder
from gdr.validate import check_corpus

log = logging.getLogger(__name__)


def sample_main(argv: list[str]) -> int:
    cfg = compose("sample", argv)
    corpus = corpus_from_config(to_container(cfg.data))
    lm = lm_settings(cfg).build()
    s = SampleSettings.from_config(section(cfg, "sample"))
    if s.per_doc:
        with config_saved(cfg, cfg.out, "sample.config.yaml"):
            path = sample_doc_queries(lm, corpus, cfg.out, s, progress=cfg.progress)
        log.info("%d queries per document in %s", s.per_doc, path)
        print(f"next: train on them, `{next_command(argv, 'train', 'docids=<docids.tsv>', f'generated={path}')}`, or "
              f"index by them, `{next_command(argv, 'index', 'method=bmi', f'kmeans.doc_queries={path}')}`")
        return 0
    with config_saved(cfg, cfg.out, "sample.config.yaml"):
        rows = sample_queries(lm, corpus, cfg.out, s, progress=cfg.progress)
    for r in rows[:5]:
        log.info("sample query from %s: %s", r["source_doc_id"], r["text"])
    log.info("%d queries in %s", len(rows), Path(cfg.out) / "queries.jsonl")
    print(f"next: score them against every document, `{next_command(argv, 'score', keep=_LM_KEYS)}`")
    return 0


_LM_KEYS = ("data", "model", "sample", "score", "out", "device")  # what a P made in the same folder is keyed by


def score_main(argv: list[str]) -> int:
    cfg = compose("score", argv)
    if cfg.get("queries_from") and not any(in_section(k, "model") for k in override_keys(argv)):
        _model_of_run(cfg)
    corpus = corpus_from_config(to_container(cfg.data))
    check_corpus("score", cfg, corpus)  # P's size, before the model loads
    with config_saved(cfg, cfg.out, "score.config.yaml", write=dist_info()[0] == 0):
        score.score_corpus(corpus, lm_settings(cfg), cfg.out, SampleSettings.from_config(section(cfg, "sample")),
                           ScoreSettings.from_config(section(cfg, "score")), progress=cfg.progress,
                           queries_from=cfg.get("queries_from"),
                           resample=score.sample_command(cfg.out, without_section(argv, "score")),
                           reuse_from=_reuse_from(cfg))
    print(f"P in {Path(cfg.out)}; next: cluster it, `{next_command(argv, 'cluster', keep=_LM_KEYS)}` (P reused), or "
          f"build GC docids, `gdr index method=gc run={cfg.out} out={cfg.out}-gc`")
    return 0


def _reuse_from(cfg):
    """The score folder whose unchanged queries and P entries this ``gdr score`` takes: ``reuse_from``, else the
    run of ``queries_from`` (the documents it scored already keep their rows), else None."""
    run = cfg.get("reuse_from") or cfg.get("queries_from")
    return score_folder(run) if run else None


def _model_of_run(cfg) -> None:
    """``gdr score queries_from=<run>`` without ``model.*`` overrides scores with the model settings of that run (from
    the config it saved), since only a P of the same model compares with the run's."""
    folder = score_folder(cfg.queries_from)
    model = saved_model(folder)
    if model is not None:
        cfg.model = model
        log.info("scoring with the model settings of %s: %s", folder, model)
