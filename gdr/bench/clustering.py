"""Benchmark of generative clustering on a synthetic log P with planted clusters.

``python -m gdr.bench.clustering [--docs 20000 --queries 1024 --clusters 30 --n-init 10 --seed 0]
[--init greedy-k-means++] [--compare random,k-means++,greedy-k-means++:nosm]``

Prints human-readable lines and, as the last line, one JSON object with ``seconds`` (whole
``GenerativeClustering.fit``: clip, phi, W, all ``n_init`` runs, split/merge moves), ``iterations``
(summed over runs and moves), ``ms_per_iteration``, ``peak_rss_mb`` (``ru_maxrss`` of the process,
nothing subtracted, taken after the main fit and before the comparisons), ``baseline_rss_mb`` (after
imports, before the data), ``logp_mb``, ``ari`` of the planted labels, ``distortion`` (total, of the
selected fit), ``planted_distortion`` (the total distortion of the planted partition with its own
centroids, Eq. optim-centroid, on the same clipped P and W), ``init``, ``split_merge``, ``n_moves``
and ``compare``: for every strategy of ``--compare`` (fitted in the same process on the same log P,
same seed), its ``distortion``, ``ari``, ``seconds``, ``iterations`` and ``n_moves``.

A strategy is an init name, optionally with ``:sm`` or ``:nosm`` to force split/merge moves on or
off (default: on for ``greedy-k-means++`` only). ``--compare random`` is the paper's setting
(Algorithm 1 with Eq. init); ``--compare none`` fits the main strategy only. Labels are used only
to score (ARI) and for the planted distortion, never inside a fit.
"""
from __future__ import annotations

import argparse
import json
import logging
import resource
import sys
import time

import numpy as np
import torch

from gdr import cluster as gcmod
from gdr.cluster import GenerativeClustering
from gdr.eval.clustering import ari as adjusted_rand_index
from gdr.rules import POSITIVE, number, option_type, seed

log = logging.getLogger(__name__)


