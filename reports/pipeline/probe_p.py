# Demo-settings probe: P on BBC articles without titles, short docs/queries.
import logging
import sys

import torch

from gdr.data import load_corpus
from gdr.lm import GenerativeLM
from gdr.stages.sample import sample_run
from gdr.stages.score import score_run

logging.basicConfig(level=logging.INFO)
torch.set_num_threads(2)

n, J, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
c = load_corpus("bbc", n_docs=n, seed=0)
texts = list(c.texts)
lm = GenerativeLM("smollm2-135m", max_doc_tokens=64, device="cpu")
q = sample_run(lm, texts, c.doc_ids, out, n_queries=J, seed=0, batch_size=16, max_new_tokens=12, progress=False)
score_run(lm, texts, c.doc_ids, [r["text"] for r in q], out, shard_size=16, doc_batch_size=1, progress=False)
