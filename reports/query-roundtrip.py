"""Is the query P scores the query the sampler drew? (reports/query-roundtrip.md)

Samples 4 queries from each of 12 BBC articles (seed 0) with the bundled SmolLM2 and its two-shot prompt, then
compares, per query, the decode loop's own tokens (up to its stop id) with the tokens P scores: the decoded text,
cleaned (``clean_query``: first line, no quotes or ``Query:`` labels, at most 32 words) and tokenised again.
For each query whose tokens differ it computes, from the model's logits, log p(tokens | document) of both
sequences under every document (the end term left out: both sequences end alike), and reports how far the
difference moves over documents: a difference that is the same for every document is a per-query constant,
which P / phi in the importance weights (Eq. 4) removes; it is set beside the spread over documents of P itself.

    python reports/query-roundtrip.py MAX_NEW_TOKENS MAX_DOC_TOKENS      # 32 64 (the default), 12 64 (the demo)
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
lm, docs, rows, out = sample.lm, sample.docs, sample.rows, sample.out
drawn = [r[:n].tolist() for r, n in zip(out, sample.first_stop.tolist())]
raw = lm.tokenizer.batch_decode(out, skip_special_tokens=True)
texts = [clean_query(t) for t in raw]
scored = lm.tokenizer(texts, add_special_tokens=False)["input_ids"]
# the decoded text before cleaning, tokenised again: what re-tokenisation alone changes
again = lm.tokenizer([lm.tokenizer.decode(d, skip_special_tokens=True) for d in drawn],
                     add_special_tokens=False)["input_ids"]
kind = Counter()
for d, a, s, t, r in zip(drawn, again, scored, texts, raw):
    kind["same tokens" if d == s else ("cleaning changed the text" if a == d else
                                       "re-tokenisation alone changed the tokens" if t == r.strip() else
                                       "both")] += 1
print(f"{len(drawn)} queries, {max_new} new tokens at most:", dict(kind))
differ = [j for j in range(len(drawn)) if drawn[j] != scored[j] and scored[j]]
if not differ:
    sys.exit()
p_ids = lm.prompt_ids(docs)


def logp(prompt: list[int], q: list[int]) -> float:
    with torch.inference_mode():
        lp = lm.model(torch.tensor([prompt + q])).logits[0].float().log_softmax(-1)
    return float(lp[len(prompt) - 1:len(prompt) - 1 + len(q)].gather(1, torch.tensor(q)[:, None]).sum())


lp_drawn = np.array([[logp(p, drawn[j]) for j in differ] for p in p_ids])  # (docs, differ)
lp_scored = np.array([[logp(p, scored[j]) for j in differ] for p in p_ids])
diff = lp_drawn - lp_scored
own = diff[rows[differ], np.arange(len(differ))]
spread = diff.std(0)
for j, k in enumerate(differ):
    print(f"  q{k:2d} drawn {lm.tokenizer.decode(drawn[k])!r:60.60s} scored {texts[k]!r:40.40s} "
          f"own-doc log p(drawn) - log p(scored) {own[j]:+7.2f}  SD over docs {spread[j]:.2f}")
corr = np.mean([np.corrcoef(a, b)[0, 1] for a, b in zip(lp_drawn.T, lp_scored.T)])
print(f"differing queries {len(differ)}: own-doc difference mean {own.mean():+.2f}; SD over documents mean "
      f"{spread.mean():.2f}, max {spread.max():.2f}; beside the SD over documents of what P scores "
      f"(log p(scored | document)): mean {lp_scored.std(0).mean():.2f}; correlation over documents of log p(drawn) "
      f"and log p(scored), mean over these queries {corr:.3f}")
