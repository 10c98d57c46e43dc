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
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np
from scipy import stats

from gdr.eval.retrieval import PER_QUERY_FILE, depths, metric_name, per_query_metrics, read_per_query
from gdr.options import RankingOptions

__all__ = ["PAIRED_METRICS", "paired_metrics", "Comparison", "paired_test", "mean_interval", "compare_systems",
           "compare_folders", "compare_read", "read_systems", "find", "verdict", "comparison_table", "metric_name",
           "SeedQueryTest", "seed_query_test", "primary_verdict", "POWER"]



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
    a = np.ascontiguousarray(a, dtype=float)
    b = np.ascontiguousarray(b, dtype=float)
    if a.shape != b.shape or a.ndim != 1:
        raise ValueError(f"paired samples must be two 1-d arrays of the same length, got {a.shape} and {b.shape}")
    _check_finite_values(a, "a")
    _check_finite_values(b, "b")
    return _paired_test(a.tobytes(), b.tobytes(), n_resamples, seed, confidence)


def _check_finite_values(x: np.ndarray, name: str) -> None:
    """Refuse a NaN or an infinity among per-query values, naming where it sits: every comparison with it is false,
    so a test would report a significant p-value for it."""
    bad = np.argwhere(~np.isfinite(x))
    if len(bad):
        at = ", ".join(map(str, bad[0])) if x.ndim > 1 else str(bad[0][0])
        raise ValueError(f"{name}[{at}] = {x[tuple(bad[0])]}: per-query values must be finite numbers ({len(bad)} "
                         "are not); drop those queries from both systems, or score them (a miss is 0)")


@functools.lru_cache(maxsize=256)  # a report's comparisons; 256 x 2 x 8 bytes x the queries at most
def _paired_test(a_bytes: bytes, b_bytes: bytes, n_resamples: int, seed: int,
                 confidence: float) -> tuple[float, float, float, float]:
    """:func:`paired_test` of the float64 arrays in ``a_bytes`` and ``b_bytes``, kept for the next call with the
    same values: a report rewritten as each retriever finishes compares the schemes that did not change again."""
    a, b = np.frombuffer(a_bytes), np.frombuffer(b_bytes)
    n = len(a)
    if n == 0:
        return float("nan"), float("nan"), float("nan"), float("nan")
    d = a - b
    diff = float(d.mean())
    if n == 1:  # its two sign flips, d and -d, are as extreme: p = 1; every bootstrap draw is the query itself
        return diff, diff, diff, 1.0
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


def points(x: float, sign: bool = True) -> str:
    """A difference in points at one decimal, or at two significant digits where one decimal would round it to 0
    (an interval [+0.04, +0.06] excludes 0; ``[+0.0, +0.1]`` would seem not to)."""
    text = f"{x:+.1f}" if sign else f"{x:.1f}"
    if x != 0 and float(text) == 0:
        text = f"{x:+.2g}" if sign else f"{x:.2g}"
    return text


def verdict(c: Comparison | dict | None, alpha: float = 0.05, names: Mapping[str, str] | None = None) -> str:
    """One sentence: whether ``a`` beats ``b`` on the metric (interval excluding 0 and p < alpha), or not."""
    if c is None:
        return ""
    c = c.to_dict() if isinstance(c, Comparison) else c
    names = names or {}
    a, b = names.get(c["a"], c["a"]), names.get(c["b"], c["b"])
    lo, hi = c["ci95"]
    stats_txt = (f"{metric_name(c['metric'])} {points(c['diff'])} points over {c['n_queries']} queries, 95% CI "
                 f"[{points(lo)}, {points(hi)}], paired permutation p = {c['p_value']:.3g}")
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
                     f"{c.get('n_seeds_a', 1)} / {c.get('n_seeds_b', 1)} | {points(c['diff'])} | "
                     f"[{points(lo)}, {points(hi)}] | {c['p_value']:.3g} |")
    return lines


def read_systems(eval_dirs: Mapping[str, Sequence], metrics: Sequence[str], k: int = RankingOptions.k
                 ) -> tuple[dict[str, dict[str, np.ndarray]], dict[str, list[str]]]:
    """(system -> metric -> per-seed per-query values of shape (n_seeds, n_queries), system -> its query ids) from
    ``eval_dirs`` (system -> its evaluation folders, one per seed, each with ``per_query.json`` of a run of ``k``
    results per query; a seed given as a list of folders, one per fold, has their per-query results joined)."""
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
    return systems, qids


