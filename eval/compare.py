"""Paired comparison of retrieval systems on the same test queries.

Each system (a docid scheme's retrievers, one per seed, or BM25) gives per-query metrics (``recall@1``,
``recall@10``, ``mrr@k`` at the run's depth k: :func:`paired_metrics`, :func:`gdr.eval.retrieval.per_query_metrics`).
Two systems are compared on the queries both were scored on: a query's value is first **averaged over the
system's seeds** (the unit of the test is the query; the seeds' spread is reported next to it as mean (std)
over seeds), then

- ``diff``: the mean over queries of ``a - b``;
- ``ci95``: a 95% paired bootstrap interval of that mean (the percentile method, as ``scipy.stats.bootstrap``
  with ``paired=True``: on a few discordant binary differences BCa's acceleration estimate swings, e.g. one
  query of ten different gave [-50, 0] where the resampled means lie in [-30, 0]);
- ``p_value``: a two-sided paired permutation (randomization) test of ``diff = 0`` (as
  ``scipy.stats.permutation_test`` with ``permutation_type='samples'``: each query's pair of values is swapped
  or not; scipy's exact test where ``2 ** n_queries`` is at most ``n_resamples``).

Beyond a few queries the resamples are drawn once per number of queries and shared by every comparison, each
resample's mean a matrix-vector product (:func:`paired_test`): a report's 12 comparisons of 821 queries cost
a fraction of a second, where scipy's took 21 s (tests/bench_report.py).

Resampling uses a fixed seed: the same inputs give the same interval and p-value. Values are in the units
they are given in (the report gives them in percentage points). The p-values are per comparison, not
corrected for multiple comparisons.
"""
from __future__ import annotations

import functools
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np
from scipy import stats

from gdr.eval.retrieval import PER_QUERY_FILE, depths, metric_name, per_query_metrics, read_per_query
from gdr.options import RankingOptions

__all__ = ["PAIRED_METRICS", "paired_metrics", "Comparison", "paired_test", "mean_interval", "compare_systems",
           "compare_folders", "find", "verdict", "comparison_table", "metric_name"]



def paired_metrics(k: int = RankingOptions.k) -> tuple[str, ...]:
    """The per-query metrics compared for runs of ``k`` results per query: Success@1, Success@10 (k >= 10), RR@k."""
    return ("recall@1", *(("recall@10",) if k >= 10 else ()), f"mrr@{int(k)}")


PAIRED_METRICS = paired_metrics(100)
# resampled elements held at once (batch x n_queries): bounds the memory of a large test set
_MAX_ELEMENTS = 1 << 23
# resamples kept between comparisons (two float64 matrices of n_resamples x n_queries: 16 bytes an element)
_KEPT_ELEMENTS = 1 << 24


@dataclass
class Comparison:
    """``a`` vs ``b`` on ``metric``: mean paired difference over ``n_queries`` with its interval and p-value."""

    a: str
    b: str
    metric: str
    n_queries: int
    diff: float
    ci95: list[float]
    p_value: float
    n_seeds_a: int = 1
    n_seeds_b: int = 1

    def to_dict(self) -> dict:
        return asdict(self)


def _mean_diff(x, y, axis=-1):
    return np.mean(x - y, axis=axis)


def paired_test(a: np.ndarray, b: np.ndarray, n_resamples: int = 9999, seed: int = 0,
                confidence: float = 0.95) -> tuple[float, float, float, float]:
    """(mean of ``a - b``, interval low, interval high, two-sided p-value) for paired samples of shape (n,).

    Few queries (``2 ** n <= n_resamples``): scipy's exact permutation test. More: ``n_resamples`` random sign
    flips and bootstrap draws (:func:`_draws`, shared by every comparison of as many queries), each resample's mean
    one matrix-vector product, the p-value and the percentile interval as scipy computes them
    (``permutation_test``: counts within ``100 eps`` of the observed mean, plus one, over ``n_resamples + 1``)."""
    a = np.asarray(a, dtype=float)
    b = np.asarray(b, dtype=float)
    if a.shape != b.shape or a.ndim != 1:
        raise ValueError(f"paired samples must be two 1-d arrays of the same length, got {a.shape} and {b.shape}")
    n = len(a)
    if n == 0:
        return float("nan"), float("nan"), float("nan"), float("nan")
    d = a - b
    diff = float(d.mean())
    if n < 64 and 2 ** n <= n_resamples:
        return _exact_paired_test(a, b, d, diff, n_resamples, seed, confidence)
    null, boot = zip(*((signs @ d / n, counts @ d / n) for signs, counts in _draws(n, n_resamples, seed)))
    null, boot = np.concatenate(null), np.concatenate(boot)
    gamma = abs(np.finfo(float).eps * 100 * diff)
    less = (np.count_nonzero(null <= diff + gamma) + 1) / (n_resamples + 1)
    greater = (np.count_nonzero(null >= diff - gamma) + 1) / (n_resamples + 1)
    p = float(min(1.0, 2 * min(less, greater)))
    if np.all(d == d[0]):  # no spread: every bootstrap resample has the same mean
        return diff, diff, diff, p
    alpha = (1 - confidence) / 2
    lo, hi = np.percentile(boot, [100 * alpha, 100 * (1 - alpha)])
    return diff, float(lo), float(hi), p


