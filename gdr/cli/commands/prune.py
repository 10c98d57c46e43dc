"""``gdr prune RUN_DIR``: drop the model weights and optimiser states of a run's evaluated retrievers
(:func:`gdr.carry.prune_run`), keeping every result; the run still reports, and a rerun reuses its evaluations.
Prints what was dropped and exits 0."""
from __future__ import annotations

import argparse

from gdr.carry import WEIGHTS, prune_run
from gdr.cli import HELP


def prune_main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(
        prog="gdr prune", formatter_class=argparse.RawDescriptionHelpFormatter,
        description=f"gdr prune: {HELP['prune']}.\nDrops {', '.join(WEIGHTS)} of every train-* stage whose eval-* "
        "stage is complete,\nand of a fine-tuned query generator (qg-*) once the stages it made are complete;\n"
        "keeps evaluations, per-query values, TREC runs, curves, the report, P, generated queries and indexes.\n"
        "A pruned retriever needed again (its evaluation missing or stale) is retrained by `gdr run`.")
    ap.add_argument("folder", help="a `gdr run` folder (its out=)")
    args = ap.parse_args(argv)
    done = prune_run(args.folder)
    n = len(done["pruned"])
    gen = sum(name.startswith("qg-") for name in done["pruned"])
    what = f"{n - gen} evaluated retrievers" + (f" and {gen} query generator" if gen else "")
    print(f"{args.folder}: pruned {what}, {done['bytes'] / (1 << 20):.1f} MiB dropped"
          if n else f"{args.folder}: nothing to prune (no evaluated retriever holds its weights)")
    return 0
