#!/bin/bash
# The ablation's LM work, resumable (rerun the script after a kill): P (the score stage of `gdr run`, stopped
# once that stage is complete) in the background, and meanwhile the generated training queries with the
# retrieval decoding and with the clustering sampler's decoding (3 per document each).
set -u
cd "$(dirname "$0")/../.."
OV="+experiment=demo data.n_docs=100 sample.n_queries=96 score.shard_size=10 cluster.enabled=false out=runs/ablation"
if ! grep -qs '"status": "complete"' runs/ablation/score-*/stage.json; then
  .venv/bin/gdr run $OV doc_queries.per_doc=0 indexers=[hkmi] seeds=[0] progress=false &
  pid=$!
  (while kill -0 $pid 2>/dev/null; do
     if grep -qs '"status": "complete"' runs/ablation/score-*/stage.json; then kill $pid; echo "P done $(date -u)"; break; fi
     sleep 10
   done) &
fi
.venv/bin/python reports/ablation/pregen.py runs/ablation-pre/dq-k10-t0.7-n3 3 10 1.0 0.7 $OV
echo "retrieval decoding done $(date -u)"
.venv/bin/python reports/ablation/pregen.py runs/ablation-pre/dq-k50-p0.99-t1-n3 3 50 0.99 1.0 $OV
echo "clustering decoding done $(date -u)"
wait
