#!/bin/bash
# The recipe ablation (issue 21): one `gdr run` per variant, each in its own folder (runs/abl-<variant>) so that
# variants run side by side; P and the generated queries are computed once (precompute.sh) and seeded into each.
#   reports/ablation/run.sh <seed> <variant> [<variant> ...]      (one seed per folder: runs/abl-<variant>-s<seed>)
# Resumable: `gdr run` reuses every finished stage. Variants: see VARIANTS below.
set -eu
cd "$(dirname "$0")/../.."
SEED=$1; shift
COMMON="+experiment=demo data.n_docs=100 sample.n_queries=96 score.shard_size=10 cluster.enabled=false indexers=${INDEXERS:-[gc,hkmi]} progress=false plot=false"
# The baseline recipe: 3 generated queries per document with the retrieval decoding (top-k 10, T 0.7), a dev set of
# the held-out titles filled up to 100 with held-out generated queries, validation every 25 steps, early stopping
# after 60 steps without a better dev MRR but not before step 60, at most 100 steps (the CPU budget of this session).
BASE="train.trainer.max_steps=100 train.trainer.check_val_every_n_epoch=null train.trainer.val_check_interval=20 train.trainer.patience_steps=60 train.trainer.min_steps=60"
declare -A VARIANTS=(
  [base]="doc_queries.per_doc=3"
  [gen0]="doc_queries.per_doc=0"
  [clusterdec]="doc_queries.per_doc=3 doc_queries.top_k=50 doc_queries.top_p=0.99 doc_queries.temperature=1.0"
  [devreal]="doc_queries.per_doc=3 train.examples.dev_min=0"
  [gen0-epochstop]="doc_queries.per_doc=0 train.trainer.check_val_every_n_epoch=1 train.trainer.val_check_interval=null train.trainer.patience_steps=null train.trainer.min_steps=0 train.trainer.patience=20"
  [gen0-pawa]="doc_queries.per_doc=0 train.model.pawa=true"
  [gen0-consistency]="doc_queries.per_doc=0 train.optim.consistency_weight=1.0"
)
SCORE=$(ls -d runs/ablation/score-* 2>/dev/null || echo none)
for v in "$@"; do
  extra=${VARIANTS[$v]}
  pre=runs/ablation-pre/dq-k10-t0.7-n3
  [ "$v" = clusterdec ] && pre=runs/ablation-pre/dq-k50-p0.99-t1-n3
  args="$COMMON $BASE $extra seeds=[$SEED] out=runs/abl-$v-s$SEED"
  .venv/bin/python reports/ablation/seed_stages.py "$SCORE" "$pre" $args
  echo "=== $v: gdr run $args"
  /usr/bin/time -f "=== $v: %e s" .venv/bin/gdr run $args 2>&1 | grep -v Warning | tail -40
done
