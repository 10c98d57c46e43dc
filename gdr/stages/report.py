"""Stage ``report``: the comparison of the docid schemes of a pipeline run (report.md, report.png, report.json)
and the one JSON line (:func:`headline`) that ``gdr run`` prints last."""
from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import matplotlib
import matplotlib.pyplot as plt
import numpy as np

from gdr.eval.compare import (
    compare_read,
    comparison_table,
    find,
    paired_metrics,
    primary_verdict,
    read_systems,
    seed_query_test,
    verdict,
)
from gdr.eval.retrieval import metric_keys, metric_name
from gdr.guard import replace_together
from gdr.indexing.options import IndexBMI
from gdr.stages.command_keys import Verdict
from gdr.stages.plan_file import planned_names
from gdr.stages.settings import EvaluateSettings, section_from

__all__ = ["write_report", "Report", "build_report", "render_markdown", "write_report_files", "mark_in_progress",
           "mark_stopped",
           "headline", "cluster_headline", "METRICS", "query_set_name", "at_depth", "pooled_index_facts",
           "docid_sources"]

# the keys of the evaluation rows at the default 100 results per query (:func:`gdr.eval.retrieval.metric_keys` at
# another ``evaluate.k``): ``recall@d`` is Success@d (hit@d), ``R@d`` recall, ``mrr@100`` RR@100
METRICS = metric_keys(100)
MEASURES_NOTE = ("Measures under ir_measures' names: Success@k is the share of queries with a relevant document in the "
                 "top k (what NCI and the GDR papers call Recall@k; it equals recall only where a query has one "
                 "relevant document); R@k is recall, the relevant documents in the top k over all of a query's "
                 "relevant documents, averaged over queries; RR@k is the mean reciprocal rank of the first relevant "
                 "document (MRR@k).")


SCHEME_NAMES = {"gc": "GC", "hkmi": "HKmI", "bmi": "BMI", "random": "random ids", "atomic": "atomic ids",
                "bm25": "BM25"}


def cluster_headline(result: dict) -> dict:
    """GC and k-means (log P) ARI/ACC/NMI means and GC's largest cluster share, for the report and the demo."""
    out: dict = {}
    gc = result["methods"].get("GC")
    if gc is not None:
        sizes = np.bincount(np.asarray(gc["labels"]), minlength=result["n_clusters"])
        out["gc_largest_cluster_share"] = round(float(sizes.max() / sizes.sum()), 4)
        out["gc_cluster_sizes"] = sizes.tolist()
    for name, key in (("GC", "gc"), ("k-means (logp)", "logp_kmeans"), ("k-means (tfidf)", "tfidf_kmeans")):
        r = result["methods"].get(name)
        if r is not None and r.get("mean"):
            for m in ("acc", "nmi", "ari"):
                out[f"{key}_{m}"] = round(float(r["mean"][m]), 2)
    for name, r in result["methods"].items():
        if name.startswith("k-means (embedding") and r.get("mean"):
            for m in ("acc", "nmi", "ari"):
                out[f"embedding_kmeans_{m}"] = round(float(r["mean"][m]), 2)
    return out


# ---------------------------------------------------------------------------------------------- report
def _mean_std(rows: list[dict], key: str) -> tuple[float, float | None]:
    """Mean and std over seeds (NaN where a row lacks ``key``: an evaluation made before it was measured); the
    std is None for one seed."""
    vals = np.array([r.get(key, np.nan) for r in rows], dtype=float)
    return float(vals.mean()), float(vals.std(ddof=1)) if len(vals) > 1 else None


def _cell(mean: float, std: float | None) -> str:
    if mean != mean:
        return "–"
    return f"{100 * mean:.1f}" + ("" if std is None else f" ({100 * std:.1f})")


def at_depth(row: dict, k: int) -> dict:
    """An evaluation row with its measures under the keys of depth ``k`` (:func:`gdr.eval.retrieval.metric_keys`).
    A row of an evaluation made before the measures were named at their depth holds those of a run of ``k < 100``
    results under the keys of 100 (``recall@100``, ``R@100``, ``mrr@100``): with nothing ranked below k they are the
    values at k, and are given under those keys."""
    if k >= 100 or f"mrr@{k}" in row or "mrr@100" not in row:
        return row
    return {**row, **{f"{m}@{k}": row[f"{m}@100"] for m in ("recall", "R", "mrr") if f"{m}@100" in row}}


