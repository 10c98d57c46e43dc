#!/bin/bash
# The recipe ablation at the demo's size (issue 21), on the demo's own P, docids and BM25: one `gdr run +experiment=demo`
# per variant with seeds [0,1], each in its own folder runs/abl-<variant>-s01 seeded with a copy of the finished
# demo's stage folders (so only the doc-queries / train / eval stages a variant changes are computed).
#   make demo && reports/ablation/demo_size.sh base gen0 gen10 clusterdec pawa consistency
#   python reports/ablation/table.py reports/ablation/demo-table.md runs/abl-base-s01 runs/abl-*-s01
# Two variants at a time, one torch thread each (2 cores). Resumable: `gdr run` reuses every finished stage.
set -eu
cd "$(dirname "$0")/../.."
declare -A VARIANTS=(
  [base]=""
  [gen0]="doc_queries.per_doc=0"
  [gen10]="doc_queries.per_doc=10"
  [clusterdec]="doc_queries.top_k=50 doc_queries.top_p=0.99 doc_queries.temperature=1.0"
  [pawa]="train.model.pawa=true"
  [consistency]="train.optim.consistency_weight=1.0"
)
one() {
  v=$1; out=runs/abl-$v-s01
  mkdir -p "$out"
  for d in runs/demo-bbc/*/; do   # finished stages of the demo (score, cluster, indexes, bm25, doc-queries, seed-0 retrievers)
    n=$(basename "$d"); [ -e "$out/$n" ] || cp -a "$d" "$out/$n"
  done
  echo "=== $v: gdr run +experiment=demo ${VARIANTS[$v]} seeds=[0,1] out=$out"
  OMP_NUM_THREADS=1 /usr/bin/time -f "=== $v: %e s" .venv/bin/gdr run +experiment=demo ${VARIANTS[$v]} 'seeds=[0,1]' \
    plot=false out="$out" > "$out.log" 2>&1 || echo "=== $v: FAILED (see $out.log)"
  tail -1 "$out.log"
}
export -f one; export -A VARIANTS 2>/dev/null || true
for v in "$@"; do echo "$v"; done | xargs -P "${JOBS:-2}" -I{} bash -c "$(declare -A | grep VARIANTS); $(declare -f one); one {}"
