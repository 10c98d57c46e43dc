"""The sample that reports/query-end.py and reports/query-roundtrip.py measure: 4 queries from each of 12 BBC
articles (seed 0), drawn by gdr's decode loop with the bundled SmolLM2 and its two-shot prompt, on one CPU thread."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from gdr.data.bbc import load_bbc
from gdr.lm import GenerativeLM


@dataclass
class Sample:
    lm: GenerativeLM
    docs: list[str]
    rows: np.ndarray  # (48,) the article of each query
    out: torch.Tensor  # (48, max_new_tokens) the decode loop's tokens, a row's stop id kept, then padding
    stop: list[int]  # the stop ids
    first_stop: torch.Tensor  # (48,) where each row's first stop id is (max_new_tokens where it was cut)


def draw(max_new_tokens: int, max_doc_tokens: int) -> Sample:
    torch.set_num_threads(1)
    corpus = load_bbc()
    idx = np.random.default_rng(0).choice(len(corpus.texts), 12, replace=False)
    docs = [corpus.texts[i] for i in idx]
    lm = GenerativeLM("smollm2-135m", max_doc_tokens=max_doc_tokens, device="cpu")
    stop = lm._stop_ids()
    rows = np.repeat(np.arange(len(docs)), 4)
    out = lm.decoder().decode(lm.prompt_ids(docs), torch.as_tensor(rows), torch.arange(len(rows)),
                              torch.zeros(len(rows), dtype=torch.long), seed=0, max_new_tokens=max_new_tokens).cpu()
    stops = torch.isin(out, torch.tensor(stop))
    first = torch.where(stops.any(1), stops.int().argmax(1), out.shape[1])
    return Sample(lm, docs, rows, out, stop, first)