def _retrieval_table(results: dict[str, list[dict]], indexes: dict, bm25: dict | None,
                     shown: Sequence[str]) -> tuple[list[str], dict[str, dict], int | None]:
    """(the markdown lines of the retrieval table, its numbers per scheme in %, the number of test queries): one
    row per scheme, mean (std) over its seeds of the metrics ``shown`` (keys of :func:`gdr.eval.retrieval.metric_keys`,
    headed by their ir_measures names), no std for one seed."""
    one_seed = all(len(rows) == 1 for rows in results.values())
    lines = ["## Retrieval (one seed, in %)" if one_seed else "## Retrieval (mean (std) over seeds, in %)", "",
             f"| docids | {' | '.join(map(metric_name, shown))} | depth (max / mean) | largest child share | seeds |",
             "|---|" + "---|" * (len(shown) + 3)]
    summary: dict[str, dict] = {}
    n_test = None
    for method, rows in results.items():
        stats = {m: _mean_std(rows, m) for m in shown}
        n_test = rows[0].get("n_queries", n_test)
        info = indexes[method]
        summary[method] = {m: round(100 * v[0], 2) for m, v in stats.items() if v[0] == v[0]}
        summary[method].update({f"{m}_std": round(100 * v[1], 2) for m, v in stats.items()
                                if v[0] == v[0] and v[1] is not None})
        n_idx = info.get("n_indexes", 1)  # index_seed=retriever: the index facts over its seeds' indexes
        name = method if n_idx == 1 else f"{method} ({n_idx} indexes, one a seed)"
        lines.append(f"| {name} | " + " | ".join(_cell(*stats[m]) for m in shown)
                     + f" | {info.get('depth_max', '')} / {info.get('depth_mean', 0):.2f}"
                     + f" | {info.get('largest_child_frac_mean', float('nan')):.2f} | {len(rows)} |")
    if bm25 is not None:
        lines.append("| BM25 (reference) | " + " | ".join(_cell(bm25.get(m, np.nan), None) for m in shown)
                     + " | | | |")
        n_test = bm25.get("n_queries", n_test)
    return lines, summary, n_test


def pooled_index_facts(infos: Sequence[dict]) -> dict:
    """One scheme's index facts over its indexes (one per retriever seed, ``index_seed=retriever``): the deepest
    ``depth_max`` and ``leaf_size_max``, the mean of every other figure, ``n_indexes`` how many."""
    out: dict = {"n_indexes": len(infos)}
    for key in dict.fromkeys(k for info in infos for k in info):
        values = [info[key] for info in infos if isinstance(info.get(key), (int, float))]
        if values:
            out[key] = max(values) if key in ("depth_max", "leaf_size_max") else float(np.mean(values))
    return out


def query_set_name(settings: dict, corpus_name: str) -> str:
    """The query set in words: its file (``data.queries``), else ``queries.name``, else the corpus's own."""
    data, queries = settings["data"], settings["queries"]
    if data.get("queries"):  # a key of the data options of files of documents alone (conf/data/jsonl.yaml)
        return Path(data["queries"]).name
    return corpus_name if queries["name"] == data["name"] else str(queries["name"])


def _sampled(sample: dict) -> str:
    """How many queries P's columns are: J of them, or ``p_per_doc`` from every document."""
    per_doc = sample["p_per_doc"]
    return f"{per_doc} sampled queries per document" if per_doc else f"J = {sample['n_queries']} sampled queries"


# what each docid scheme's ids are computed from, by its settings in the run's config (``index:``)
_BMI_TEXTS = {"genq": "generated queries", "genq_docseg": "generated queries and text segments",
              "realq_genq_docseg": "training queries, generated queries and text segments (BMI's own)"}


def docid_sources(settings: dict, methods: Sequence[str]) -> str:
    """One sentence: what the ids of each scheme of ``methods`` are computed from, by the run's config ``settings``."""
    index = settings["index"]
    km = index.get("kmeans") or {}
    vectors = "tf-idf + SVD" if km.get("embedding") == "tfidf-svd" else f"`{km.get('embed_model')}`"
    bmi = (index.get("bmi") or {}).get("inputs", IndexBMI.inputs)  # a config of an earlier gdr has no bmi section
    what = {"gc": "generative clustering of P", "hkmi": f"k-means on {vectors} vectors of the documents",
            "bmi": f"k-means on the mean {vectors} vector of each document's {_BMI_TEXTS[bmi]}",
            "random": "a random tree", "atomic": "one position a document"}
    parts = "; ".join(f"{m}: {what[m]}" for m in methods)
    return f"Docids (K = {index['n_clusters']}, leaf {index['leaf_size']}): {parts}." if parts else ""


@dataclass
class Report:
    """A run's report: ``data``, what ``report.json`` holds, and what ``report.md`` says beside it: the run's
    ``settings``, the retrieval ``table``'s markdown lines and the retrievers with a learning curve (``curves``)."""

    data: dict
    settings: dict
    table: list[str]
    curves: list[dict]
    planned: bool = True           # the run has a plan: the stage table gives its predicted seconds
    plan_note: str | None = None   # the line said on the predicted seconds (where they come from, what fills them)


