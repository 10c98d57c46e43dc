"""A short calibration of this CPU for ``gdr plan device=cpu``: a few timed batches of each step a ``gdr run``
spends its time in, at the run's shapes and thread counts, so that the plan predicts this machine rather than
default fractions of a roofline.

Each step is timed once warm (a first, untimed call pays the lazy initialisation) on the run's own models:

- ``lm_load_s``: loading the query generator (``model.name``), as every process that samples or scores does;
- ``sampling_s_per_query``: one batch of ``sample_batch`` queries (the run's batch, at most the run's J and
  :data:`SAMPLE_QUERIES`) drawn over as many of the run's documents (each row its own prompt, as in the run),
  ``model.max_doc_tokens`` and ``sample.max_new_tokens`` as the run sets them, with the
  run's threads; ``doc_queries_s_per_query``: one batch of the doc-queries stage, ``doc_query_docs`` documents of
  ``per_doc`` queries each (the stage's ``batch_size // per_doc``), the prompt prefilled once per document;
- ``scoring_s_per_pair``: one document against ``score_queries`` queries of ``sample.max_new_tokens`` tokens (the
  run's J, at most one packed chunk), with the threads one scoring process has (1 when ``score.processes`` > 1,
  as gdr/stages/score.py gives each worker): a document's prompt and the chunk's attention are paid as the run
  pays them;
- ``training_s_per_example``: the median of a few optimiser steps of the retriever preset (random-init encoder:
  the speed is the architecture's) at the run's CPU batch and the padded width the plan uses, with the threads
  training takes (:func:`gdr.stages.train.training_threads`);
- ``search_s_per_query``: constrained beam search at ``evaluate.beam`` over random docids of the run's shape;
- ``retriever_setup_s``: building the retriever's architecture (without reading the encoder's weights).

The figures are cached per machine and shapes under ``$GDR_CACHE/plan-calibration/`` (the key: host name, CPU
count, torch version and the shapes), so a second plan reads them, with the load average they were timed at (a
busy machine times slow: ``gdr plan ... --recalibrate`` times again). Total budget: a few seconds on tiny models,
<= 30 s for SmolLM2 and ``small30m`` on 2 cores.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import platform
import time
from pathlib import Path
from typing import Sequence

import numpy as np
import torch
import torch.nn.functional as F

from gdr.indexing.trie import build_trie
from gdr.models import cache_dir
from gdr.stages.settings import LMSettings
from gdr.training.model import GenerativeRetriever
from gdr.training.search import constrained_beam_search

log = logging.getLogger(__name__)

__all__ = ["calibrate_cpu", "calibration_path"]

SAMPLE_QUERIES = 64  # at most this many queries in the timed sampling batch (a CPU run's batch: 64)
SCORE_QUERIES = 192  # at most this many queries in the timed scoring batch (one document)
TRAIN_STEPS = 5      # timed optimiser steps (their median: one step is ~1 s on 2 cores, and noisy)
SEARCH_QUERIES = 16  # queries in the timed search batch
# A document of plain news prose: the sampled queries end as real ones do (a made-up text makes the LM end early
# and redraw)
DOC = ("The government has announced plans to cut the cost of public transport for students and pensioners from "
       "next spring, after months of talks with the rail and bus companies. Ministers said the scheme would be paid "
       "for by savings elsewhere in the budget, while opposition parties questioned whether the money would last "
       "beyond the first year. Union leaders welcomed the move but warned that services in rural areas were still "
       "being cut, and that fares for other passengers had risen faster than wages for a decade. ")


def _shapes_key(shapes: dict) -> str:
    ident = {"host": platform.node(), "cpus": os.cpu_count(), "torch": torch.__version__, **shapes}
    return hashlib.sha256(json.dumps(ident, sort_keys=True, default=str).encode()).hexdigest()[:16]


def calibration_path(shapes: dict) -> Path:
    """The cache file of a calibration at ``shapes`` on this machine."""
    return cache_dir() / "plan-calibration" / f"{_shapes_key(shapes)}.json"


def calibrate_cpu(shapes: dict, retriever_config, refresh: bool = False, texts: Sequence[str] | None = None
                  ) -> tuple[dict[str, float], Path, bool]:
    """(figures, their cache file, whether they were read from the cache) of this CPU at ``shapes``: the
    ``model`` name, ``doc_tokens``, ``new_tokens``, ``threads`` (None: torch's default), ``sample_batch``,
    ``per_doc`` and ``doc_query_docs`` (the doc-queries stage's batch), ``score_threads``, ``score_queries``,
    ``train_threads``, ``batch`` (training), ``width`` (training input positions), ``beam``, ``n_docs``,
    ``n_digits``, ``depth``;
    ``retriever_config``: the run's :class:`gdr.training.model.RetrieverConfig` with its docid sizes; ``texts``: the
    run's first documents (the LM's inputs) to sample from and score, else :data:`DOC` (a real corpus decodes
    slower than the stand-in: 5.4 against 3.7 s for one doc-queries batch of the demo)."""
    path = calibration_path(shapes)
    if path.is_file() and not refresh:
        return json.loads(path.read_text(encoding="utf-8"))["figures"], path, True
    threads_before = torch.get_num_threads()
    load, t0 = os.getloadavg()[0], time.perf_counter()
    try:
        figures = {**_lm_figures(shapes, texts), **_retriever_figures(shapes, retriever_config)}
    finally:
        torch.set_num_threads(threads_before)
    # what else ran meanwhile: a figure timed on a busy machine predicts a busy machine
    figures["load_average"] = round(max(load, os.getloadavg()[0]), 1)
    figures["calibration_s"] = round(time.perf_counter() - t0, 1)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"shapes": shapes, "figures": figures}, default=str), encoding="utf-8")
    tmp.replace(path)
    return figures, path, False


def _timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def _doc_text(n_words: int) -> str:
    """``n_words`` words of :data:`DOC`, repeated as needed (the prompt is cut to ``model.max_doc_tokens``)."""
    words = DOC.split()
    return " ".join(words[i % len(words)] for i in range(n_words))


def _lm_figures(s: dict, texts: Sequence[str] | None) -> dict[str, float]:
    """Load, sampling and scoring of the query generator, on ``texts`` (None: :data:`DOC`)."""
    spec = LMSettings(name=str(s["model"]), max_doc_tokens=int(s["doc_tokens"]), device="cpu",
                      threads=s["threads"])
    t0 = time.perf_counter()
    lm = spec.build()
    load = time.perf_counter() - t0
    n_docs = max(1, int(s["doc_query_docs"]))
    docs = ([texts[i % len(texts)] for i in range(n_docs)] if texts else
            [_doc_text(4 * int(s["doc_tokens"]) + i) for i in range(n_docs)])
    doc = docs[0]
    new = int(s["new_tokens"])

    sources = list(texts[:int(s["sample_batch"])]) if texts else [doc]  # a batch of many prompts, as the run's

    def sample(n: int):
        return lm.sample_queries(sources, n, seed=0, batch_size=n, max_new_tokens=new, progress=False, compile=False)

    sample(2)  # untimed: lazy initialisation
    n = max(1, min(int(s["sample_batch"]), SAMPLE_QUERIES))
    sampling = _timed(lambda: sample(n)) / n
    per_doc = int(s["per_doc"])
    figures = {}
    if per_doc:
        figures["doc_queries_s_per_query"] = _timed(lambda: lm.sample_per_doc(
            docs, per_doc, max_new_tokens=new, max_rows=n_docs * per_doc)) / (n_docs * per_doc)
    words = DOC.split()
    n_q = max(2, min(int(s["score_queries"]), SCORE_QUERIES))
    queries = [" ".join(words[(i + k) % len(words)] for k in range(max(1, new - 2))) for i in range(n_q)]
    torch.set_num_threads(int(s["score_threads"]))
    lm.score([doc], queries[:2], progress=False)
    scoring = _timed(lambda: lm.score([doc], queries, progress=False)) / n_q
    return {"lm_load_s": load, "sampling_s_per_query": sampling, "scoring_s_per_pair": scoring, **figures}


def _retriever_figures(s: dict, config) -> dict[str, float]:
    """Set-up, training steps and beam search of the retriever (random-init weights: the speed is the shape's)."""
    torch.set_num_threads(int(s["train_threads"]))
    t0 = time.perf_counter()
    torch.manual_seed(0)
    model = GenerativeRetriever.build(type(config).from_dict(config.to_dict()))  # the encoder's architecture only
    setup = time.perf_counter() - t0
    rng = np.random.default_rng(0)
    K, depth, batch, width = int(s["n_digits"]), int(s["depth"]), int(s["batch"]), max(1, round(s["width"]))
    vocab = model.encoder.get_input_embeddings().weight.shape[0]
    ids = torch.as_tensor(rng.integers(1000, vocab, (batch, width)))  # (B, S)
    mask = torch.ones_like(ids)
    labels = torch.as_tensor(rng.integers(0, K, (batch, depth)))  # (B, T)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step():
        logits = model(ids, mask, labels)  # (B, T, K + 1)
        loss = F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten())
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    model.train()
    step()  # untimed: lazy initialisation
    train = float(np.median([_timed(step) for _ in range(TRAIN_STEPS)])) / batch
    model.eval()
    n_docs = max(int(s["n_docs"]), 2)
    flat = rng.choice(K ** depth, size=min(n_docs, K ** depth), replace=False)
    codes = (flat[:, None] // K ** np.arange(depth - 1, -1, -1)[None, :]) % K  # (n_docs, depth)
    trie = build_trie([tuple(int(x) for x in row) for row in codes], n_digits=K)
    q_ids, q_mask = ids[:SEARCH_QUERIES, :16], mask[:SEARCH_QUERIES, :16]
    beam = int(s["beam"])
    with torch.inference_mode():
        constrained_beam_search(model, q_ids[:2], q_mask[:2], trie, beam=beam)
        search = _timed(lambda: constrained_beam_search(model, q_ids, q_mask, trie, beam=beam)) / len(q_ids)
    return {"retriever_setup_s": setup, "training_s_per_example": train, "search_s_per_query": search}
