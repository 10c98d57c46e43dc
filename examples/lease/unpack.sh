#!/usr/bin/env bash
# The first work call of lease 2 (examples/lease/README.md), after the kit's calls: the pieces carried in (PACK_DIR,
# where the pack's calls copied gdr-pack.json and every gdr-pack.NN: /tmp/gdr-pack) checked and unpacked to the run
# folder bbc.sh uses (once: a later call finds it there), then bbc.sh goes on with the overrides given (more seeds): every finished stage is reused, P
# and the generated queries too, and only the new retrievers train.
#   bash examples/lease/unpack.sh PACK_DIR WAIT [gdr run overrides ...]
set -u
pack=${1:?usage: unpack.sh PACK_DIR WAIT [overrides ...]}; shift
source "$(dirname "$0")/env.sh" || exit 3  # boot.sh; $runs, $run, $py
if [ ! -d "$run" ]; then
  mkdir -p "$runs" && "$py" -m gdr.cli unpack "$pack" "$run" || exit 3
fi
exec bash "$(dirname "$0")/bbc.sh" "$@"