def build_report(settings: dict, command: str, records: Sequence, n_docs: int, results: dict[str, list[dict]],
                 indexes: dict, bm25: dict | None, cluster: dict | None, seconds: float,
                 eval_dirs: dict[str, list] | None = None, corpus_name: str | None = None,
                 trained_on: str | None = None, partial: dict | None = None, unknown_qrels: int = 0,
                 predicted: dict[str, float | None] | None = None, query_split: dict | None = None,
                 retrievers: Sequence[dict] = (), plan_note: str | None = None,
                 timing: dict | None = None) -> Report:
    """The report of a pipeline run (:func:`write_report` says what each argument is): its figures, the paired
    comparisons against GC and the stages' seconds, written by :func:`write_report_files`."""
    cfg = settings
    # the results per query: every measure is named at its depth
    k = int(cfg["evaluate"]["k"])
    v = section_from(Verdict, cfg["verdict"], "verdict")
    # every per-query file read once, for the paired comparisons and the primary test alike
    paired = paired_metrics(k)
    metrics = tuple(dict.fromkeys([*paired, _primary_metric(v, k)]))
    systems, qids = read_systems(eval_dirs, metrics, k) if eval_dirs and len(eval_dirs) > 1 else ({}, {})
    comparisons = compare_read(systems, qids, "gc", paired)
    primary = primary_section(v, systems, qids, k, comparisons)
    # the primary pair's query-only test, from the comparisons while the primary test lacks a scheme's retriever
    query_only = verdict(primary["query_only"] if primary else find(comparisons, *v.pair, _primary_metric(v, k)),
                         names=SCHEME_NAMES)
    said = primary["line"] if primary else _no_primary(v, cfg["indexers"])
    corpus_name = corpus_name or cfg['data']['name']
    trained_on = trained_on or f"`{cfg['queries']['train_split']}`"
    shown = metric_keys(k)
    labels = {m: metric_name(m) for m in shown}
    results = {method: [at_depth(r, k) for r in rows] for method, rows in results.items()}
    bm25 = at_depth(bm25, k) if bm25 is not None else None
    table, summary, n_test = _retrieval_table(results, indexes, bm25, shown)
    data = {"command": command, "seconds": seconds, "partial": partial, "corpus": corpus_name, "n_docs": n_docs,
            "n_test_queries": n_test, "results_per_query": k, "trained_on": trained_on,
            "columns": labels,
            "retrieval": summary,
            "bm25": {m: round(100 * bm25[m], 2) for m in shown if m in bm25} if bm25 else None,
            "queries": query_set_name(cfg, corpus_name), "query_split": query_split, "unknown_qrels": unknown_qrels,
            "cluster": cluster, "comparisons": comparisons, "verdict": said,
            "primary": primary, "query_only_verdict": query_only,
            "stages": _stage_rows(records, predicted or {}), "training": (timing or {}).get("training"),
            "outside_stages": (timing or {}).get("outside_stages"), "overlapped": (timing or {}).get("overlapped")}
    return Report(data, cfg, table, [r for r in retrievers if r.get("curve")], predicted is not None, plan_note)


def render_markdown(report: Report) -> str:
    """``report.md``: the run in a sentence, the retrieval table, the comparisons, the clustering, the learning
    curves and the stages' seconds."""
    r, cfg = report.data, report.settings
    queries_name, k = r["queries"], r["results_per_query"]
    lines = [f"# gdr run: {r['corpus']}, {r['n_docs']} documents", "",
             f"Command: `{r['command']}`", ""]
    if r["partial"]:
        lines += [f"**Partial: {r['partial']['retrievers_done']} of {r['partial']['retrievers']} retrievers "
                  "finished; every figure below (means, intervals, tests) is over those. The run goes on, or resumes "
                  "with the same command.**", ""]
    tuned = " fine-tuned in the run (Query generator, below)" if (cfg.get("qg") or {}).get("enabled") else ""
    lines += [f"Query generator `{cfg['model']['name']}`{tuned}, {_sampled(cfg['sample'])}, "
              f"{cfg['doc_queries']['per_doc']} generated training queries per document; retriever "
              f"`{cfg['train']['model']['size']}`, seeds {list(cfg['seeds'])}; queries `{queries_name}` "
              f"(trained on {r['trained_on']}, scored on `{cfg['queries']['test_split']}`).", ""]
    lines += _split_lines(r["query_split"] or {})
    if r["verdict"]:
        lines += [f"**{r['verdict']}**", ""]
    if cfg['queries']['name'] == "titles":
        lines += ["Titles as queries is a proxy task (known-item search for the article of a headline), "
                  "not a benchmark of the field.", ""]
    lines += [*report.table, "", f"{r['n_test_queries']} test queries of `{queries_name}`, {k} results each. "
              f"{MEASURES_NOTE} The largest child share is the mean, over internal nodes, of the fraction of a "
              "node's documents in its largest child (1/K is perfectly balanced).", ""]
    sources = docid_sources(cfg, list(r["retrieval"]))
    lines += [sources, ""] if sources else []
    if r["unknown_qrels"]:
        lines += [f"{r['unknown_qrels']} relevant judgement(s) of `{queries_name}` name documents not in the corpus "
                  "and were dropped (data.drop_unknown_qrels=true): the figures are over the judgements left.", ""]
    lines += primary_lines(r["primary"])
    lines += _comparison_lines(r["comparisons"])
    if r["cluster"] is not None:
        lines += _cluster_lines(cfg["cluster"], r["cluster"])
    lines += _curve_lines(report.curves)
    lines += [*_stage_lines(r["stages"], report.planned, report.plan_note), "",
              f"Wall time of this invocation: {r['seconds']:.1f} s.", ""]
    lines += _timing_lines({"training": r["training"], "outside_stages": r["outside_stages"],
                            "overlapped": r.get("overlapped")})
    return "\n".join(lines)


