"""Run score_run with a tiny model (used by the kill/resume and multi-process tests)."""
import sys

import torch
from tiny_models import DOCS, QUERIES, tiny_llama

from gdr.stages.score import score_run

if __name__ == "__main__":
    out, delay = sys.argv[1], float(sys.argv[2]) if len(sys.argv) > 2 else 0.0
    torch.set_num_threads(1)
    lm = tiny_llama()
    if delay:
        import time

        orig = lm.score

        def slow(*a, **k):  # make shards slow enough to be killed in the middle of a run
            time.sleep(delay)
            return orig(*a, **k)

        lm.score = slow
    docs = DOCS * 3
    score_run(lm, docs, [f"d{i}" for i in range(len(docs))], QUERIES, out, shard_size=2, progress=False)