def compare_folders(eval_dirs: Mapping[str, Sequence], reference: str | None = None,
                    metrics: Sequence[str] | None = None, n_resamples: int = 9999, seed: int = 0,
                    k: int = RankingOptions.k) -> list[dict]:
    """The paired comparisons of a run: ``eval_dirs`` maps a system to its evaluation folders (as
    :func:`read_systems`); ``reference`` (default: the first system) is compared with every other on ``metrics``
    (default: :func:`paired_metrics` at ``k``); values in percentage points. Fewer than two systems: []."""
    metrics = tuple(metrics or paired_metrics(k))
    if len(eval_dirs) < 2:
        return []
    systems, qids = read_systems(eval_dirs, metrics, k)
    return compare_read(systems, qids, reference, metrics, n_resamples, seed)


def compare_read(systems: Mapping[str, Mapping[str, np.ndarray]], qids: Mapping[str, Sequence[str]],
                 reference: str | None = None, metrics: Sequence[str] = PAIRED_METRICS, n_resamples: int = 9999,
                 seed: int = 0) -> list[dict]:
    """:func:`compare_folders` over per-query values already read (:func:`read_systems`, each of ``metrics``
    among them), so that a report that reads them for another test too reads them once."""
    if len(systems) < 2:
        return []
    ref = reference if reference in systems else next(iter(systems))
    return [c.to_dict() for c in compare_systems(systems, qids, ref, tuple(metrics), scale=100.0,
                                                 n_resamples=n_resamples, seed=seed)]


# ---------------------------------------------------------------------------------------------- seeds and queries
POWER = 0.8  # the power of the detectable difference: found 80% of the time


@dataclass
class SeedQueryTest:
    """``a - b`` on ``metric`` with both noises counted: which queries were drawn and which seeds trained the
    retrievers (:func:`seed_query_test`). Values in the units given (the report: percentage points)."""

    a: str
    b: str
    metric: str
    n_queries: int
    n_seeds_a: int
    n_seeds_b: int
    diff: float
    ci95: list[float]           # diff +- t(df) x se: Student's t at the Welch-Satterthwaite degrees of freedom
    se: float                   # analytic standard error: sqrt(var_query / n + var_seed_a / s_a + var_seed_b / s_b)
    df: float                   # Welch-Satterthwaite degrees of freedom of se (n - 1 with one seed a scheme)
    var_query: float            # variance over queries of the seed-averaged per-query difference
    var_seed_a: float           # variance over a's seeds of its per-seed means (0 with one seed: not estimable)
    var_seed_b: float
    mean_a: float
    sd_a: float | None          # SD over seeds of the per-seed means (None with one seed)
    mean_b: float
    sd_b: float | None
    detectable: float           # (t_{0.975} + t_{0.8}) x se at df: the smallest difference found 80% of the time

    def to_dict(self) -> dict:
        return asdict(self)


def _parts(var_query: float, var_a: float, var_b: float, n: np.ndarray | int, sa: np.ndarray | int,
           sb: np.ndarray | int) -> tuple[np.ndarray, np.ndarray]:
    """The standard error and its Welch-Satterthwaite degrees of freedom for ``n`` queries and ``sa`` / ``sb``
    seeds (arrays broadcast: the counts a run would need are searched over many at once): se^2 is the sum of the
    parts v = var / count, df = se^4 / sum(v^2 / (count - 1)) over the parts estimated (count > 1, v > 0)."""
    counts = np.broadcast_arrays(*(np.asarray(c, dtype=float) for c in (n, sa, sb)))
    v = np.stack([var / c for var, c in zip((var_query, var_a, var_b), counts)])
    dof = np.stack(counts) - 1.0
    estimated = (dof > 0) & (v > 0)
    spread = np.where(estimated, v ** 2 / np.where(estimated, dof, 1.0), 0.0).sum(axis=0)
    total = v.sum(axis=0)
    return np.sqrt(total), np.where(spread > 0, total ** 2 / np.where(spread > 0, spread, 1.0), np.inf)