def write_report_files(report: Report, root: Path) -> None:
    """``report.md``, ``report.png`` (with ``plot``, when a scheme has figures), ``curves.png`` (with ``plot``, when
    a retriever has a learning curve) and ``report.json`` into ``root``, replaced together."""
    r, title = report.data, f"{report.data['corpus']}: {report.data['n_docs']} docs"
    # all written to temp names first, then renamed, report.json last: a failed write (disk full,
    # unwritable) leaves the old report whole, and the files never disagree
    files = {root / "report.md": lambda p: p.write_text(render_markdown(report), encoding="utf-8")}
    if report.settings['plot'] and r["retrieval"]:
        files[root / "report.png"] = lambda p: _plot(r["retrieval"], r["bm25"], p, title, r["results_per_query"])
    if report.settings['plot'] and report.curves:
        files[root / "curves.png"] = lambda p: plot_learning_curves(report.curves, p,
                                                                    f"{r['corpus']}: learning curves")
    files[root / "report.json"] = lambda p: p.write_text(
        json.dumps(r, indent=2, ensure_ascii=False, default=str) + "\n", encoding="utf-8")
    replace_together(files)


def write_report(settings: dict, command: str, root: Path, records: Sequence, n_docs: int,
                 results: dict[str, list[dict]], indexes: dict, bm25: dict | None, cluster: dict | None,
                 seconds: float, eval_dirs: dict[str, list] | None = None, corpus_name: str | None = None,
                 trained_on: str | None = None, partial: dict | None = None, unknown_qrels: int = 0,
                 predicted: dict[str, float | None] | None = None, query_split: dict | None = None,
                 retrievers: Sequence[dict] = (), plan_note: str | None = None,
                 timing: dict | None = None) -> dict:
    """``report.md``, ``report.png`` and ``report.json`` of a pipeline run into ``root``, replaced together
    (:func:`build_report`, :func:`render_markdown`, :func:`write_report_files`); returns the report
    (``report.json``'s content).

    ``settings``: the run's settings as a plain dict (``conf/run.yaml``); ``records``: the stages
    (:class:`gdr.pipeline.StageRecord`); ``results``: per indexer, one row of test metrics per seed;
    ``indexes``: per indexer, the facts of its index (depth, balance); ``bm25``, ``cluster``: the facts of
    those stages, or None; ``eval_dirs``: per system (indexer, ``bm25``), its evaluation folders (one per seed,
    each with ``per_query.json``; a list of folders, one per fold, joined) for the paired comparisons against GC
    (:mod:`gdr.eval.compare`); ``corpus_name``:
    the corpus as loaded (a BEIR folder's or a file's name; default ``data.name``); ``trained_on``: what the
    retrievers learnt from, in words (default: the ``queries.train_split``); ``partial``: while retrievers are still
    to come, ``{"retrievers_done": n, "retrievers": total}``: the figures are over the finished ones and the report
    says so; ``unknown_qrels``: the relevant judgements of the test split dropped for naming documents not in the
    corpus (``data.drop_unknown_qrels=true``); ``predicted``: the seconds of the run's ``plan.json`` per stage name
    (:mod:`gdr.stages.plan_file`; a name absent: not modelled, "n/a"), set beside the measured ones; None: no plan,
    the column left out; ``plan_note``: the line said on them (where they come from, or what fills them);
    ``query_split``: how the topics were split (``{"by": "folds" | "fractions" | "query set", ...}``,
    :func:`gdr.pipeline.query_split`), said in the report; ``retrievers``: the run's ``retrievers.jsonl`` lines,
    whose learning curves (``curve``) are drawn in ``curves.png`` (:func:`plot_learning_curves`); ``timing``: this
    invocation's ``training`` phase and its seconds ``outside_stages`` (:func:`gdr.pipeline.run_timing`), said under
    the stages and kept in report.json."""
    report = build_report(settings, command, records, n_docs, results, indexes, bm25, cluster, seconds,
                          eval_dirs=eval_dirs, corpus_name=corpus_name, trained_on=trained_on, partial=partial,
                          unknown_qrels=unknown_qrels, predicted=predicted, query_split=query_split,
                          retrievers=retrievers, plan_note=plan_note, timing=timing)
    write_report_files(report, root)
    return report.data


