"""Seconds of BMI's index on BBC (2,225 articles, K = 30, leaf 30, tf-idf + SVD vectors as ``+experiment=bbc``) by
``index.bmi.inputs``, side by side in one process, the arms alternating so that all see the same machine load.

    PYTHONPATH=$PWD python reports/bmi-inputs-cost.py [--docs 2225] [--reps 3]

The inputs are ``gdr bench overlap``'s: 15 generated queries a document drawn as runs of 6 of its own words, and as
the real queries the titles of every other article (BBC's train share is 0.5). Prints one JSON line per build and,
last, the best seconds of each input and their ratio to ``genq`` (``gdr plan`` scales BMI's measured
``index_bmi_doc``, a ``genq`` build, by that ratio: reports/plan-constants.json ``BMI_INPUTS_COST``).
"""
from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np

from gdr.bench.overlap import bench_corpus, write_inputs
from gdr.indexing.options import BMI_INPUTS, IndexBMI, IndexKMeans
from gdr.io import write_jsonl
from gdr.stages.index import build_index, queries_by_document
from gdr.stages.settings import IndexSettings


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser()
    ap.add_argument("--docs", type=int, default=2225)
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="bmi-inputs-"))
    corpus, queries = bench_corpus(args.docs, synthetic=False, seed=0)
    _, doc_queries = write_inputs(root, corpus, 64, 0)
    real = root / "real_queries.jsonl"
    write_jsonl(real, queries_by_document(queries.select(np.arange(0, len(queries), 2))))
    seconds: dict[str, list[float]] = {i: [] for i in BMI_INPUTS}
    for rep in range(args.reps):
        for inputs in BMI_INPUTS:
            settings = IndexSettings(method="bmi", n_clusters=30, leaf_size=30, progress=False, plot=False,
                                     kmeans=IndexKMeans(embedding="tfidf-svd", doc_queries=str(doc_queries)),
                                     bmi=IndexBMI(inputs=inputs, real_queries=str(real)))
            t0 = time.perf_counter()
            build_index(settings, root / f"{inputs}-{rep}", corpus=corpus)
            seconds[inputs].append(round(time.perf_counter() - t0, 3))
            print(json.dumps({"inputs": inputs, "rep": rep, "seconds": seconds[inputs][-1]}), flush=True)
    best = {i: min(s) for i, s in seconds.items()}
    out = {"docs": args.docs, "best_s": best, "ratio_to_genq": {i: round(b / best["genq"], 2) for i, b in best.items()}}
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    main()
