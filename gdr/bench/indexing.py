"""Benchmark: hierarchical GC indexing on a synthetic log P with a planted two-level hierarchy.

    python -m gdr.bench.indexing                      # paper scale: 138,457 docs x 4,096 queries
    python -m gdr.bench.indexing --docs 5000 --queries 512

Writes log P as a float16 ``.npy`` (block by block), builds the GC index from the file exactly as
``gdr index method=gc`` does (including writing ``docids.tsv``, ``tree.json``, ``tree_state.npz``
and the summary) and reports time, depth, peak resident memory against the size of the float16
P matrix, and how well the planted top level is recovered (adjusted Rand index of the first
code position against the planted top clusters). It also compares, at the root, the total
distortion of the fitted top-level partition with that of the planted top clusters (each with its
own centroids, same clip bounds, global phi and columns; two streamed passes each, after the
timed build; ``--skip-distortion`` leaves them out). The last line is one JSON object.

Memory. ``peak_rss_mb`` is ``ru_maxrss`` (the high-water mark of the resident set: anonymous
memory plus the file pages mapped into the process -- shared libraries and any mapped pages of
P -- including the Python/torch baseline of a few hundred MB). A background thread also samples
``/proc/self/status`` every 20 ms and reports the peaks of ``RssAnon`` (heap: arrays, tensors)
and ``RssFile`` (mapped files) separately; sampled peaks can miss spikes shorter than that.

With ``--tmp DIR`` the synthetic P is kept as ``DIR/planted-<docs>x<queries>-...npy`` and reused
by later runs with the same shape, clusters and seed (the generator is deterministic); the
index itself is always written to a temporary folder and deleted.
"""
from __future__ import annotations

import argparse
import json
import logging
import resource
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

from gdr.indexing.gc import GCOptions, build_gc_index, partition_distortion
from gdr.indexing.output import write_index
from gdr.indexing.synthetic import planted_hierarchy, write_planted_npy
from gdr.rules import NON_NEGATIVE, POSITIVE, number, option_type, seed
from gdr.store.rows import PMatrix

log = logging.getLogger(__name__)


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # Linux: KiB


def _status_mb(keys=("RssAnon", "RssFile")) -> dict[str, float]:
    """Fields of ``/proc/self/status`` in MiB (empty where it does not exist, e.g. not Linux)."""
    out = {}
    try:
        with open("/proc/self/status") as f:
            for line in f:
                k, _, v = line.partition(":")
                if k in keys:
                    out[k] = int(v.split()[0]) / 1024.0  # kB
    except OSError:
        pass
    return out


class _MemSampler(threading.Thread):
    """Peaks of RssAnon / RssFile, sampled every ``interval`` seconds until :meth:`stop`."""

    def __init__(self, interval: float = 0.02):
        super().__init__(daemon=True)
        self.interval = interval
        self.peak: dict[str, float] = _status_mb()
        self._done = threading.Event()

    def run(self) -> None:
        while not self._done.wait(self.interval):
            for k, v in _status_mb().items():
                if v > self.peak.get(k, 0.0):
                    self.peak[k] = v

    def stop(self) -> dict[str, float]:
        self._done.set()
        self.join()
        for k, v in _status_mb().items():
            self.peak[k] = max(self.peak.get(k, 0.0), v)
        return self.peak


def _planted_file(folder: Path, h, args, cache: bool) -> tuple[Path, bool]:
    """The float16 P of ``h`` in ``folder`` (reused if ``cache`` and a file of the right shape is there)."""
    name = (f"planted-{args.docs}x{args.queries}-top{args.clusters}-sub{args.sub}-seed{args.seed}.f16.npy" if cache
            else "P.npy")
    path = folder / name
    if cache and path.exists():
        try:
            pm = PMatrix(path)
            if pm.shape == (args.docs, args.queries) and pm.dtype == np.float16:
                return path, True
        except (ValueError, OSError) as e:
            log.warning("%s is unusable (%s); writing it again", path, e)
    tmp = path.with_name(f".{path.name}.{time.time_ns()}.tmp")
    try:
        write_planted_npy(tmp, h, dtype=np.float16)
        tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)
    return path, False