def _timing_lines(timing: dict) -> list[str]:
    """The report's sentences on this invocation's training phase and its seconds outside any stage."""
    lines = []
    t = timing.get("training")
    if t:
        free = "n/a (CPU)" if t["free_gb"] is None else f"{t['free_gb']:.1f} GB"
        rate = "n/a" if t["examples_per_s"] is None else f"{t['examples_per_s']:,.0f}"
        memory = ""
        if t.get("peak_gb") is not None:
            memory = (f" Device memory of one retriever: {t['peak_gb']:.1f} GB at its peak (validations included), "
                      f"{t['estimate_gb']:.1f} GB planned by the batch rule.")
        passes = f", {t['forward_passes']} forward passes each (R-drop)" if t.get("forward_passes", 1) > 1 else ""
        lines += [f"Training here: {t['retrievers']} retriever(s), {t['examples']:,} examples (steps x batch "
                  f"{t['batch']}{passes}) in {t['seconds']:.1f} s, validations included: {rate} examples/s; "
                  f"{t['retrievers_at_once']} at once, {free} free when it started.{memory}", ""]
    o = timing.get("outside_stages")
    if o:
        lines += [f"Outside any stage: {o['seconds']:.1f} s (LM load {o['lm_load']:.1f} s, report rewrites "
                  f"{o['report_rewrites']:.1f} s, the rest {o['other']:.1f} s: corpus, bookkeeping).", ""]
    v = timing.get("overlapped")
    if v:
        each = ", ".join(f"{name} {s['seconds']:.1f} s" for name, s in v["stages"].items())
        lines += [f"In the background, beside the device stages (`overlap`): {each}; {v['seconds']:.1f} s in all, "
                  f"of which the run waited {v['waited']:.1f} s. Their seconds in the stage table ran beside the "
                  "others; only the waits count in the time inside stages.", ""]
    return lines


def _split_lines(split: dict) -> list[str]:
    """The report's sentence on how the topics were split (nothing for the query set's own splits)."""
    if split.get("by") == "folds":
        return [f"Cross-validated over {split['folds']} folds of the {split['n_topics']} topics (a seeded hash of "
                f"the topic id, queries.seed={split['seed']}): each retriever is trained without one fold's topics "
                "and scored on them, so every topic is a test topic once; a seed's figures, its per-query results "
                "and the paired comparisons are over all the topics, joined over the folds.", ""]
    if split.get("by") == "fractions":
        shares = "/".join(f"{x:g}" for x in split["fractions"])
        return [f"Topics split train/dev/test {shares} by a seeded hash of their ids (queries.fractions, "
                f"queries.seed={split['seed']}).", ""]
    return []


def _primary_metric(v: Verdict, k: int) -> str:
    """The primary test's metric (``verdict.metric``) as the per-query values name it (``mrr``: ``mrr@k``)."""
    return f"mrr@{k}" if v.metric == "mrr" else v.metric


def primary_section(v: Verdict, systems: dict, qids: dict, k: int, comparisons: Sequence[dict] = ()) -> dict | None:
    """The run's primary test (``verdict:`` settings: ``pair`` a - b, ``metric``, ``margin`` in points) over seeds
    and queries (:func:`gdr.eval.compare.seed_query_test`, :func:`~gdr.eval.compare.primary_verdict`), with every
    scheme's mean and SD over seeds on that metric, and the query-only test of the pair (from ``comparisons``
    where the run compared it already); None until both schemes of the pair have a retriever. ``systems``,
    ``qids``: the run's per-query values (:func:`gdr.eval.compare.read_systems`, the metric among them)."""
    pair = list(v.pair)
    if len(pair) != 2 or any(s not in systems for s in pair):
        return None
    metric = _primary_metric(v, k)
    margin = float(v.margin)
    systems = {s: vals for s, vals in systems.items() if s != "bm25"}
    a, b = pair
    pos_b = {q: i for i, q in enumerate(qids[b])}
    common = [i for i, q in enumerate(qids[a]) if q in pos_b]
    va = systems[a][metric][:, common] * 100.0
    vb = systems[b][metric][:, [pos_b[qids[a][i]] for i in common]] * 100.0
    test = seed_query_test(va, vb, (a, b), metric)
    said = primary_verdict(test, margin, names=SCHEME_NAMES)
    per_seed = {s: (vals[metric].mean(axis=1) * 100.0) for s, vals in systems.items()}
    schemes = {s: {"mean": round(float(x.mean()), 2), "sd": round(float(x.std(ddof=1)), 2) if len(x) > 1 else None,
                   "seeds": len(x)} for s, x in per_seed.items()}
    query_only = find(comparisons, a, b, metric) or find(
        compare_read({a: systems[a], b: systems[b]}, qids, a, (metric,)), a, b, metric)
    return {**said, "test": test.to_dict(), "margin": margin, "schemes": schemes, "query_only": query_only}


