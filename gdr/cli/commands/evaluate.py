"""``gdr evaluate`` (:func:`gdr.stages.evaluate.evaluate_model`) and ``gdr search`` (a trained retriever from
the command line)."""
from __future__ import annotations

import json
import sys

from gdr.cli.common import compose, corpus_and_queries, in_section, override_keys
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


SEARCH_USAGE = ('usage: gdr search "query" [...] run_dir=RUN [k=10] [beam=100] [data=...] [--json]; a query holding '
                '"=" goes after --query (or after --): gdr search run_dir=RUN --query "E=mc2"')


def split_search_args(argv: list[str]) -> tuple[list[str], list[str], bool]:
    """(overrides, queries, --json) of ``gdr search``'s argv: ``key=value`` is an override, other words are
    queries; ``--query TEXT`` and everything after ``--`` are queries whatever they hold."""
    overrides, queries, as_json = [], [], False
    it = iter(argv)
    for a in it:
        if a == "--":
            queries += list(it)
        elif a == "--query":
            text = next(it, None)
            if text is None:
                raise SystemExit("--query needs the text of a query after it")
            queries.append(text)
        elif a == "--json":
            as_json = True
        elif "=" in a and not a.startswith("-"):
            overrides.append(a)
        elif not a.startswith("-"):
            queries.append(a)
        else:
            raise SystemExit(f"unknown option {a}; {SEARCH_USAGE}")
    return overrides, queries, as_json


def _doc_labels(run_dir: str, overrides: list[str]) -> dict[str, str] | None:
    """Per doc id, its title or first words, from the corpus the retriever was trained on (the ``data``
    ``overrides`` of the command line, else the config ``gdr train`` saved in ``run_dir``); None when that corpus
    cannot be read."""
    import logging
    from pathlib import Path

    from omegaconf import OmegaConf

    from gdr.data import corpus_from_config

    log = logging.getLogger(__name__)
    try:
        if overrides:
            from gdr.config import load_config

            data = to_container(load_config("evaluate", overrides).data)
        else:
            saved = Path(run_dir) / "config.yaml"
            data = OmegaConf.to_container(OmegaConf.load(saved), resolve=True).get("data") if saved.is_file() else None
        if not data:
            return None
        corpus = corpus_from_config(data)
    except Exception as e:  # the results still print, by id
        log.warning("no titles: the corpus of %s could not be read (%s); pass data=... to name it",
                    run_dir, str(e).splitlines()[0] if str(e) else type(e).__name__)
        return None
    titles = corpus.titles or [None] * len(corpus)
    return {d: t or " ".join(x.split()[:12]) + (" ..." if len(x.split()) > 12 else "")
            for d, t, x in zip(corpus.doc_ids, titles, corpus.texts)}


def search_main(argv: list[str]) -> int:
    """``gdr search "query" ["another"] run_dir=... k=10``: prints doc ids, scores and each document's title (or
    first words); JSON lines with --json. ``--query TEXT`` (or ``-- TEXT ...``) for a query holding ``=``."""
    from gdr.config import load_config
    from training.search import Retriever

    overrides, queries, as_json = split_search_args(argv)
    if not queries:
        print(SEARCH_USAGE, file=sys.stderr)
        return 2
    keys = override_keys(overrides)
    data = [a for a, key in zip(overrides, keys) if in_section(key, "data")]
    cfg = load_config("evaluate", [a for a in overrides if a not in data])
    validate("search", cfg)
    c = to_container(cfg)
    retriever = Retriever.load(c["run_dir"], device=c.get("device"), beam=c["beam"],
                               length_penalty=c["length_penalty"], batch_size=c["batch_size"])
    k = int(c["k"]) if "k" in keys else 10
    results = retriever.search(queries, k=k)
    label = _doc_labels(c["run_dir"], data) or {}
    for q, res in zip(queries, results):
        if as_json:
            print(json.dumps({"query": q, "results": [{"doc_id": d, "score": s, "title": label.get(d)}
                                                      for d, s in res]}, ensure_ascii=False))
        else:
            print(f"# {q}")
            for rank, (d, s) in enumerate(res, 1):
                print(f"{rank:>4}  {d}  {s:.4f}" + (f"  {label[d]}" if d in label else ""))
    return 0