def _args(argv: list[str] | None):
    ap = argparse.ArgumentParser(prog="gdr bench indexing", description=__doc__.split("\n")[0])
    ap.add_argument("--docs", type=option_type(POSITIVE),
                    default=138_457, help="N documents (default: MS MARCO Lite size)")
    ap.add_argument("--queries", type=option_type(POSITIVE), default=4096, help="J sampled queries (default 4096)")
    ap.add_argument("--seed", type=option_type(seed), default=0)
    ap.add_argument("--clusters", type=option_type(POSITIVE),
                    default=30, help="K (also the number of planted top clusters)")
    ap.add_argument("--leaf-size", type=option_type(POSITIVE), default=30, help="c")
    ap.add_argument("--sub", type=option_type(POSITIVE), default=30, help="planted sub clusters per top cluster")
    ap.add_argument("--n-init", type=option_type(POSITIVE), default=5, help="fit_generative runs at the root")
    ap.add_argument("--n-init-inner", type=option_type(POSITIVE), default=1, help="fit_generative runs below the root")
    ap.add_argument("--init", default="greedy-k-means++", choices=["random", "k-means++", "greedy-k-means++"],
                    help="fit_generative init at every node (default greedy-k-means++)")
    ap.add_argument("--split-merge", default="auto", choices=["auto", "on", "off"],
                    help="split/merge moves after each node's fit (auto: on for greedy-k-means++ only)")
    ap.add_argument("--skip-distortion", action="store_true",
                    help="do not compute the root distortions of the fitted and planted partitions")
    ap.add_argument("--memory-mb", type=option_type(number(0), float),
                    default=1024.0, help="per-node working-set budget (gc.memory_mb)")
    ap.add_argument("--chunk-rows", type=option_type(POSITIVE), default=2048)
    ap.add_argument("--workers", type=option_type(POSITIVE), default=1)
    ap.add_argument("--torch-threads", type=option_type(NON_NEGATIVE),
                    default=1, help="gc.torch_threads (0 = torch's default)")
    ap.add_argument("--no-write", action="store_true", help="skip writing the index files")
    ap.add_argument("--tmp", default=None, help="folder for the temporary P.npy (default: the system temp dir)")
    ap.add_argument("--quiet", action="store_true", help="no progress bars")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s",
                        datefmt="%H:%M:%S")
    return args


def _print_summary(tree, opts, args, r: dict, mem: dict, before: dict) -> None:
    """The human-readable lines of the benchmark (``r``: its JSON figures)."""
    root = tree.nodes[0]
    print(f"GC index: {r['build_seconds']:.1f} s build + {r['write_seconds']:.1f} s write; depth {tree.depth} (mean "
          f"code length {r['mean_depth']:.2f}); {len(tree.internal_nodes)} internal nodes, {len(tree.leaves)} "
          f"leaves, {tree.n_fallback} fallbacks")
    print(f"root: {root.n_children} children, info {root.info}")
    print(f"options: n_init root {opts.n_init}, below root {opts.n_init_inner}, init {opts.init}, "
          f"split/merge {args.split_merge}, memory_mb {opts.memory_mb:g}, chunk_rows {opts.chunk_rows}, "
          f"workers {args.workers}, torch threads {opts.torch_threads or 'default'}")
    print(f"peak RSS {r['peak_rss_mb']:.0f} MiB (before indexing {r['rss_before_mb']:.0f} MiB) = "
          f"{r['rss_over_p']:.2f} x the float16 P ({r['p_matrix_mb']:.0f} MiB)")
    if mem:
        print(f"sampled peaks while indexing: anonymous {mem.get('RssAnon', 0):.0f} MiB (before "
              f"{before.get('RssAnon', 0):.0f}), file-backed {mem.get('RssFile', 0):.0f} MiB (before "
              f"{before.get('RssFile', 0):.0f}: shared libraries)")
    print(f"planted structure: ARI top level {r['ari_top']:.4f}, ARI top+sub (first two positions) "
          f"{r['ari_two_levels']:.4f}")
    if r["root_distortion"] is not None:
        fit_d, planted_d = r["root_distortion"], r["planted_root_distortion"]
        print(f"root distortion: fitted top level {fit_d:.8g}, planted top clusters {planted_d:.8g} "
              f"(fitted - planted = {fit_d - planted_d:.4g}; not in the build time)")