def planted_logp(n_docs: int, n_queries: int, n_clusters: int, seed: int = 0,
                 dtype=np.float32) -> tuple[np.ndarray, np.ndarray]:
    """Synthetic log P of shape (n_docs, n_queries) with planted clusters, and the labels (n_docs,).

    Modelled on doc2query scores: each query has a base log-probability (its length/difficulty,
    -70..-40) and a home topic (the cluster of the document it was sampled from); documents of a
    cluster share a profile over queries (+4 on their topic's queries, plus a cluster-specific
    N(0, 1.5^2) pattern), plus a per-document offset (length effect, N(0, 3^2)) and N(0, 3^2) noise.
    The query's own source document gets +25 (the outliers that Eq. clip removes). Cluster sizes
    are unequal. Values land around -30..-80. Generated in row blocks into one float32 array.
    """
    rng = np.random.default_rng(seed)
    sizes = rng.uniform(0.5, 1.5, n_clusters)
    labels = rng.choice(n_clusters, size=n_docs, p=sizes / sizes.sum())
    base = rng.uniform(-70.0, -40.0, n_queries)                         # (J,)
    topic = rng.integers(0, n_clusters, n_queries)                      # (J,) home cluster of query j
    profile = base + rng.normal(0.0, 1.5, (n_clusters, n_queries))      # (K, J)
    profile[topic, np.arange(n_queries)] += 4.0 * rng.uniform(0.5, 1.5, n_queries)
    offset = rng.normal(0.0, 3.0, n_docs)                               # (N,)
    out = np.empty((n_docs, n_queries), dtype=dtype)
    step = max(1, (1 << 20) // n_queries)
    for s in range(0, n_docs, step):
        e = min(n_docs, s + step)
        noise = rng.standard_normal((e - s, n_queries), dtype=np.float32)
        noise *= 3.0
        noise += profile[labels[s:e]].astype(np.float32)
        noise += offset[s:e, None].astype(np.float32)
        out[s:e] = noise
    # the source document of each query (one in its home cluster when there is one)
    members = np.flatnonzero(np.isin(labels, topic))
    src = rng.choice(members if members.size else np.arange(n_docs), size=n_queries)
    out[src, np.arange(n_queries)] += 25.0
    return out, labels


def _parse_strategy(s: str) -> tuple[str, bool | None]:
    """``"random"`` -> ("random", None); ``"random:sm"`` -> ("random", True); ``":nosm"`` -> False."""
    name, _, flag = s.strip().partition(":")
    if name not in gcmod.INITS or flag not in ("", "sm", "nosm"):
        raise argparse.ArgumentTypeError(f"bad strategy {s!r}: an init of {gcmod.INITS}, optionally "
                                         "followed by :sm or :nosm")
    return name, {"": None, "sm": True, "nosm": False}[flag]


def _strategy_name(init: str, split_merge: bool | None) -> str:
    sm = gcmod.use_split_merge(init, split_merge)
    return init + ("" if split_merge is None else (":sm" if sm else ":nosm"))


def planted_distortion(gc: GenerativeClustering, logp: np.ndarray, labels: np.ndarray) -> float:
    """Total distortion of the partition ``labels`` with its own centroids (Eq. optim-centroid).

    Same clip bounds, phi, alpha and kernel as the fitted ``gc`` (W factorised per row), so the
    number is directly comparable with ``gc.distortion_``.
    """
    p = gcmod.prepare_fit(logp, alpha=gc.alpha_, log_phi=gc.log_phi_, upper=gc.clip_upper_, device=gc.device,
                       dtype=gcmod.torch_dtype(gc.dtype))
    k = int(labels.max()) + 1
    wk, rk = gcmod.cluster_sums(p, torch.as_tensor(labels, dtype=torch.long, device=p.v.device), k)
    wk64 = wk.double()
    return gcmod.total_distortion(p, wk64, rk, gcmod.log_normalise(wk64))


def _timed_fit(args, logp: np.ndarray, init: str, split_merge: bool | None) -> tuple[GenerativeClustering, float]:
    gc = GenerativeClustering(args.clusters, alpha=args.alpha, init=init, n_init=args.n_init,
                              max_iter=args.max_iter, seed=args.seed, device=args.device, dtype=args.dtype,
                              split_merge=split_merge)
    t0 = time.perf_counter()
    gc.fit(logp)
    if args.device.startswith("cuda"):
        torch.cuda.synchronize()
    return gc, time.perf_counter() - t0


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / 2**20


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="gdr bench clustering", description=__doc__.split("\n")[0])
    ap.add_argument("--docs", type=option_type(POSITIVE), default=20_000)
    ap.add_argument("--queries", type=option_type(POSITIVE), default=1024)
    ap.add_argument("--clusters", type=option_type(POSITIVE), default=30)
    ap.add_argument("--n-init", type=option_type(POSITIVE), default=10)
    ap.add_argument("--max-iter", type=option_type(POSITIVE), default=100)
    ap.add_argument("--alpha", type=option_type(number(0), float), default=0.25)
    ap.add_argument("--init", type=_parse_strategy, default=("greedy-k-means++", None),
                    help=f"strategy of the main fit: an init of {gcmod.INITS}, optionally :sm or :nosm (default: the "
                         "library default, greedy-k-means++ with split/merge moves)")
    ap.add_argument("--compare", default="random",
                    help="comma-separated strategies fitted after the main one for a side-by-side table "
                         "(default: random, the old default; 'none': no comparison)")
    ap.add_argument("--seed", type=option_type(seed), default=0)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    args = ap.parse_args(argv)
    try:
        compare = [] if args.compare.strip().lower() in ("", "none") else [
            _parse_strategy(s) for s in args.compare.split(",") if s.strip()]
    except argparse.ArgumentTypeError as e:
        ap.error(f"--compare: {e}")
    logging.basicConfig(level=logging.INFO, format="%(message)s")

    baseline = _rss_mb()
    t0 = time.perf_counter()
    logp, planted = planted_logp(args.docs, args.queries, args.clusters, args.seed)
    gen_s = time.perf_counter() - t0
    logp_mb = logp.nbytes / 2**20
    print(f"log P: {logp.shape[0]} docs x {logp.shape[1]} queries float32 = {logp_mb:.1f} MB, "
          f"range [{logp.min():.1f}, {logp.max():.1f}], {args.clusters} planted clusters ({gen_s:.1f} s)")
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, device {args.device}, dtype {args.dtype}")

    if torch.device(args.device).type == "cuda":  # context and cuBLAS/cuSPARSE start-up are not the fit
        w = torch.ones(8, 8, device=args.device)
        torch.sparse.mm(w.to_sparse(), w @ w)
        torch.cuda.synchronize()
    init, split_merge = args.init
    name = _strategy_name(init, split_merge)
    gc, seconds = _timed_fit(args, logp, init, split_merge)
    iters = gc.result_.n_iter_total
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    ari = float(adjusted_rand_index(planted, gc.labels_))
    res = gc.result_
    sm = gcmod.use_split_merge(init, split_merge)
    print(f"fit ({name}{', split/merge' if sm else ''}): {seconds:.2f} s, {iters} iterations over "
          f"{args.n_init} runs ({1000 * seconds / max(iters, 1):.1f} ms per iteration incl. setup), "
          f"selected run {res.best_run} with {gc.n_iter_} iterations")
    moves = (f"; {res.n_moves} split/merge move(s) from {res.distortion_before_moves:.6g}"
             if res.distortion_before_moves is not None else "")
    print(f"distortion {gc.distortion_:.6g}{moves}; runs: {', '.join(f'{d:.6g}' for d in gc.all_distortions_)}")
    print(f"peak RSS {peak:.0f} MB (after imports {baseline:.0f} MB) = {peak / logp_mb:.2f} x log P; "
          f"ARI vs planted {ari:.4f}")
    planted_d = planted_distortion(gc, logp, planted)
    rows = [(name, gc.distortion_, ari, seconds, iters, res.n_moves)]
    table = {}
    for c_init, c_sm in compare:
        c_name = _strategy_name(c_init, c_sm)
        g, s = _timed_fit(args, logp, c_init, c_sm)
        a = float(adjusted_rand_index(planted, g.labels_))
        rows.append((c_name, g.distortion_, a, s, g.result_.n_iter_total, g.result_.n_moves))
        table[c_name] = {"distortion": g.distortion_, "ari": round(a, 4), "seconds": round(s, 3),
                         "iterations": g.result_.n_iter_total, "n_moves": g.result_.n_moves}
    print(f"planted partition: distortion {planted_d:.6g}")
    print(f"{'strategy':<24} {'distortion':>14} {'- planted':>10} {'ARI':>7} {'seconds':>8} {'iters':>6} {'moves':>5}")
    for r_name, d, a, s, it, mv in rows:
        print(f"{r_name:<24} {d:>14.6g} {d - planted_d:>10.2f} {a:>7.4f} {s:>8.2f} {it:>6} {mv:>5}")
    print(json.dumps({
        "docs": args.docs, "queries": args.queries, "clusters": args.clusters, "n_init": args.n_init,
        "device": args.device, "dtype": args.dtype, "seconds": round(seconds, 3), "iterations": iters,
        "ms_per_iteration": round(1000 * seconds / max(iters, 1), 2), "peak_rss_mb": round(peak, 1),
        "baseline_rss_mb": round(baseline, 1), "logp_mb": round(logp_mb, 1),
        "ari": round(ari, 4), "distortion": gc.distortion_, "planted_distortion": planted_d,
        "init": name, "split_merge": sm, "n_moves": res.n_moves, "compare": table,
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