def _no_primary(v: Verdict, indexers: Sequence[str]) -> str:
    """The verdict line of a run without its primary test: why, where the run cannot make it (a scheme of
    ``verdict.pair`` not among its ``indexers``); empty while it can but is not there yet (a partial report)."""
    absent = [s for s in v.pair if s not in indexers]
    if not absent:
        return ""
    return (f"No primary test: verdict.pair=[{', '.join(v.pair)}] needs a retriever of {' and '.join(absent)}, "
            f"which indexers=[{', '.join(indexers)}] does not train.")


def primary_lines(primary: dict | None) -> list[str]:
    """The report's section on the primary test: the verdict line, per scheme mean and SD over seeds, the interval
    over seeds and queries beside the query-only one, and the smallest difference the run could have detected."""
    if not primary:
        return []
    t, q = primary["test"], primary.get("query_only") or {}
    name = metric_name(t["metric"])
    lines = ["## Primary test (fixed before the run: `verdict.*`)", "", f"**{primary['line']}**", "",
             f"Per scheme, {name} mean (SD) over seeds:", "", "| scheme | seeds | mean | SD over seeds |",
             "|---|---|---|---|"]
    for s, r in primary["schemes"].items():
        sd = "n/a" if r["sd"] is None else f"{r['sd']:.1f}"
        lines.append(f"| {SCHEME_NAMES.get(s, s)} | {r['seeds']} | {r['mean']:.1f} | {sd} |")
    lo, hi = t["ci95"]
    lines += ["", f"{SCHEME_NAMES.get(t['a'], t['a'])} - {SCHEME_NAMES.get(t['b'], t['b'])}: {t['diff']:+.1f} points; "
              f"95% interval over seeds and queries (t at {t['df']:.1f} degrees of freedom) [{lo:+.1f}, {hi:+.1f}]"
              + (f", over queries alone (seeds averaged, as the table below) [{q['ci95'][0]:+.1f}, {q['ci95'][1]:+.1f}]"
                 if q else "")
              + f"; standard error {t['se']:.2f} (queries {np.sqrt(t['var_query'] / t['n_queries']):.2f}, seeds "
              f"{np.sqrt(t['var_seed_a'] / t['n_seeds_a'] + t['var_seed_b'] / t['n_seeds_b']):.2f}); the smallest "
              f"difference this run detects 80% of the time at the 5% level: {t['detectable']:.1f} points. "
              f"Equivalence margin +-{primary['margin']:g} points.", ""]
    return lines


def _comparison_lines(comparisons: list[dict]) -> list[str]:
    """The report's paired comparisons: each system against the reference, with how they are computed."""
    if not comparisons:
        return []
    return ["## Paired comparisons (test queries, seeds averaged per query)", "",
            f"`{comparisons[0]['a']}` against every other system on the same test queries: the mean "
            "difference in percentage points, a 95% paired bootstrap interval (percentile) and a two-sided "
            "paired permutation test (scipy.stats; eval/compare.py). A query's value is the mean over the "
            "seeds of its scheme. p-values are not corrected for multiple comparisons.", "",
            *comparison_table(comparisons), ""]


def _stage_lines(stages: list[dict], planned: bool = True, plan_note: str | None = None) -> list[str]:
    """The report's stage table: seconds over every attempt, the last attempt, and what ``gdr plan`` predicted
    (``planned``: the run folder has a plan for these settings; else that column is left out, ``plan_note`` says
    what fills it)."""
    note = plan_note or "Predicted: what `gdr plan` predicted for the stage (n/a: not modelled)."
    lines = ["## Stages", "", "Seconds: every attempt of a stage resumed after a stop, summed; the last attempt "
             "apart. " + note, ""]
    if not planned:
        return lines + ["| stage | folder | seconds | last attempt | attempts | |", "|---|---|---|---|---|---|"] + [
            f"| {s['name']} | `{s['folder']}` | {s['seconds']:.1f} | {s['last_seconds']:.1f} | {s['attempts']} | "
            f"{'reused' if s['reused'] else 'ran'} |" for s in stages]
    return lines + ["| stage | folder | seconds | predicted | last attempt | attempts | |",
                    "|---|---|---|---|---|---|---|"] + [
        f"| {s['name']} | `{s['folder']}` | {s['seconds']:.1f} | "
        f"{'n/a' if s['predicted_seconds'] is None else format(s['predicted_seconds'], '.1f')} | "
        f"{s['last_seconds']:.1f} | {s['attempts']} | {'reused' if s['reused'] else 'ran'} |" for s in stages]


