#!/usr/bin/env bash
# One work call of a GPU lease (README, "A GPU lease"): starts `gdr run +experiment=bbc` in a session of its own
# (setsid: it goes on between the calls of one lease, while the machine stays warm) or, if it is running, waits on
# it; after WAIT seconds, or when the run ends, it copies what the run has so far to $OUT. Nothing here needs the
# run to finish: every retriever is in retrievers.jsonl and the (partial) report as soon as it is evaluated.
#   bash examples/lease/bbc.sh WAIT [gdr run overrides ...]
# after every piece of ../shared/device/prep.sh reached /tmp/gdr-stash. $OUT gets (at most 8 files): report.md,
# report.png, report.json, retrievers.jsonl, stages.json (each stage's seconds and status), run.log (its last
# 3,000 lines), status.txt (then `gdr plan` for this machine, before the run) and per-query.tgz (every finished
# evaluation's per_query.json and metrics.json, BM25's, and retrievers.jsonl: the paired statistics of any two
# retrievers can be computed from it afterwards). Two leases, one experiment: examples/lease/README.md.
set -u
wait_s=${1:?usage: bbc.sh WAIT [overrides ...]}; shift
source "$(dirname "$0")/env.sh" || exit 3  # boot.sh; $runs, $run, $out, $py; alive
mkdir -p "$runs" "$out"
pid=$(cat "$runs/pid" 2>/dev/null || true)
if [ -z "$pid" ] || ! alive "$pid"; then
  [ -f "$runs/plan.txt" ] || "$py" -m gdr.cli plan +experiment=bbc out=$run "$@" > "$runs/plan.txt" 2>&1
  if command -v nvidia-smi > /dev/null; then
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader >> "$runs/run.log" 2>&1
  fi
  setsid "$py" -m gdr.cli run +experiment=bbc out=$run "$@" >> "$runs/run.log" 2>&1 < /dev/null &
  pid=$!; echo "$pid" > "$runs/pid"
  echo "bbc.sh: started gdr run (pid $pid)"
fi
end=$((SECONDS + wait_s))
while alive "$pid" && [ $SECONDS -lt $end ]; do sleep 1; done
if alive "$pid"; then state="running"; else state="ended"; fi
"$py" - "$run" "$out/stages.json" <<'PY'
import json, sys
from pathlib import Path
run, rows = Path(sys.argv[1]), []
for f in sorted(run.glob("*/stage.json")):
    try:
        s = json.loads(f.read_text())
    except ValueError:
        continue
    rows.append({"folder": f.parent.name, **{k: s.get(k) for k in ("status", "seconds", "attempts", "info")}})
Path(sys.argv[2]).write_text(json.dumps(rows, indent=1, default=str))
PY
for f in report.md report.png report.json retrievers.jsonl; do [ -f "$run/$f" ] && cp "$run/$f" "$out/"; done
bash "$(dirname "$0")/per_query.sh" "$run" "$out/per-query.tgz"
tail -n 3000 "$runs/run.log" > "$out/run.log"
{ echo "gdr run: $state after this call's ${SECONDS}s"
  echo "retrievers evaluated: $(cat "$run/retrievers.jsonl" 2>/dev/null | grep -c .)"
  cat "$runs/plan.txt" 2>/dev/null; } > "$out/status.txt"
head -n 2 "$out/status.txt"; tail -n 5 "$runs/run.log"