def _exact_paired_test(a, b, d, diff, n_resamples, seed, confidence) -> tuple[float, float, float, float]:
    """:func:`paired_test` of a few queries: scipy's exact permutation test and its percentile bootstrap."""
    batch = max(1, _MAX_ELEMENTS // len(a))
    p = stats.permutation_test((a, b), _mean_diff, permutation_type="samples", vectorized=True,
                               n_resamples=n_resamples, alternative="two-sided", batch=batch,
                               rng=np.random.default_rng(seed)).pvalue
    if np.all(d == d[0]):
        return diff, diff, diff, float(p)
    ci = stats.bootstrap((a, b), _mean_diff, paired=True, vectorized=True, n_resamples=n_resamples,
                         confidence_level=confidence, method="percentile", batch=batch,
                         rng=np.random.default_rng(seed)).confidence_interval
    return diff, float(ci.low), float(ci.high), float(p)


def _draws(n: int, n_resamples: int, seed: int):
    """The resamples of :func:`paired_test` for ``n`` queries, in batches of at most :data:`_MAX_ELEMENTS`
    elements: (signs, counts), each (rows, n) float64: per resample, +1 or -1 for each query's pair kept or
    swapped, and how often the bootstrap drew each query. The same for the same (n, n_resamples, seed); kept for
    the next comparison when they are at most :data:`_KEPT_ELEMENTS` elements (a report compares every system on
    the same queries, at every rewrite)."""
    if n * n_resamples <= _KEPT_ELEMENTS:
        return _kept_draws(n, n_resamples, seed)
    return _make_draws(n, n_resamples, seed)


def _make_draws(n: int, n_resamples: int, seed: int):
    rng = np.random.default_rng(seed)
    rows = max(1, _MAX_ELEMENTS // n)
    for start in range(0, n_resamples, rows):
        m = min(rows, n_resamples - start)
        signs = np.where(rng.random((m, n)) < 0.5, -1.0, 1.0)
        drawn = rng.integers(0, n, size=(m, n)) + np.arange(m)[:, None] * n
        yield signs, np.bincount(drawn.ravel(), minlength=m * n).reshape(m, n).astype(float)


@functools.lru_cache(maxsize=1)
def _kept_draws(n: int, n_resamples: int, seed: int) -> tuple:
    return tuple(_make_draws(n, n_resamples, seed))


def mean_interval(x: np.ndarray, n_resamples: int = 9999, seed: int = 0,
                  confidence: float = 0.95) -> tuple[float, float, float]:
    """(mean, interval low, interval high): a percentile bootstrap interval of the mean of per-query values of
    shape (n,)."""
    x = np.asarray(x, dtype=float)
    if len(x) == 0:
        return float("nan"), float("nan"), float("nan")
    mean = float(x.mean())
    if np.all(x == x[0]):
        return mean, mean, mean
    batch = max(1, _MAX_ELEMENTS // len(x))
    ci = stats.bootstrap((x,), np.mean, vectorized=True, n_resamples=n_resamples, confidence_level=confidence,
                         method="percentile", batch=batch, rng=np.random.default_rng(seed)).confidence_interval
    return mean, float(ci.low), float(ci.high)


def _per_query(values: np.ndarray) -> np.ndarray:
    """(n_seeds, n_queries) or (n_queries,) -> the per-query mean over seeds."""
    v = np.asarray(values, dtype=float)
    return v.mean(axis=0) if v.ndim == 2 else v


def compare_systems(systems: Mapping[str, Mapping[str, np.ndarray]], qids: Mapping[str, Sequence[str]],
                    reference: str, metrics: Sequence[str] = PAIRED_METRICS, scale: float = 1.0,
                    n_resamples: int = 9999, seed: int = 0) -> list[Comparison]:
    """``reference`` against every other system, on each metric, over the queries both were scored on.

    Parameters
    ----------
    systems : name -> metric -> array (n_seeds, n_queries) (or (n_queries,) for a deterministic system)
    qids : name -> the query ids of its columns (the same order for every seed of a system)
    reference : the system every other one is compared with (``a`` of each comparison)
    scale : multiplies the values (100: report in percentage points)
    """
    if reference not in systems:
        raise ValueError(f"reference system {reference!r} is not among {sorted(systems)}")
    out: list[Comparison] = []
    ref_pos = {q: i for i, q in enumerate(qids[reference])}
    for name in systems:
        if name == reference:
            continue
        common = [q for q in qids[name] if q in ref_pos]
        ia = np.fromiter((ref_pos[q] for q in common), dtype=np.int64, count=len(common))
        own = {q: i for i, q in enumerate(qids[name])}
        ib = np.fromiter((own[q] for q in common), dtype=np.int64, count=len(common))
        for m in metrics:
            va, vb = np.asarray(systems[reference][m], dtype=float), np.asarray(systems[name][m], dtype=float)
            x, y = _per_query(va)[ia] * scale, _per_query(vb)[ib] * scale
            diff, lo, hi, p = paired_test(x, y, n_resamples=n_resamples, seed=seed)
            out.append(Comparison(reference, name, m, len(common), round(diff, 4), [round(lo, 4), round(hi, 4)],
                                  round(p, 6), va.shape[0] if va.ndim == 2 else 1, vb.shape[0] if vb.ndim == 2 else 1))
    return out


def find(comparisons: Sequence[Comparison | dict], a: str, b: str, metric: str) -> dict | None:
    for c in comparisons:
        c = c.to_dict() if isinstance(c, Comparison) else c
        if c["a"] == a and c["b"] == b and c["metric"] == metric:
            return c
    return None


def verdict(c: Comparison | dict | None, alpha: float = 0.05, names: Mapping[str, str] | None = None) -> str:
    """One sentence: whether ``a`` beats ``b`` on the metric (interval excluding 0 and p < alpha), or not."""
    if c is None:
        return ""
    c = c.to_dict() if isinstance(c, Comparison) else c
    names = names or {}
    a, b = names.get(c["a"], c["a"]), names.get(c["b"], c["b"])
    lo, hi = c["ci95"]
    stats_txt = (f"{metric_name(c['metric'])} {c['diff']:+.1f} points over {c['n_queries']} queries, 95% CI "
                 f"[{lo:+.1f}, {hi:+.1f}], paired permutation p = {c['p_value']:.3g}")
    if c["p_value"] < alpha and (lo > 0 or hi < 0):
        word = "beats" if c["diff"] > 0 else "is beaten by"
        return f"{a} {word} {b} at this size ({stats_txt})."
    return f"The difference between {a} and {b} is not significant at this size ({stats_txt})."


def comparison_table(comparisons: Sequence[Comparison | dict]) -> list[str]:
    """Markdown lines: one row per comparison."""
    lines = ["| a | b | metric | queries | seeds (a / b) | diff (a - b) | 95% CI | p |",
             "|---|---|---|---|---|---|---|---|"]
    for c in comparisons:
        c = c.to_dict() if isinstance(c, Comparison) else c
        lo, hi = c["ci95"]
        lines.append(f"| {c['a']} | {c['b']} | {metric_name(c['metric'])} | {c['n_queries']} | "
                     f"{c.get('n_seeds_a', 1)} / {c.get('n_seeds_b', 1)} | {c['diff']:+.1f} | "
                     f"[{lo:+.1f}, {hi:+.1f}] | {c['p_value']:.3g} |")
    return lines


def compare_folders(eval_dirs: Mapping[str, Sequence], reference: str | None = None,
                    metrics: Sequence[str] | None = None, n_resamples: int = 9999, seed: int = 0,
                    k: int = RankingOptions.k) -> list[dict]:
    """The paired comparisons of a run: ``eval_dirs`` maps a system to its evaluation folders (one per seed),
    each holding ``per_query.json`` (:func:`gdr.eval.retrieval.write_per_query`) of a run of ``k`` results per query;
    a seed given as a list of folders (cross-validation: one per fold, each scored on its own topics) has their
    per-query results joined. ``reference`` (default: the first system) is compared with every other on ``metrics``
    (default: :func:`paired_metrics` at ``k``); values in percentage points. Fewer than two systems: []."""
    metrics = tuple(metrics or paired_metrics(k))
    if len(eval_dirs) < 2:
        return []
    systems: dict[str, dict[str, np.ndarray]] = {}
    qids: dict[str, list[str]] = {}
    for name, dirs in eval_dirs.items():
        rows = []
        for d in dirs:
            folders = list(d) if isinstance(d, (list, tuple)) else [d]
            parts = [read_per_query(Path(f) / PER_QUERY_FILE) for f in folders]
            q, first = [x for p, _ in parts for x in p], np.concatenate([r for _, r in parts])
            if name in qids and q != qids[name]:
                # seeds of one system are scored on the same queries in the same order; align if not
                pos = {x: i for i, x in enumerate(q)}
                missing = [x for x in qids[name] if x not in pos]
                if missing:
                    raise ValueError(f"{Path(folders[0]) / PER_QUERY_FILE}: query {missing[0]!r} of the other seeds of "
                                     f"{name} is missing; re-run its evaluation")
                first = first[[pos[x] for x in qids[name]]]
            qids.setdefault(name, q)
            rows.append(per_query_metrics(first, depths(k), mrr_depth=k))
        systems[name] = {m: np.stack([r[m] for r in rows]) for m in metrics}
    ref = reference if reference in systems else next(iter(systems))
    return [c.to_dict() for c in compare_systems(systems, qids, ref, metrics, scale=100.0,
                                                 n_resamples=n_resamples, seed=seed)]
