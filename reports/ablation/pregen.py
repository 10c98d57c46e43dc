# Generated training queries for the ablation, computed before the `gdr run` stage that uses them existed
# (the same library call the doc-queries stage makes, gdr.stages.doc_queries.sample_per_doc_run, with its settings;
# the store's manifest records them, so the stage resumes from these files only if its settings are identical):
#   python reports/ablation/pregen.py <dest folder> <per_doc> <top_k> <top_p> <temperature> <gdr run overrides>
# LIMIT=N in the environment: only the first N documents (query i of document d depends on (seed, d, i) alone, so
# they are the first N lines of the full file).
import os
import sys
from pathlib import Path

from gdr.config import load_config, to_container
from gdr.data import corpus_from_config
from gdr.pipeline import lm_settings
from gdr.stages.doc_queries import sample_per_doc_run

dest, per_doc, top_k, top_p, temp, argv = (Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]),
                                           float(sys.argv[4]), float(sys.argv[5]), sys.argv[6:])
cfg = load_config("run", argv)
corpus = corpus_from_config(to_container(cfg.data))
lm = lm_settings(cfg).build()
dq = cfg.doc_queries
n = int(os.environ.get("LIMIT") or len(corpus))
print(sample_per_doc_run(lm, corpus.model_inputs()[:n], corpus.doc_ids[:n], dest, n_per_doc=per_doc, seed=int(dq.seed),
                         batch_size=cfg.sample.batch_size, max_new_tokens=int(dq.max_new_tokens), top_k=top_k,
                         top_p=top_p, temperature=temp, progress=False))
