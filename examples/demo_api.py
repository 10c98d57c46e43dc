"""The steps of `make demo` through gdr's Python API, on the CPU: one JSON line last.

    python examples/demo_api.py                       # 80 BBC articles, J = 40, SmolLM2-135M: 4-5 minutes on 2 cores
    python examples/demo_api.py --docs 40 --queries 16 --out runs/api-small

BBC News articles without their headlines -> J sampled queries and P = log p(query | doc) -> generative
clustering against the five topics, with k-means on log P and on tf-idf beside it -> GC and HKmI docids ->
one small retriever on each, trained on headlines -> Recall@1 on held-out headlines, with BM25 as reference.
Every step writes into its own folder under --out and resumes there, so a second run reuses the work.

Time on 2 free CPU cores, from the demo's measured stage times (reports/pipeline/demo.md: scoring 144 queries
453 s, 20 epochs of a mini retriever ~100 s): scoring J = 40 ~130 s, two retrievers of 10 epochs ~100 s, the
rest ~30 s. Measured here only on a machine shared by ~20 busy processes (J = 48: 45 min wall, 887 CPU-s).
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

import gdr


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--docs", type=int, default=80, help="BBC articles (seeded sample)")
    ap.add_argument("--queries", type=int, default=40, help="J, the sampled queries that make P")
    ap.add_argument("--model", default="smollm2-135m", help="query generator: bundled name, hub id or path")
    ap.add_argument("--retriever", default="mini", help="retriever preset of conf/stage/train.yaml")
    ap.add_argument("--epochs", type=int, default=10)
    ap.add_argument("--max-steps", type=int, default=-1, help="> 0: stop training after this many steps")
    ap.add_argument("--processes", type=int, default=2, help="scoring processes (one per core on a CPU)")
    ap.add_argument("--baselines", default="tfidf,logp", help="k-means baselines of the clustering (+ embedding)")
    ap.add_argument("--out", default="runs/api-demo")
    args = ap.parse_args(argv)

    t0 = time.perf_counter()
    gdr.setup_logging()
    out = Path(args.out)
    data = {"name": "bbc", "n_docs": args.docs, "drop_title": True}
    corpus = gdr.load_corpus(**data)  # the articles without their headlines (the headlines become the queries)

    # 1. J sampled queries and the matrix P (Algorithm 1, lines 1-2); 2 single-thread processes on 2 cores
    lm = gdr.LMSettings(name=args.model, max_doc_tokens=64)
    p = gdr.score(corpus, lm, out / "score", n_queries=args.queries, sampling={"max_new_tokens": 12},
                  scoring={"shard_size": 8}, processes=args.processes, progress=True)

    # 2. generative clustering against the labels, k-means beside it
    clusters = gdr.evaluate_clusters(corpus, p, out / "cluster", repeats=3, n_init=5, gc={"alpha": "auto"},
                                     baselines=args.baselines.split(","))
    sizes = np.bincount(np.asarray(clusters["methods"]["GC"]["labels"]))

    # 3. docids: hierarchical GC on P, hierarchical k-means on sentence embeddings
    index = {"gc": gdr.build_index(out / "index-gc", method="gc", run=p, n_clusters=8, leaf_size=8,
                                   gc={"alpha": "auto"}),
             "hkmi": gdr.build_index(out / "index-hkmi", method="hkmi", corpus=corpus, n_clusters=8, leaf_size=8)}

    # 4. a retriever per docid scheme, trained on headlines, scored on held-out headlines; BM25 as reference
    titles = {"name": "titles", "data": data, "fractions": (0.5, 0.1, 0.4)}
    train_q, test_q = gdr.split_queries(corpus, "train", **titles), gdr.split_queries(corpus, "test", **titles)
    recall = {}
    for name, idx in index.items():
        res = gdr.train_retriever(corpus, idx["docids"], out / f"train-{name}", queries=train_q, size=args.retriever,
                                  optim={"warmup_steps": 20},
                                  trainer={"max_epochs": args.epochs, "max_steps": args.max_steps, "batch_size": 32,
                                           "val_beam": 8, "patience": 20, "monitor": "val/mrr",
                                           "tensorboard": False})
        metrics = gdr.evaluate(res.out_dir, corpus, test_q, out / f"eval-{name}", k=20, beam=20, bm25=False)
        recall[name] = metrics["systems"]["gdr"]["recall@1"]
    bm25 = gdr.bm25(corpus, test_q, out / "bm25", k=20)

    mean = {m: r["mean"] for m, r in clusters["methods"].items() if r.get("mean")}
    line = {"seconds": round(time.perf_counter() - t0, 1), "n_docs": len(corpus), "n_queries": args.queries,
            "n_test_queries": len(test_q),
            "gc_ari": round(float(mean["GC"]["ari"]), 2),
            "logp_kmeans_ari": round(float(mean["k-means (logp)"]["ari"]), 2) if "k-means (logp)" in mean else None,
            "gc_largest_cluster_share": round(float(sizes.max() / sizes.sum()), 4),
            "recall_at_1": round(100 * recall["gc"], 2), "hkmi_recall_at_1": round(100 * recall["hkmi"], 2),
            "bm25_recall_at_1": round(100 * bm25["recall@1"], 2)}
    print(json.dumps(line))
    return line


if __name__ == "__main__":
    main()