def _cluster_lines(settings: dict, c: dict) -> list[str]:
    """The report's section on the flat clustering against the labels (``settings``: the run's ``cluster``
    section; ``c``: :func:`cluster_headline`)."""
    lines = ["## Flat clustering against the labels", "",
             f"K = number of labels, mean over {settings['repeats']} repeats of best-of-{settings['n_init']} "
             f"(ARI in %). GC's largest cluster holds {100 * c.get('gc_largest_cluster_share', 0):.1f}% of "
             f"the documents (sizes {c.get('gc_cluster_sizes')}).", "",
             "| method | ACC | NMI | ARI |", "|---|---|---|---|"]
    for key, name in (("gc", "GC"), ("logp_kmeans", "k-means on log P"), ("tfidf_kmeans", "k-means on tf-idf"),
                      ("embedding_kmeans", f"k-means on {settings['embed_model']}")):
        if f"{key}_ari" in c:
            lines.append(f"| {name} | {c[f'{key}_acc']} | {c[f'{key}_nmi']} | {c[f'{key}_ari']} |")
    return lines + [""]


def _curve_lines(retrievers: Sequence[dict]) -> list[str]:
    """Per retriever, where its dev metric peaked and where it ended (the learning curves of ``curves.png``)."""
    if not retrievers:
        return []
    lines = ["Learning curves (the dev metric at each validation against the optimiser step; curves.png):", ""]
    for r in retrievers:
        steps, values = np.array(r["curve"], dtype=float).T
        top = int(np.argmax(values))
        fold = "" if r.get("fold") is None else f" fold {r['fold']}"
        lines.append(f"- {SCHEME_NAMES.get(r['indexer'], r['indexer'])} seed {r['seed']}{fold}: "
                     f"{r.get('best_val_metric') or 'dev'} peaked at {100 * values[top]:.1f} (step {int(steps[top])}), "
                     f"{100 * values[-1]:.1f} at the last validation (step {int(steps[-1])})")
    return [*lines, ""]