def seed_query_test(a: np.ndarray, b: np.ndarray, names: tuple[str, str] = ("a", "b"), metric: str = "",
                    confidence: float = 0.95) -> SeedQueryTest:
    """``a - b`` for per-seed per-query values ``a`` of shape (s_a, n) and ``b`` of shape (s_b, n) on the same n
    queries (column j of both is query j), counting the noise of the queries drawn and of the seeds trained.

    The standard error adds the two parts, se^2 = var_q(mean_s a - mean_s b) / n + var_s(mean_q a) / s_a +
    var_s(mean_q b) / s_b (seeds and queries are crossed: the seed-by-query interaction sits in both parts, so se
    errs wide), and the interval is diff +- t x se, Student's t at the Welch-Satterthwaite degrees of freedom of
    those parts. With 3 seeds a scheme the seed variances rest on 2 degrees of freedom each: t is ~3 where a
    normal quantile is 1.96, and a percentile bootstrap over the seeds, which can reach no further than the
    lowest and highest seed mean, covered 0.82-0.89 of 300 simulated runs where this interval covered 0.96-0.97
    (tests/test_compare.py draws such runs). The detectable difference is (t_{1-alpha/2} + t_{0.8}) x se at the
    same degrees of freedom (alpha = 1 - confidence, power 0.8). A scheme with one seed gives no seed variance:
    its part is 0, and with one seed each the interval is the paired t interval over the queries."""
    a, b = np.atleast_2d(np.asarray(a, dtype=float)), np.atleast_2d(np.asarray(b, dtype=float))
    if a.shape[1] != b.shape[1]:
        raise ValueError(f"a and b must hold the same queries (columns), got {a.shape} and {b.shape}")
    (sa, n), sb = a.shape, b.shape[0]
    if n == 0:
        raise ValueError("no common queries to compare")
    _check_finite_values(a, "a")
    _check_finite_values(b, "b")
    d_q = a.mean(axis=0) - b.mean(axis=0)
    ma, mb = a.mean(axis=1), b.mean(axis=1)  # per-seed means
    var_q = float(d_q.var(ddof=1)) if n > 1 else 0.0
    var_a = float(ma.var(ddof=1)) if sa > 1 else 0.0
    var_b = float(mb.var(ddof=1)) if sb > 1 else 0.0
    se, df = (float(x) for x in _parts(var_q, var_a, var_b, n, sa, sb))
    diff = float(d_q.mean())
    t_conf = _t(confidence, df)
    half = t_conf * se
    return SeedQueryTest(names[0], names[1], metric, n, sa, sb, round(diff, 4),
                         [round(diff - half, 4), round(diff + half, 4)], round(se, 4),
                         round(df, 2) if np.isfinite(df) else float(n - 1), round(var_q, 6), round(var_a, 6),
                         round(var_b, 6), round(float(ma.mean()), 4),
                         round(float(ma.std(ddof=1)), 4) if sa > 1 else None, round(float(mb.mean()), 4),
                         round(float(mb.std(ddof=1)), 4) if sb > 1 else None,
                         round((t_conf + _t(2 * POWER - 1, df)) * se, 4))


def _t(confidence: float, df: np.ndarray | float) -> np.ndarray | float:
    """The two-sided ``confidence`` quantile of Student's t at ``df`` degrees of freedom (the normal's at inf)."""
    return stats.t.ppf(0.5 + confidence / 2, df)


def _needed(t: SeedQueryTest, goal: float, confidence: float, most: int = 100_000) -> dict:
    """The fewest seeds a scheme (queries as they are) or test queries (seeds as they are) whose interval's half
    width t(df) x se falls to ``goal``, the variances as measured; None where that level alone cannot, up to
    ``most``. The counts from the run's own up are tried in blocks that grow fourfold (se and df move together,
    so each block is searched at once), and a level is given up at once when even infinitely many leave the other
    parts' half width, at the normal quantile (t's least), above ``goal``."""
    out: dict = {"seeds": None, "queries": None}
    for level, first in (("seeds", max(t.n_seeds_a, t.n_seeds_b, 2)), ("queries", t.n_queries)):
        kept = (t.var_query / t.n_queries if level == "seeds"  # the part the level leaves as it is
                else t.var_seed_a / t.n_seeds_a + t.var_seed_b / t.n_seeds_b)
        if _t(confidence, np.inf) * np.sqrt(kept) > goal:
            continue
        start, size = first, 64
        while start <= most:
            counts = np.arange(start, min(start + size, most + 1))
            n, sa, sb = (t.n_queries, counts, counts) if level == "seeds" else (counts, t.n_seeds_a, t.n_seeds_b)
            se, df = _parts(t.var_query, t.var_seed_a, t.var_seed_b, n, sa, sb)
            ok = np.flatnonzero(_t(confidence, df) * se <= goal)
            if ok.size:
                out[level] = int(counts[ok[0]])
                break
            start, size = start + size, 4 * size
    return out


def min_queries(confidence: float = 0.95) -> int:
    """The fewest paired queries whose sign flips can reach a two-sided p-value below ``1 - confidence`` (6 at
    95%): ``2 ** (1 - n) < 1 - confidence``."""
    return int(np.floor(1 - np.log2(1 - confidence))) + 1


