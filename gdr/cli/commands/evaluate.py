"""``gdr evaluate``: :func:`gdr.stages.evaluate.evaluate_model` on a trained retriever and a query set."""
from __future__ import annotations

from gdr.cli.common import compose, corpus_and_queries

_SETTINGS = ("k", "beam", "length_penalty", "batch_size", "device", "bm25", "tag")


def evaluate_main(argv: list[str]) -> int:
    from gdr.stages.evaluate import evaluate_model
    from gdr.stages.settings import EvaluateSettings

    cfg = compose("evaluate", argv)
    c, out, corpus, qs = corpus_and_queries(cfg)
    if qs is None or len(qs) == 0:
        raise SystemExit(f"gdr evaluate: no {c['queries']['split']!r} queries with relevant documents "
                         f"for {c['data']['name']}; set queries.name / queries.split")
    _, table = evaluate_model(c["run_dir"], corpus, qs, out, EvaluateSettings.from_dict({k: c[k] for k in _SETTINGS}),
                              split=c["queries"]["split"])
    print(table, end="")
    return 0
