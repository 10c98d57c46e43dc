#!/usr/bin/env bash
# The per-query files of a `gdr run` folder in one archive (a device call brings back 8 files at most, so they travel
# together): every eval-*/ and bm25-*/ stage's per_query.json and metrics.json, and retrievers.jsonl, which names
# the evaluation folder of each retriever of the report, with per_query.jsonl (every finished retriever's ranks in one
# file). Unfinished evaluations have none yet and are left out.
#   bash examples/lease/per_query.sh RUN_DIR OUT.tgz
set -u
run=${1:?usage: per_query.sh RUN_DIR OUT.tgz}; dest=${2:?usage: per_query.sh RUN_DIR OUT.tgz}
files=$(cd "$run" && ls -d retrievers.jsonl per_query.jsonl report.json {eval,bm25}-*/per_query.json {eval,bm25}-*/metrics.json 2>/dev/null)
[ -n "$files" ] && tar -C "$run" -czf "$dest" $files
