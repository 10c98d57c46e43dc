#!/usr/bin/env bash
# The last call(s) of a lease (examples/lease/README.md): the run of bbc.sh stopped if it still runs, its evaluated
# retrievers pruned (`gdr prune`: weights and optimiser states go, every result stays), the training folders that
# still hold weights dropped (a retriever stopped mid-training, or trained but not evaluated: it trains again on the
# next lease), and the run packed as checksummed pieces of 16 MiB (`gdr pack`, at most 6) into $runs/pack, whose
# first 3 come back in this call's $OUT: 8 files at most, gdr-pack.json, gdr-pack.00 .. 02, report.json,
# per-query.tgz, run.log and status.txt. A call brings back 64 MiB and a call of the next lease carries in 64 MiB
# with the working tree, so 3 pieces a call each way. A pack of more (BBC at 4 schemes x 5 seeds: P, GC's
# centroids and the TREC runs come to ~55 MiB gzip'd) comes back over further calls, `pack.sh 3` (pieces 03 .. 05
# and status.txt), at once after the first; status.txt names the call that is left.
#   bash examples/lease/pack.sh        # stop, prune, pack; pieces 00 .. 02
#   bash examples/lease/pack.sh 3      # pieces 03 .. 05 of that pack
set -u
from=${1:-0}
here=$(dirname "$0"); source "$here/env.sh" || exit 3  # boot.sh; $runs, $run, $out, $py; alive
pack=$runs/pack; per_call=3; max_pieces=6
mkdir -p "$out"
if [ "$from" = 0 ]; then
  pid=$(cat "$runs/pid" 2>/dev/null || true)
  if [ -n "$pid" ] && alive "$pid"; then
    kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid"   # its session: the training workers stop with it
    end=$((SECONDS + 30)); while alive "$pid" && [ $SECONDS -lt $end ]; do sleep 1; done
    if alive "$pid"; then  # the pack must leave in this call: a run that does not stop in 30 s is killed
      kill -KILL -- "-$pid" 2>/dev/null || kill -KILL "$pid"; sleep 1
    fi
    echo "pack.sh: stopped gdr run (pid $pid); what it finished is kept"
  fi
  "$py" -m gdr.cli prune "$run"
  # what gdr prune kept: a retriever not evaluated, or the fine-tuned generator (qg-*, ~270 MB) while a stage it
  # feeds (score, doc-queries) is unfinished; either would overflow the pack, and trains again next lease
  for d in "$run"/train-*/ "$run"/qg-*/; do
    [ -d "$d" ] || continue
    if [ -n "$(find "$d" \( -name '*.pt' -o -name '*.ckpt' -o -name '*.safetensors' -o -name '*.bin' \) -print -quit)" ]; then
      echo "pack.sh: ${d%/}: holds weights no finished stage stands on without them; left behind, it trains again"
      rm -rf "$d"
    fi
  done
  # GDR_LEASE_PIECE_MIB: smaller pieces, for the rehearsal of a pack of several calls (gdr pack's default: 16)
  "$py" -m gdr.cli pack "$run" "$pack" --max-pieces $max_pieces ${GDR_LEASE_PIECE_MIB:+--piece-mib "$GDR_LEASE_PIECE_MIB"} \
    > "$out/status.txt" 2>&1; rc=$?
  [ $rc = 0 ] && cp "$pack/gdr-pack.json" "$out/"
  cp "$run/report.json" "$out/" 2>/dev/null
  bash "$here/per_query.sh" "$run" "$out/per-query.tgz"
  tail -n 3000 "$runs/run.log" > "$out/run.log" 2>/dev/null
else
  rc=0; : > "$out/status.txt"
  [ -f "$pack/gdr-pack.json" ] || { echo "pack.sh: no pack in $pack: run pack.sh without an argument first" >> "$out/status.txt"; rc=3; }
fi
if [ $rc = 0 ]; then
  pieces=("$pack"/gdr-pack.[0-9]*)
  for p in "${pieces[@]:$from:$per_call}"; do cp "$p" "$out/"; done
  n=${#pieces[@]}; next=$((from + per_call))
  echo "pack.sh: pieces $from .. $((next < n ? next - 1 : n - 1)) of $n in this call's \$OUT" >> "$out/status.txt"
  if [ $next -lt $n ]; then
    echo "pack.sh: pieces $next .. $((n - 1)) left: bash examples/lease/pack.sh $next (a call of its own, at once)" >> "$out/status.txt"
  fi
fi
cat "$out/status.txt"; exit $rc