def primary_verdict(t: SeedQueryTest, margin: float, names: Mapping[str, str] | None = None,
                    confidence: float = 0.95) -> dict:
    """The run's verdict on its primary test ``t``, by rules fixed before the run: ``decided`` when the two-noise
    interval excludes 0; ``equivalent`` (within +-``margin``) when it lies inside [-margin, margin]; else
    ``undecided``, as it is with fewer queries than any test could decide on (:func:`min_queries`) or values that do
    not vary (an interval of width 0 measures no noise), with the seeds or test queries that would decide it, had
    the difference stayed as measured: the counts whose interval half width t(df) x se would fall to |diff| (off 0)
    or to margin - |diff| (inside the margin), the easier of the two (:func:`_needed`). Returns ``{"status", "line",
    "needed"}``."""
    names = names or {}
    a, b = names.get(t.a, t.a), names.get(t.b, t.b)
    lo, hi = t.ci95
    what = (f"{metric_name(t.metric)} {a} - {b} {points(t.diff)} points, 95% interval over seeds and queries "
            f"[{points(lo)}, {points(hi)}] ({t.n_seeds_a} / {t.n_seeds_b} seeds, {t.n_queries} queries; detectable "
            f"difference {points(t.detectable, sign=False)})")
    fewest = min_queries(confidence)
    if t.n_queries < fewest:  # sign flips of n queries reach no two-sided p below 2 ** (1 - n)
        return {"status": "undecided", "needed": {"seeds": None, "queries": fewest},
                "line": f"Undecided: {a} vs {b} ({what}); {t.n_queries} test queries are too few for any test at "
                        f"this level (at least {fewest}): run more test queries."}
    single = [name for name, s in ((a, t.n_seeds_a), (b, t.n_seeds_b)) if s < 2]
    if single:  # a seed variance of 0 is not a measured one: the interval would leave that noise out
        pooled = max(t.var_seed_a, t.var_seed_b)  # the other scheme's, where it ran several seeds
        goal = max(abs(t.diff), margin - abs(t.diff))
        needed = (_needed(replace(t, var_seed_a=pooled, var_seed_b=pooled), goal, confidence) if pooled > 0
                  else {"seeds": 2, "queries": None})
        needed["seeds"] = max(needed["seeds"] or 2, 2)
        return {"status": "undecided", "needed": needed,
                "line": f"Undecided: {a} vs {b} ({what}); {' and '.join(single)} ran one seed, so the seed noise "
                        f"that could flip this difference is not measured: run at least {needed['seeds']} seeds a "
                        "scheme (the query-only test stands beside it)."}
    if t.se == 0.0:  # the same difference on every query and seed: its sign flips reach p = 2 ** (1 - n)
        if t.diff == 0.0:  # e.g. both miss every query: an interval of width 0 measures no noise
            return {"status": "undecided", "needed": {"seeds": None, "queries": None},
                    "line": f"Undecided: {a} vs {b} ({what}); the two schemes score alike on every query and seed, "
                            "so the noise of their difference cannot be estimated: run test queries on which their "
                            "values vary."}
        word = "beats" if t.diff > 0 else "is beaten by"
        return {"status": "decided", "needed": None,
                "line": f"Decided: {a} {word} {b} ({what}; the same difference on every query and seed, sign-flip "
                        f"p = {2.0 ** (1 - t.n_queries):.2g})."}
    if lo > 0 or hi < 0:
        word = "beats" if t.diff > 0 else "is beaten by"
        return {"status": "decided", "needed": None, "line": f"Decided: {a} {word} {b} ({what})."}
    if -margin <= lo and hi <= margin:
        return {"status": "equivalent", "needed": None,
                "line": f"Equivalent within +-{margin:g} points: {a} and {b} ({what})."}
    off_zero, inside = abs(t.diff), margin - abs(t.diff)
    needed = _needed(t, max(off_zero, inside), confidence)  # the wider half width allowed is the cheaper goal
    aim = "show the difference" if off_zero >= inside else f"show equivalence within +-{margin:g}"
    ways = [f"{needed['seeds']} seeds a scheme" if needed["seeds"] else "",
            f"{needed['queries']} test queries" if needed["queries"] else ""]
    ways = [w for w in ways if w]
    hint = (" or ".join(ways) + f" would {aim} if the difference stayed as measured" if ways else
            f"neither more seeds alone nor more queries alone would {aim} at this difference; both together would")
    return {"status": "undecided", "needed": needed, "line": f"Undecided: {a} vs {b} ({what}); {hint}."}
