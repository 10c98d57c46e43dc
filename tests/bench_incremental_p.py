"""Benchmark: one edited document in an N-document P (the per-document sampler), the incremental P against a
full rescore, at test size (the tiny random-init Llama of the tests, one CPU thread).

    PYTHONPATH=$PWD python tests/bench_incremental_p.py --docs 350 --out /tmp/bench-incp

Three runs: a full rescore of the corpus A, the corpus B (one document of A rewritten) incrementally from it, and
A again incrementally from B's run (the edit undone), which must equal the full rescore of A byte for byte (one
full rescore instead of two: at 350 documents one takes minutes). Prints the seconds of sampling and scoring of
each run (from their manifests), the pairs each scored and whether the bytes are equal; the LAST line is one JSON
object.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch
from tiny_models import tiny_llama

from gdr.data import Corpus
from gdr.io import read_manifest
from gdr.stages.score import score_corpus
from gdr.stages.settings import SampleSettings, ScoreSettings
from gdr.store import load_run

WORDS = "market bank rates oil football striker club cat mat rat earnings stocks europe golf tennis rain".split()


def _corpus(n: int, edited: int | None = None) -> Corpus:
    """``n`` documents of 12 words and an id, document ``edited`` rewritten."""
    texts = [" ".join(WORDS[(i * 7 + j * 3) % len(WORDS)] for j in range(12)) + f" item {i}" for i in range(n)]
    if edited is not None:
        texts[edited] = "an edited story about rain in spain and golf"
    return Corpus(name="bench", doc_ids=[f"d{i}" for i in range(n)], texts=texts)


def _run(lm, corpus: Corpus, out: Path, sample: SampleSettings, score: ScoreSettings, **kw) -> dict:
    t0 = time.perf_counter()
    score_corpus(corpus, lm, out, sample, score, progress=False, **kw)
    q, p = read_manifest(out, "queries.manifest.json"), read_manifest(out, "P.manifest.json")
    return {"wall_s": round(time.perf_counter() - t0, 2), "sample_s": q["seconds_last_call"],
            "score_s": p["seconds_last_call"], "pairs_scored": p["pairs_scored_last_call"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--docs", type=int, default=350)
    ap.add_argument("--per-doc", type=int, default=1, help="sample.p_per_doc")
    ap.add_argument("--out", type=Path, required=True, help="an empty folder for the three runs")
    a = ap.parse_args()
    torch.set_num_threads(1)
    lm = tiny_llama()
    sample = SampleSettings(p_per_doc=a.per_doc, batch_size=64, max_new_tokens=8, seed=0)
    score = ScoreSettings(shard_size=32, doc_batch_size=1, max_query_tokens=2048)
    A, B = _corpus(a.docs), _corpus(a.docs, edited=a.docs // 2)
    runs = {"full": _run(lm, A, a.out / "full", sample, score)}
    runs["edit"] = _run(lm, B, a.out / "edit", sample, score, reuse_from=a.out / "full")
    runs["undo"] = _run(lm, A, a.out / "undo", sample, score, reuse_from=a.out / "edit")
    for name, r in runs.items():
        print(f"{name:6s} sample {r['sample_s']:8.2f} s  score {r['score_s']:8.2f} s  pairs {r['pairs_scored']}")
    inc, full = load_run(a.out / "undo").logp, load_run(a.out / "full").logp
    same = bool(np.ascontiguousarray(inc).tobytes() == np.ascontiguousarray(full).tobytes())
    print(json.dumps({"docs": a.docs, "p_per_doc": a.per_doc, "byte_equal": same, **runs}))


if __name__ == "__main__":
    main()
