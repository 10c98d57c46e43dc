"""``gdr evaluate`` (:func:`gdr.stages.evaluate.evaluate_model`) and ``gdr search`` (a trained retriever from
the command line)."""
from __future__ import annotations

import json
import sys

from gdr.cli.common import compose, corpus_and_queries
from gdr.validate import validate
from gdr.config import to_container

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


def search_main(argv: list[str]) -> int:
    """``gdr search "query" ["another"] run_dir=... k=10``: prints doc ids and scores (JSON lines with --json)."""
    from gdr.config import load_config
    from training.search import Retriever

    as_json = "--json" in argv
    overrides = [a for a in argv if "=" in a and not a.startswith("-")]
    queries = [a for a in argv if "=" not in a and not a.startswith("-")]
    if not queries:
        print('usage: gdr search "query" [...] run_dir=RUN [k=10] [beam=100] [--json]', file=sys.stderr)
        return 2
    cfg = load_config("evaluate", overrides)
    validate("search", cfg)
    c = to_container(cfg)
    retriever = Retriever.load(c["run_dir"], device=c.get("device"), beam=c["beam"],
                               length_penalty=c["length_penalty"], batch_size=c["batch_size"])
    k = int(c["k"]) if any(a.startswith("k=") for a in overrides) else 10
    results = retriever.search(queries, k=k)
    for q, res in zip(queries, results):
        if as_json:
            print(json.dumps({"query": q, "results": [{"doc_id": d, "score": s} for d, s in res]}))
        else:
            print(f"# {q}")
            for rank, (d, s) in enumerate(res, 1):
                print(f"{rank:>4}  {d}  {s:.4f}")
    return 0
