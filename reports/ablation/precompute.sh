#!/bin/bash
# The ablation's LM work, resumable (rerun after a kill; each file continues after its last whole line):
# the generated training queries with the retrieval decoding (3 per document, top-k 10, T 0.7) and, for the
# first 63 documents, with the clustering sampler's decoding (top-k 50, top-p 0.99, T 1) for the query-quality
# comparison. WITH_P=1 also computes P (the score stage of `gdr run`, stopped once it is complete), which GC's
# docids need; in this session it was started and stopped unfinished (reports/ablation.md says why).
set -u
cd "$(dirname "$0")/../.."
OV="+experiment=demo data.n_docs=100 sample.n_queries=96 score.shard_size=10 cluster.enabled=false out=runs/ablation"
if [ "${WITH_P:-0}" = 1 ] && ! grep -qs '"status": "complete"' runs/ablation/score-*/stage.json; then
  .venv/bin/gdr run $OV doc_queries.per_doc=0 indexers=[gc] seeds=[0] progress=false &
  pid=$!
  (while kill -0 $pid 2>/dev/null; do
     if grep -qs '"status": "complete"' runs/ablation/score-*/stage.json; then kill $pid; echo "P done $(date -u)"; break; fi
     sleep 10
   done) &
fi
.venv/bin/python reports/ablation/pregen.py runs/ablation-pre/dq-k10-t0.7-n3 3 10 1.0 0.7 $OV &
LIMIT=63 .venv/bin/python reports/ablation/pregen.py runs/ablation-pre/dq-k50-p0.99-t1-n3-first63 3 50 0.99 1.0 $OV &
wait
echo "done $(date -u)"
