#!/usr/bin/env bash
# The last call of lease 1 (examples/lease/README.md): the run of bbc.sh stopped if it still runs, its evaluated
# retrievers pruned (`gdr prune`: weights and optimiser states go, every result stays), the training folders that
# still hold weights dropped (a retriever stopped mid-training, or trained but not evaluated: it trains again on the
# next lease), and the run packed into $OUT as checksummed pieces (`gdr pack`). $OUT gets (at most 8 files):
# gdr-pack.json and gdr-pack.00 .. (at most 3 pieces of 16 MiB: a call brings back 64 MiB in all, and a call of
# the next lease carries them in beside the working tree), report.json, per-query.tgz, run.log and status.txt.
#   bash examples/lease/pack.sh
set -u
here=$(dirname "$0"); source "$here/env.sh" || exit 3  # boot.sh; $runs, $run, $out, $py; alive
mkdir -p "$out"
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
"$py" -m gdr.cli pack "$run" "$out" --max-pieces 3 > "$out/status.txt" 2>&1; rc=$?
cp "$run/report.json" "$out/" 2>/dev/null
bash "$here/per_query.sh" "$run" "$out/per-query.tgz"
tail -n 3000 "$runs/run.log" > "$out/run.log" 2>/dev/null
cat "$out/status.txt"; exit $rc
