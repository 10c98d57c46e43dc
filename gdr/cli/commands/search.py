"""``gdr search``: a trained retriever from the command line (:meth:`gdr.training.search.Retriever.search`).

Its arguments are queries and ``key=value`` settings, not a config of its own: argparse splits them (a word with
``=`` is a setting, ``--query TEXT`` and every word after ``--`` a query whatever it holds), and the settings are
checked by the rules of ``gdr evaluate``'s search section.
"""
from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

from omegaconf import OmegaConf

from gdr.cli import HELP
from gdr.cli.common import in_section, override_keys
from gdr.config import load_config, to_container
from gdr.data import corpus_from_config
from gdr.stages.settings import EVALUATE_RULES, EvaluateSettings, k_within_beam
from gdr.training.search import Retriever
from gdr.validate import ConfigError, validate

log = logging.getLogger(__name__)

# results per query shown unless k= is given (evaluate's k, which search's config shares, is a measure's depth)
SHOWN_K = 10

DESCRIPTION = (f"gdr search: {HELP['search']} (the out_dir of `gdr train`, or a train-* folder of `gdr run`): for "
               "each query, the top k doc ids with their scores and each document's title or first words.")
EXAMPLES = """examples:
  gdr search "rotating cylinders in supersonic flow" run_dir=runs/train/cranfield k=5
  gdr search run_dir=RUN --query "E=mc2" --json"""


def settings_help() -> str:
    """The settings part of ``--help``: defaults from :class:`gdr.stages.settings.EvaluateSettings`, meanings from
    the rules that check them (:data:`gdr.stages.settings.EVALUATE_RULES`)."""
    defaults = EvaluateSettings().to_dict()
    what = {r.key: r.what for r in EVALUATE_RULES}
    rows = [("run_dir=<folder>", "the retriever: a `gdr train` out_dir or a train-* folder of `gdr run` (required)"),
            (f"k={SHOWN_K}", what["k"])]
    rows += [(f"{key}={'null' if defaults[key] is None else defaults[key]}", what[key])
             for key in ("beam", "length_penalty", "batch_size", "device")]
    rows.append(("data=<corpus>", ("the corpus whose titles are shown (default: the one the retriever was trained "
                                   "on); data.*=... as in gdr evaluate")))
    return "\n".join(["settings (key=value):", *(f"  {k:<20}{v}".rstrip() for k, v in rows), "", EXAMPLES])


def parser(epilog: str | None = None) -> argparse.ArgumentParser:
    """``gdr search``'s arguments; ``--`` ends them (every word after it is a query)."""
    ap = argparse.ArgumentParser(prog="gdr search", description=DESCRIPTION, epilog=epilog,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("words", nargs="*", metavar="QUERY | key=value",
                    help="a query, or a setting (a word holding '=')")
    ap.add_argument("--query", action="append", default=[], metavar="TEXT",
                    help="a query, whatever it holds (one holding '=' needs it)")
    ap.add_argument("--json", action="store_true", help="one JSON line per query")
    return ap


def split_args(argv: list[str]) -> tuple[list[str], list[str], bool]:
    """(settings, queries, --json) of ``gdr search``'s argv: queries in the order plain words, ``--query`` texts,
    words after ``--``."""
    head, tail = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else (argv, [])
    args, unknown = parser(settings_help() if {"-h", "--help"} & set(head) else None).parse_known_intermixed_args(head)
    if unknown:
        raise SystemExit(f"unknown option {unknown[0]}; see gdr search --help")
    settings = [w for w in args.words if "=" in w]
    return settings, [w for w in args.words if "=" not in w] + args.query + tail, args.json


def _doc_labels(run_dir: str, overrides: list[str]) -> dict[str, str] | None:
    """Per doc id, its title or first words, from the corpus the retriever was trained on (the ``data``
    ``overrides`` of the command line, else the config ``gdr train`` saved in ``run_dir``); None when that corpus
    cannot be read."""
    try:
        if overrides:
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
    first words); JSON lines with --json."""
    overrides, queries, as_json = split_args(argv)
    if not queries:
        parser().print_usage(sys.stderr)
        return 2
    blank = next((i for i, q in enumerate(queries) if not q.strip()), None)
    if blank is not None:
        raise SystemExit(f"gdr search: query {blank + 1} is empty; pass the text to search for")
    keys = override_keys(overrides)
    data = [a for a, key in zip(overrides, keys) if in_section(key, "data")]
    cfg = load_config("evaluate", [a for a in overrides if a not in data])
    validate("search", cfg)
    c = to_container(cfg)
    if "beam" in keys and "k" in keys:  # as gdr evaluate: a beam given holds no more than its width of results
        problem = k_within_beam(c["k"], cfg)
        if problem:
            raise ConfigError(f"k={c['k']}: {problem}")
    retriever = Retriever.load(c["run_dir"], device=c.get("device"), beam=c["beam"],
                               length_penalty=c["length_penalty"], batch_size=c["batch_size"])
    # shown: k, or SHOWN_K cut to a beam given alone (its search holds no more; a wider one is not what was asked)
    k = int(c["k"]) if "k" in keys else min(SHOWN_K, int(c["beam"])) if "beam" in keys else SHOWN_K
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