def plot_learning_curves(retrievers: Sequence[dict], path: Path, title: str) -> None:
    """``curves.png``: each retriever's dev metric against the optimiser step, one colour per docid scheme, a thin
    line per seed (and fold) and a thick one for the scheme's mean where its curves share their steps."""
    matplotlib.use("Agg")

    schemes = list(dict.fromkeys(r["indexer"] for r in retrievers))
    colours = {m: plt.get_cmap("tab10")(i % 10) for i, m in enumerate(schemes)}
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    for m in schemes:
        curves = [np.array(r["curve"], dtype=float) for r in retrievers if r["indexer"] == m]  # each (points, 2)
        for c in curves:
            ax.plot(c[:, 0], 100 * c[:, 1], color=colours[m], lw=0.8, alpha=0.35)
        same = all(c.shape == curves[0].shape and (c[:, 0] == curves[0][:, 0]).all() for c in curves)
        mean = np.mean(np.stack([c[:, 1] for c in curves]), axis=0) if same else curves[0][:, 1]
        ax.plot(curves[0][:, 0], 100 * mean, color=colours[m], lw=2.0,
                label=SCHEME_NAMES.get(m, m) + (f" (mean of {len(curves)})" if same and len(curves) > 1 else ""))
    metric = next((r.get("best_val_metric") for r in retrievers if r.get("best_val_metric")), "dev metric")
    ax.set_xlabel("optimiser step")
    ax.set_ylabel(f"dev {metric} (%)")
    ax.legend(fontsize=8)
    ax.set_title(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _stage_rows(records: Sequence, predicted: dict[str, float | None]) -> list[dict]:
    """One row per stage: seconds over every attempt, the predicted seconds (None: not predicted), the last attempt
    apart, and whether it was reused."""
    keys = planned_names([r.name for r in records])  # a second score or cluster: the two-shot generator's
    return [{"name": r.name, "folder": r.path.name, "seconds": r.seconds, "predicted_seconds": predicted.get(key),
             "last_seconds": r.seconds if r.last_seconds is None else r.last_seconds, "attempts": r.attempts,
             "reused": r.reused} for r, key in zip(records, keys)]


_MARKS = ("in_progress", "stopped")  # what a later run notes on the report of an earlier one
_MARK_LINES = ("> **In progress since", "> **Stopped at")


def mark_in_progress(root: Path, command: str) -> bool:
    """Mark the report of an earlier run in ``root`` as the previous one while a new run is in progress: kept
    (an interrupted run leaves it) until the new run's own report replaces it. Returns whether there was one."""
    report = _read_report(root)
    if report is None:
        return False
    since = time.strftime("%Y-%m-%dT%H:%M:%S")
    _mark(root, report, "in_progress", {"since": since, "command": command},
          f"> **In progress since {since}** (`{command}`): this is the report of the previous run of this folder, "
          "kept until this run's own replaces it.")
    return True


def mark_stopped(root: Path, why: str) -> bool:
    """Turn the in-progress mark of :func:`mark_in_progress` into a stopped one when the run ends (a signal, an
    error: ``why``) before its own report replaced the previous run's. Returns whether there was such a mark."""
    report = _read_report(root)
    if report is None or not isinstance(report.get("in_progress"), dict):
        return False
    ran = report["in_progress"]
    at = time.strftime("%Y-%m-%dT%H:%M:%S")
    _mark(root, report, "stopped", {"at": at, "why": why, **ran},
          f"> **Stopped at {at}** ({why}; `{ran.get('command')}` ran from {ran.get('since')}): this is the report of "
          "the previous run of this folder; the same command continues where that run stopped.")
    return True


def _read_report(root: Path) -> dict | None:
    try:
        return json.loads((root / "report.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _mark(root: Path, report: dict, key: str, value: dict, line: str) -> None:
    """``report.json`` with ``key: value`` (in place of any earlier mark) and ``report.md`` with ``line`` first
    (in place of any earlier mark's line), written together."""
    report = {k: v for k, v in report.items() if k not in _MARKS}
    report[key] = value
    md = root / "report.md"
    old_md = md.read_text(encoding="utf-8") if md.exists() else ""
    old_md = old_md.split("\n\n", 1)[1] if old_md.startswith(_MARK_LINES) else old_md
    replace_together({md: lambda p: p.write_text(line + "\n\n" + old_md, encoding="utf-8"),
                      root / "report.json": lambda p: p.write_text(json.dumps(report, indent=2, ensure_ascii=False,
                                                                              default=str) + "\n", encoding="utf-8")})


def _plot(summary: dict, bm25: dict | None, path: Path, title: str, k: int = EvaluateSettings.k) -> None:
    matplotlib.use("Agg")

    names = list(summary)
    fig, axes = plt.subplots(1, 2, figsize=(4 + 1.2 * len(names), 3.6))
    for ax, m in zip(axes, ("recall@1", f"mrr@{k}")):
        mu = [summary[n].get(m, float("nan")) for n in names]
        sd = [summary[n].get(f"{m}_std", 0.0) for n in names]  # one seed: no error bar
        ax.bar(range(len(names)), mu, yerr=sd, capsize=4, color="#4c72b0")
        if bm25 is not None:
            ax.axhline(bm25[m], color="#c44e52", ls="--", label="BM25")
            ax.legend(loc="upper right", fontsize=8)
        ax.set_xticks(range(len(names)), names)
        ax.set_ylabel(f"{metric_name(m)} (%)")
        ax.set_ylim(0, 100)
    fig.suptitle(title + " (mean and std over seeds)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def headline(report: dict) -> dict:
    """The one JSON line printed last: time, GC vs k-means clustering, Recall@1 (Success@1) per indexer and of BM25,
    GC's RR at the run's depth k under a key that names it (``rr_at_<k>``: ``rr_at_100`` at the default k,
    ``rr_at_20`` at ``evaluate.k=20``) and the paired permutation p-value of GC vs HKmI on Recall@1."""
    out: dict = {"seconds": report["seconds"]}
    c = report.get("cluster") or {}
    for k in ("gc_ari", "logp_kmeans_ari", "gc_largest_cluster_share"):
        if k in c:
            out[k] = c[k]
    ret = report["retrieval"]
    if "gc" in ret:
        out["recall_at_1"] = ret["gc"]["recall@1"]
        k = report.get("results_per_query") or EvaluateSettings.k  # a report of before it was recorded: the default
        # an evaluation of before the depth naming, deeper than 100, has RR@100 alone: named so
        rr = f"mrr@{k}" if f"mrr@{k}" in ret["gc"] else "mrr@100"
        out[f"rr_at_{rr.split('@')[1]}"] = ret["gc"].get(rr)
    for method, m in ret.items():
        out[f"{method}_recall_at_1"] = m["recall@1"]
    if report.get("bm25"):
        out["bm25_recall_at_1"] = report["bm25"]["recall@1"]

    c = find(report.get("comparisons") or [], "gc", "hkmi", "recall@1")
    if c is not None:
        out["gc_vs_hkmi_recall_at_1_p"] = c["p_value"]
    return out