def main(argv: list[str] | None = None) -> int:
    args = _args(argv)

    from sklearn.metrics import adjusted_rand_score  # optional: gdr[eval]

    if args.tmp is not None:
        Path(args.tmp).mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=args.tmp, prefix="gdr-bench-indexing-") as tmp:
        tmp = Path(tmp)
        t0 = time.time()
        h = planted_hierarchy(args.docs, args.queries, n_top=args.clusters, n_sub=args.sub, seed=args.seed)
        path, reused = _planted_file(Path(args.tmp) if args.tmp is not None else tmp, h, args,
                                     cache=args.tmp is not None)
        gen_s = time.time() - t0
        p_mb = path.stat().st_size / 2**20
        print(f"synthetic log P: {args.docs} docs x {args.queries} queries, float16, {p_mb:.1f} MiB, "
              f"{args.clusters} x {args.sub} planted clusters "
              f"({'reused ' + str(path) if reused else f'{gen_s:.1f} s to write'})")
        rss_before = _peak_rss_mb()
        status_before = _status_mb()
        sampler = _MemSampler()
        sampler.start()
        split_merge = {"auto": None, "on": True, "off": False}[args.split_merge]
        opts = GCOptions(n_init=args.n_init, n_init_inner=args.n_init_inner, init=args.init, split_merge=split_merge,
                         memory_mb=args.memory_mb, chunk_rows=args.chunk_rows, torch_threads=args.torch_threads or None)
        t0 = time.time()
        tree = build_gc_index(PMatrix(path), n_clusters=args.clusters, leaf_size=args.leaf_size, options=opts,
                              seed=args.seed, workers=args.workers, progress=not args.quiet)
        build_s = time.time() - t0
        write_s = 0.0
        if not args.no_write:
            t0 = time.time()
            write_index(tmp / "index", tree, [f"d{i}" for i in range(args.docs)], method="gc", plot=True)
            write_s = time.time() - t0
        peak = _peak_rss_mb()
        mem = sampler.stop()
        codes = tree.codes
        top = np.array([c[0] for c in codes])
        fit_d = planted_d = None
        if not args.skip_distortion:
            fit_d = partition_distortion(PMatrix(path), tree, top, opts)
            planted_d = partition_distortion(PMatrix(path), tree, h.top, opts)
    second = np.array([c[0] * 10_000 + (c[1] if len(c) > 2 else -1) for c in codes])
    lengths = np.array([len(c) for c in codes])
    res = {
        "docs": args.docs, "queries": args.queries, "seconds": round(build_s + write_s, 2),
        "build_seconds": round(build_s, 2), "write_seconds": round(write_s, 2), "depth": int(tree.depth),
        "mean_depth": round(float(lengths.mean()), 4), "n_fallback": int(tree.n_fallback),
        "peak_rss_mb": round(peak, 1), "p_matrix_mb": round(p_mb, 1), "rss_over_p": round(peak / p_mb, 3),
        "rss_before_mb": round(rss_before, 1), "peak_anon_mb": round(mem.get("RssAnon", float("nan")), 1),
        "peak_file_mb": round(mem.get("RssFile", float("nan")), 1),
        "ari_top": round(float(adjusted_rand_score(h.top, top)), 4),
        "ari_two_levels": round(float(adjusted_rand_score(h.top * 10_000 + h.sub, second)), 4),
        "n_init": opts.n_init, "n_init_inner": opts.n_init_inner, "memory_mb": opts.memory_mb,
        "torch_threads": opts.torch_threads, "init": opts.init, "split_merge": args.split_merge,
        "root_distortion": fit_d, "planted_root_distortion": planted_d}
    _print_summary(tree, opts, args, res, mem, status_before)
    print(json.dumps(res))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
