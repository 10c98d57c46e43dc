"""Benchmark: the GIL cost of a host stage in the background thread (``gdr run`` with ``overlap``).

    gdr bench overlap                      # 300 BBC articles, 3 repeats of every host stage
    gdr bench overlap --docs 2225 --queries 1024 --K 30 --stages index-gc,index-hkmi,index-random,bm25  # BBC's shape
    gdr bench overlap --smoke              # tiny sizes, one repeat (the test's run)

With ``overlap`` (``auto``: on CUDA) ``gdr run`` runs its host stages (the flat clustering and its k-means baselines,
the indexes, BM25) in one background thread (:class:`gdr.stages.overlap.HostStages`) while the main thread feeds the
GPU. Feeding a GPU is Python dispatching kernels, which needs the GIL; a host stage that holds the GIL (Python loops,
bookkeeping) slows that dispatch and idles the GPU, one inside numpy, faiss, torch or bm25s kernels (which release
it) does not. ``gdr plan`` assumes the latter. This benchmark measures it on the CPU:

- the main thread runs a proxy of GPU dispatch: a tiny model's training step (5 linear layers of 32, GELU,
  LayerNorm, cross-entropy, backward, AdamW, batch 8) at one torch thread, bound by Python and the dispatcher the
  way a CUDA step is from the host's side; its rate (steps/s) is timed;
- each host stage runs through the production path, :meth:`HostStages.start` with the job ``gdr run`` gives it
  (:meth:`gdr.pipeline.Pipeline.stage` of the stage's build: :func:`gdr.stages.cluster.cluster_run`,
  :func:`gdr.stages.index.build_index`, :func:`gdr.stages.bm25.bm25_baseline`), on a few hundred BBC articles
  (titles dropped; their titles are BM25's queries), P of random numbers with the labels' structure planted (the
  shape of the score stage's), and 15 generated queries a document drawn from its own words (BMI's input, with
  the titles of half the articles as its real queries and segments of the texts, as in +experiment=bbc);
- for each stage, interleaved ``alone, beside, alone, beside, ..., alone`` so that a change in the machine's load
  moves both: the proxy's rate beside the stage over its rate alone in the windows on either side (``ratio``). The
  scheduler's account of the main thread (``/proc/self/task/<tid>/schedstat``) splits each window into seconds on a
  CPU, runnable in the queue and asleep, which for the proxy (no I/O) is waiting for the GIL: ``free`` is the ratio
  without the run queue and the shared core (the proxy's CPU seconds a step alone over those plus its extra GIL
  wait a step beside), ``lost s`` the main loop's seconds lost over the stage at that ratio. Two controls bracket
  the scale: a numpy matmul loop (releases the GIL: ``free`` ~1) and a pure-Python loop (holds it: the worst case).

Run it on a quiet machine (the load average is printed and kept in the JSON; a warning says when it is high): a
background thread that the OS deschedules for other jobs holds the GIL less often, so a busy machine makes every
stage look cheaper (on the 2-core box, the GC index came out at 0.92 free under a load of 3 and 0.53 quiet). A
thread that holds the GIL costs the main thread more than its share of the time: the proxy releases the GIL at
every operator call and the Python thread takes it each time, for up to the switch interval (``sys.getswitchinterval``,
5 ms; ``--switch-interval`` sets it), so a pure-Python stage nearly stops the proxy (the "convoy effect").

Threads: torch, numpy's BLAS (threadpoolctl), faiss and the tokenizers run at one thread, so on a 2-core machine the
proxy and the stage each have a core; on the GPU machine's 16 cores the competition for cores is gone and what is
left is the GIL share this measures. The clustering runs on the CPU here (on CUDA ``gdr run`` runs its kernels on the
GPU from the background thread: not measured here). Each stage runs once untimed first (imports, the embedding
model's load: once per process in a run). The last line is one JSON object; no figure here is asserted by a test.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Callable

import numpy as np
import torch
import torch.nn.functional as F

from gdr.bench.common import emit
from gdr.data import Corpus, QuerySet, load_corpus
from gdr.device import machine_record
from gdr.indexing.options import IndexBMI, IndexKMeans
from gdr.io import write_jsonl
from gdr.pipeline import Pipeline
from gdr.rules import POSITIVE, number, option_type, seed
from gdr.stages.bm25 import bm25_baseline
from gdr.stages.cluster import cluster_run
from gdr.stages.index import build_index, queries_by_document
from gdr.stages.overlap import HostStages, Priority
from gdr.stages.settings import ClusterSettings, IndexSettings
from gdr.store import load_run

STAGES = ("cluster", "index-gc", "index-hkmi", "index-bmi", "index-random", "bm25")
CONTROLS = ("control-numpy", "control-python")  # releases the GIL / holds it
PER_DOC = 15  # generated queries a document (BBC's doc_queries.per_doc)
SLOW = 0.8  # a stage whose proxy ratio is below this holds the GIL enough to matter


# ---------------------------------------------------------------------------- the main thread's proxy
def proxy_step(seed: int = 0) -> Callable[[], None]:
    """One training step of a tiny model (see the module): microseconds of arithmetic under each of ~100 operator
    calls and the Python around them, as a CUDA step looks from the host."""
    g = torch.Generator().manual_seed(seed)
    layers: list[torch.nn.Module] = []
    for _ in range(4):
        layers += [torch.nn.Linear(32, 32), torch.nn.GELU(), torch.nn.LayerNorm(32)]
    model = torch.nn.Sequential(*layers, torch.nn.Linear(32, 8))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x, y = torch.randn(8, 32, generator=g), torch.randint(0, 8, (8,), generator=g)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(model(x), y).backward()
        opt.step()

    return step


def _sched() -> tuple[float, float] | None:
    """The calling thread's seconds on a CPU and seconds runnable but waiting for one (Linux's
    ``/proc/self/task/<tid>/schedstat``); None where there is no such file."""
    try:
        with open(f"/proc/self/task/{threading.get_native_id()}/schedstat", encoding="ascii") as f:
            on_cpu, queued = f.read().split()[:2]
    except (OSError, ValueError):
        return None
    return int(on_cpu) / 1e9, int(queued) / 1e9


class Window:
    """One timed window of the proxy in the main thread: its steps, wall seconds and, from the scheduler, its
    seconds on a CPU, runnable in the queue (the cores taken by others) and the rest: asleep, which for a proxy that
    does no I/O is waiting for the GIL."""

    def __init__(self):
        self.steps, self._s0, self._t0 = 0, _sched(), time.perf_counter()

    def close(self) -> Window:
        self.wall = time.perf_counter() - self._t0
        s1 = _sched()
        if self._s0 is None or s1 is None:
            self.cpu = self.queued = self.waited = None
        else:
            self.cpu, self.queued = s1[0] - self._s0[0], s1[1] - self._s0[1]
            self.waited = max(self.wall - self.cpu - self.queued, 0.0)
        return self

    @property
    def rate(self) -> float:
        return self.steps / self.wall


def window_alone(step: Callable[[], None], seconds: float) -> Window:
    """The proxy for about ``seconds`` with nothing beside it."""
    w = Window()
    while True:
        step()
        w.steps += 1
        if time.perf_counter() - w._t0 >= seconds:
            return w.close()


def window_beside(step: Callable[[], None], name: str, job: Callable[[], object], priority: int) -> tuple[Window, dict]:
    """The proxy while ``job`` runs as the host stage ``name`` in the background thread (:meth:`HostStages.start`,
    as ``gdr run`` starts it), from the job's start to its end; and the stage's wall and CPU seconds in that
    thread."""
    began, ended = threading.Event(), threading.Event()
    spent: dict = {}

    def timed() -> object:
        spent["cpu0"], spent["t0"] = time.thread_time(), time.perf_counter()
        began.set()
        try:
            return job()
        finally:
            spent["cpu"], spent["t1"] = time.thread_time() - spent["cpu0"], time.perf_counter()
            ended.set()

    host = HostStages([], enabled=True)
    with host.running():
        host.start(name, timed, priority)
        began.wait()
        w = Window()
        while not ended.is_set():
            step()
            w.steps += 1
        w.close()
        host.take(name)  # its error, if it failed
    return w, {"seconds": spent["t1"] - spent["t0"], "cpu_s": spent["cpu"]}


# ---------------------------------------------------------------------------- the stages' inputs
def bench_corpus(n_docs: int, synthetic: bool, seed: int) -> tuple[Corpus, QuerySet]:
    """``n_docs`` BBC articles without their titles (labelled by topic) and their titles as test queries, each
    relevant to its article; with ``synthetic``, texts drawn from a small vocabulary (no data needed)."""
    if synthetic:
        rng = np.random.default_rng(seed)
        topics = [f"topic{t}" for t in range(5)]
        vocab = np.array([f"w{i}" for i in range(400)])
        labels = [topics[i % 5] for i in range(n_docs)]
        words = rng.integers(0, len(vocab), size=(n_docs, 60)) // 5 * 5 + np.arange(n_docs)[:, None] % 5
        texts = [" ".join(vocab[row]) for row in words]
        titles = [" ".join(vocab[row[:6]]) for row in words]
        ids = [f"d{i}" for i in range(n_docs)]
    else:
        full = load_corpus("bbc", n_docs=n_docs, seed=seed)
        ids, texts, labels = full.doc_ids, full.texts, full.labels
        titles = [t or x[:60] for t, x in zip(full.titles or [None] * len(ids), texts)]
    corpus = Corpus(name="bbc-bench", doc_ids=ids, texts=texts, labels=labels)
    queries = QuerySet(name="bbc-bench-titles", qids=[f"t{i}" for i in range(len(ids))], texts=titles,
                       relevant=[[d] for d in ids], splits=["test"] * len(ids))
    return corpus, queries


def write_inputs(root: Path, corpus: Corpus, n_queries: int, seed: int) -> tuple[Path, Path]:
    """A score folder (``P.npy`` float32 of shape (documents, ``n_queries``), ``doc_ids.json``, ``queries.jsonl``)
    whose P plants the corpus's labels (each query has a home topic whose documents score it higher), and BMI's
    ``doc_queries.jsonl`` (``PER_DOC`` runs of 6 words of each document's own text)."""
    rng = np.random.default_rng(seed)
    names, label = np.unique(np.asarray(corpus.labels), return_inverse=True)
    n = len(corpus.doc_ids)
    home = rng.integers(0, len(names), n_queries)
    logp = (rng.uniform(-70, -40, n_queries)[None, :] + 4.0 * (label[:, None] == home[None, :])
            + rng.normal(0.0, 3.0, (n, 1)) + rng.normal(0.0, 3.0, (n, n_queries))).astype(np.float32)
    score = root / "score"
    score.mkdir(parents=True)
    np.save(score / "P.npy", logp)
    (score / "doc_ids.json").write_text(json.dumps(corpus.doc_ids))
    source = rng.integers(0, n, n_queries)
    words = [t.split() or ["empty"] for t in corpus.texts]
    (score / "queries.jsonl").write_text("".join(
        json.dumps({"qid": str(j), "text": " ".join(words[s][:6]) + f" q{j}", "source_index": int(s)}) + "\n"
        for j, s in enumerate(source)))
    dq = root / "doc_queries.jsonl"
    with open(dq, "w", encoding="utf-8") as f:
        for d, w in zip(corpus.doc_ids, words):
            starts = rng.integers(0, max(len(w) - 6, 1), PER_DOC)
            f.write(json.dumps({"doc_id": d, "queries": [" ".join(w[s:s + 6]) for s in starts]}) + "\n")
    return score, dq


def stage_jobs(root: Path, corpus: Corpus, queries: QuerySet, score: Path, doc_queries: Path, k: int,
               repeats: int, n_init: int) -> dict[str, tuple[Callable[[str], object], int]]:
    """Per host stage, (a function of a run tag that runs it as ``gdr run``'s job does: ``Pipeline.stage`` of its
    build, in a folder of its own per tag; its :class:`Priority`)."""
    cluster = ClusterSettings(repeats=repeats, n_init=n_init)

    def cluster_build(folder: Path) -> dict:
        result, _ = cluster_run(corpus, load_run(score, require_manifest=False), folder, cluster, device="cpu")
        return {"n_docs": result["n_docs"]}

    real = root / "real_queries.jsonl"  # BMI's real queries as bbc's: the titles of half the articles, its train share
    write_jsonl(real, queries_by_document(queries.select(np.arange(0, len(queries), 2))))

    def index_build(method: str) -> Callable[[Path], dict]:
        km = IndexKMeans(embedding="tfidf-svd", doc_queries=str(doc_queries) if method == "bmi" else None)  # as bbc
        bmi = IndexBMI(inputs="realq_genq_docseg", real_queries=str(real))
        settings = IndexSettings(method=method, n_clusters=k, leaf_size=k, kmeans=km, bmi=bmi)

        def build(folder: Path) -> dict:
            s = build_index(settings, folder, corpus=corpus, run=str(score) if method == "gc" else None)
            return {"depth_max": s.get("depth_max")}
        return build

    def bm25_build(folder: Path) -> dict:
        return bm25_baseline(corpus, queries, folder, split="test")

    builds = {"cluster": (cluster_build, Priority.CLUSTER), "bm25": (bm25_build, Priority.BM25)}
    for method in ("gc", "hkmi", "bmi", "random"):
        builds[f"index-{method}"] = (index_build(method), Priority.INDEX)
    run = root / "run"  # a Pipeline of its own for each stage, as gdr.pipeline._start gives it
    return {name: (lambda tag, name=name, build=build: Pipeline(run).stage(name, {"tag": tag}, build), int(priority))
            for name, (build, priority) in builds.items()}


def control_jobs(seconds: float) -> dict[str, tuple[Callable[[str], object], int]]:
    """The two controls, each busy for ``seconds``: 256 x 256 matmuls in numpy (the GIL released) and a Python loop
    (the GIL held)."""
    a = np.random.default_rng(0).standard_normal((256, 256)).astype(np.float32)

    def numpy_loop(tag: str) -> float:
        t0, x = time.perf_counter(), a
        while time.perf_counter() - t0 < seconds:
            x = a @ a
        return float(x[0, 0])

    def python_loop(tag: str) -> int:
        t0, s = time.perf_counter(), 0
        while time.perf_counter() - t0 < seconds:
            for i in range(1000):
                s += i * i
        return s

    return {"control-numpy": (numpy_loop, 0), "control-python": (python_loop, 0)}


# ---------------------------------------------------------------------------- the measurement
def one_thread() -> dict:
    """torch, numpy's BLAS, faiss and the tokenizers at one thread each (see the module); what was set."""
    torch.set_num_threads(1)
    out = {"torch": torch.get_num_threads()}
    try:
        from threadpoolctl import threadpool_limits  # optional (scikit-learn's dependency)
        threadpool_limits(1)
        out["blas"] = 1
    except ImportError:
        out["blas"] = None
    try:
        import faiss  # optional: gdr's indexing extra
        faiss.omp_set_num_threads(1)
        out["faiss"] = 1
    except ImportError:
        out["faiss"] = None
    return out


def _per_step(ws: list[Window], what: str) -> float | None:
    if any(getattr(w, what) is None for w in ws):
        return None
    return sum(getattr(w, what) for w in ws) / sum(w.steps for w in ws)


def compare(alone: tuple[Window, Window], beside: Window) -> dict:
    """One repeat: the rate beside over the mean of the alone windows on either side (``ratio``); the share of the
    beside window the main thread waited for the GIL, less that alone (``gil_wait_share``); and ``free_ratio``, the
    ratio without the run queue and the shared core (on a quiet machine, see the module): the proxy's CPU seconds a
    step alone over those plus its extra GIL wait a step beside."""
    ratio = beside.rate / ((alone[0].rate + alone[1].rate) / 2)
    cpu, wait_alone = _per_step(list(alone), "cpu"), _per_step(list(alone), "waited")
    wait = _per_step([beside], "waited")
    if cpu is None or wait is None or wait_alone is None:
        return {"ratio": ratio, "gil_wait_share": None, "free_ratio": None}
    extra = max(wait - wait_alone, 0.0)
    share = beside.waited / beside.wall - sum(w.waited for w in alone) / sum(w.wall for w in alone)
    return {"ratio": ratio, "gil_wait_share": share, "free_ratio": cpu / (cpu + extra)}


def _summary(values: list[float | None]) -> tuple[float | None, list[float] | None]:
    if any(v is None for v in values):
        return None, None
    return round(statistics.median(values), 3), [round(v, 3) for v in values]


def measure(step: Callable[[], None], jobs: dict, repeats: int, alone_s: float, on_row=None) -> dict:
    """Per job, ``repeats`` interleaved pairs (alone, beside), one alone window more at the end (:func:`compare`
    with the windows on either side). Each job runs once untimed first."""
    out = {}
    for name, (job, priority) in jobs.items():
        job("warm-up")
        alone = [window_alone(step, alone_s)]
        beside, runs = [], []
        for r in range(repeats):
            w, b = window_beside(step, name, lambda r=r, job=job: job(f"repeat-{r}"), priority)
            alone.append(window_alone(step, min(max(b["seconds"], 0.5), alone_s)))
            beside.append(w)
            runs.append(b)
        each = [compare((a0, a1), b) for b, a0, a1 in zip(beside, alone, alone[1:])]
        ratio, ratios = _summary([e["ratio"] for e in each])
        free, frees = _summary([e["free_ratio"] for e in each])
        share, shares = _summary([e["gil_wait_share"] for e in each])
        seconds = statistics.median(b["seconds"] for b in runs)
        out[name] = {"ratio": ratio, "ratios": ratios, "free_ratio": free, "free_ratios": frees,
                     "gil_wait_share": share, "gil_wait_shares": shares,
                     "alone_steps_per_s": round(statistics.median(w.rate for w in alone), 1),
                     "beside_steps_per_s": round(statistics.median(w.rate for w in beside), 1),
                     "seconds": round(seconds, 3), "cpu_s": round(statistics.median(b["cpu_s"] for b in runs), 3),
                     "main_cpu_share": None if beside[0].cpu is None else
                     round(statistics.median(w.cpu / w.wall for w in beside), 3),
                     "lost_share": round(1.0 - ratio, 3), "lost_s": round((1.0 - ratio) * seconds, 3),
                     "free_lost_s": None if free is None else round((1.0 - free) * seconds, 3)}
        if on_row:
            on_row(name, out[name])
    return out


def _spread(values: list[float] | None) -> str:
    return "-" if values is None else f"{min(values):.2f}-{max(values):.2f}"


def _num(x: float | None, fmt: str) -> str:
    return "-" if x is None else format(x, fmt)


HEADER = (f"{'stage':15s} {'stage s':>8s} {'cpu s':>7s} {'alone/s':>8s} {'beside/s':>8s} {'ratio':>6s} "
          f"{'spread':>10s} {'GIL wait':>8s} {'free':>6s} {'spread':>10s} {'lost s':>7s}")


def _row(name: str, r: dict) -> str:
    return (f"{name:15s} {r['seconds']:8.2f} {r['cpu_s']:7.2f} {r['alone_steps_per_s']:8.0f} "
            f"{r['beside_steps_per_s']:8.0f} {r['ratio']:6.2f} {_spread(r['ratios']):>10s} "
            f"{_num(r['gil_wait_share'] and 100 * r['gil_wait_share'], '7.0f')}% {_num(r['free_ratio'], '6.2f')} "
            f"{_spread(r['free_ratios']):>10s} {_num(r['free_lost_s'], '7.2f')}")


def machine() -> dict:
    """What ran the benchmark (:func:`gdr.device.machine_record`), its cores and the load average at the start."""
    return {**machine_record(), "cores": os.cpu_count(), "load_avg": [round(x, 2) for x in os.getloadavg()]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="gdr bench overlap", description=__doc__.split("\n\n")[0])
    ap.add_argument("--docs", type=option_type(POSITIVE), default=300, help="BBC articles (default 300)")
    ap.add_argument("--queries", type=option_type(POSITIVE),
                    default=256, help="columns of the synthetic P (default 256)")
    ap.add_argument("--K", type=option_type(POSITIVE), default=10,
                    help="index n_clusters = leaf_size (default 10: depth 2 at 300 articles, as K = 30 at BBC's 2,225)")
    ap.add_argument("--cluster-repeats", type=option_type(POSITIVE), default=2, help="cluster.repeats (default 2)")
    ap.add_argument("--cluster-n-init", type=option_type(POSITIVE), default=10, help="cluster.n_init (default 10)")
    ap.add_argument("--repeats", type=option_type(POSITIVE), default=3, help="beside runs of each stage (default 3)")
    ap.add_argument("--alone-s", type=option_type(number(0), float),
                    default=3.0, help="the longest alone window, seconds (default 3)")
    ap.add_argument("--control-s", type=option_type(number(0), float),
                    default=2.0, help="seconds of each control (default 2)")
    ap.add_argument("--stages", default=",".join(STAGES + CONTROLS), help="comma-separated stages and controls")
    ap.add_argument("--synthetic", action="store_true", help="a synthetic corpus instead of BBC (no data needed)")
    ap.add_argument("--smoke", action="store_true",
                    help="tiny sizes: 40 synthetic documents, 32 queries, one repeat, short windows")
    ap.add_argument("--switch-interval", type=option_type(number(0), float), default=None,
                    help="sys.setswitchinterval for the run: how long a thread may hold the GIL while another waits "
                         "(Python's default: 0.005 s)")
    ap.add_argument("--seed", type=option_type(seed), default=0)
    ap.add_argument("--tmp", default=None, help="folder for the inputs and stage folders (default: a temporary one)")
    args = ap.parse_args(argv)
    if args.smoke:
        args.docs, args.queries, args.K, args.repeats = 40, 32, 5, 1
        args.cluster_repeats, args.cluster_n_init, args.alone_s, args.control_s = 1, 2, 0.3, 0.3
        args.synthetic = True
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    os.environ["TOKENIZERS_PARALLELISM"] = "false"  # the tokenizers' own threads, before the first encode
    threads = one_thread()
    if args.switch_interval is not None:
        sys.setswitchinterval(args.switch_interval)
    wanted = [s for s in args.stages.split(",") if s]
    unknown = sorted(set(wanted) - set(STAGES + CONTROLS))
    if unknown:
        raise SystemExit(f"gdr bench overlap: unknown --stages {', '.join(unknown)}; "
                         f"choose from {', '.join(STAGES + CONTROLS)}")
    out: dict = {"machine": machine(), "threads": threads, "switch_interval": sys.getswitchinterval(),
                 "docs": args.docs, "queries": args.queries,
                 "K": args.K, "repeats": args.repeats, "synthetic": args.synthetic,
                 "proxy": "tiny model training step (4 x [linear 32, GELU, LayerNorm], linear 8, AdamW, batch 8)"}
    with tempfile.TemporaryDirectory(dir=args.tmp) as tmp:
        root = Path(tmp)
        corpus, queries = bench_corpus(args.docs, args.synthetic, args.seed)
        score, dq = write_inputs(root, corpus, args.queries, args.seed)
        jobs = {**stage_jobs(root, corpus, queries, score, dq, args.K, args.cluster_repeats, args.cluster_n_init),
                **control_jobs(args.control_s)}
        jobs = {name: jobs[name] for name in wanted}
        step = proxy_step(args.seed)
        window_alone(step, 0.2)  # warm-up
        print(f"{len(corpus.doc_ids)} documents, P {len(corpus.doc_ids)} x {args.queries}, K {args.K}, "
              f"{args.repeats} repeats; threads {threads}; {out['machine']['cpu']}, {out['machine']['cores']} cores",
              flush=True)
        print(HEADER, flush=True)
        out["stages"] = measure(step, jobs, args.repeats, args.alone_s,
                                on_row=lambda n, r: print(_row(n, r), flush=True))
    slow = sorted(n for n, r in out["stages"].items()
                  if n not in CONTROLS and (r["free_ratio"] if r["free_ratio"] is not None else r["ratio"]) < SLOW)
    out["slow"] = slow
    out["load_avg_end"] = [round(x, 2) for x in os.getloadavg()]
    busy = max(out["machine"]["load_avg"][0], out["load_avg_end"][0])
    if busy > max((os.cpu_count() or 1) - 1, 1):
        print(f"warning: the machine was busy (load average {busy:.1f} on {os.cpu_count()} cores): a busy machine "
              "makes a stage's GIL cost look smaller; rerun on a quiet one", flush=True)
    print("ratio: the proxy's steps/s beside the stage over alone, here (median of the repeats; spread: min-max). "
          "GIL wait: the share of the stage's time the main thread slept waiting for the GIL (less that alone). "
          "free: the ratio without the run queue and the shared core (the proxy's CPU time a step alone over it plus "
          "its GIL wait a step beside); lost s: the main loop's seconds lost over the stage at that ratio. "
          f"Below {SLOW} free: "
          f"{', '.join(slow) or 'none'}.", flush=True)
    emit(out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
