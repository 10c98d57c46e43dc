"""How a sampled query ends, and what P's end term was worth (reports/query-end.md).

Samples 4 queries from each of 12 BBC articles (seed 0) with the bundled SmolLM2 and its two-shot prompt, reads
from the decode loop's own tokens whether each stopped at the end-of-sequence token, at a token that ends a line, or at
max_new_tokens, then computes from the model's logits, for every (document, query) pair, log p(end-of-sequence)
and log p(any stop id) after the query: their mean under the query's own document and their spread over documents.

    python reports/query-end.py MAX_NEW_TOKENS MAX_DOC_TOKENS      # 12 64 (the demo), 32 64 (the default)
"""
from __future__ import annotations

import sys
from collections import Counter

import numpy as np
import torch
from sampled_queries import draw

from gdr.lm import clean_query

max_new, max_doc = int(sys.argv[1]), int(sys.argv[2])
sample = draw(max_new, max_doc)
lm, docs, rows, out, stop = sample.lm, sample.docs, sample.rows, sample.out, sample.stop
print(f"{len(stop)} stop ids, eos {lm.eos_id}:", [lm.tokenizer.decode([s]) for s in stop[:8]], "...")
reason = ["length" if w == out.shape[1] else ("eos" if int(r[w]) == lm.eos_id else "line-end")
          for r, w in zip(out, sample.first_stop.tolist())]
queries = [clean_query(t) for t in lm.tokenizer.batch_decode(out, skip_special_tokens=True)]
print("reasons", Counter(reason))
p_ids = lm.prompt_ids(docs)
q_ids = lm.tokenizer(queries, add_special_tokens=False)["input_ids"]
eos_term = np.zeros((len(docs), len(rows)))
stop_term = np.zeros_like(eos_term)
with torch.inference_mode():
    for i in range(len(docs)):  # a reference computation: one forward pass per pair
        for j in range(len(rows)):
            lp = lm.model(torch.tensor([p_ids[i] + q_ids[j]])).logits[0, -1].float().log_softmax(-1)
            eos_term[i, j], stop_term[i, j] = float(lp[lm.eos_id]), float(torch.logsumexp(lp[stop], 0))
own = np.arange(len(rows)), rows
for name in ("eos", "line-end", "length"):
    m = np.array([r == name for r in reason])
    if m.any():
        e, s = eos_term[own[1], own[0]][m], stop_term[own[1], own[0]][m]
        spread = eos_term[:, m].std(0).mean(), stop_term[:, m].std(0).mean()
        print(f"{name:8s} n={m.sum():3d} own-doc log p(eos) mean {e.mean():7.2f} min {e.min():7.2f} | "
              f"log p(stop set) mean {s.mean():7.2f} min {s.min():7.2f} | across-doc SD: eos {spread[0]:.2f} "
              f"stop set {spread[1]:.2f}")
