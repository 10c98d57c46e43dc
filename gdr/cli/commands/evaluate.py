"""``gdr evaluate``: :func:`gdr.stages.evaluate.evaluate_model` on a trained retriever and a query set."""
from __future__ import annotations

from gdr.cli.common import compose, config_saved, corpus_and_queries
from gdr.stages.evaluate import evaluate_model
from gdr.stages.settings import EvaluateSettings
from gdr.stages.train import check_not_trained_on, trained_splits
from gdr.upgrade import refuse_format_0_retriever

_SETTINGS = ("k", "beam", "length_penalty", "batch_size", "device", "bm25", "tag")


ALLOW_TRAIN_SPLIT = "--allow-train-split"  # score on a split the retriever was trained on, said in metrics.md


def evaluate_main(argv: list[str]) -> int:
    allow = ALLOW_TRAIN_SPLIT in argv
    argv = [a for a in argv if a != ALLOW_TRAIN_SPLIT]
    cfg = compose("evaluate", argv, before_claim=lambda cfg: (refuse_format_0_retriever(cfg.run_dir),
                                                              check_not_trained_on(cfg.run_dir, cfg.queries.split,
                                                                                   allow)))
    c, out, corpus, qs = corpus_and_queries(cfg)
    if qs is None or len(qs) == 0:
        raise SystemExit(f"gdr evaluate: no {c['queries']['split']!r} queries with relevant documents "
                         f"for {c['data']['name']}; set queries.name / queries.split")
    with config_saved(cfg, out):
        _, table = evaluate_model(c["run_dir"], corpus, qs, out,
                                  EvaluateSettings.from_config({k: c[k] for k in _SETTINGS}),
                                  split=c["queries"]["split"],
                                  on_train_split=allow and c["queries"]["split"] in trained_splits(c["run_dir"]))
    print(table, end="")
    print(f"results in {out} (metrics.json, metrics.md, run.trec, qrels.txt)")
    return 0
