"""``gdr unpack OUTDIR DEST``: the run folder packed by ``gdr pack`` into OUTDIR, its pieces checked against their
manifest, rebuilt at DEST (:func:`gdr.carry.unpack_run`); ``gdr run out=DEST`` carries on with it."""
from __future__ import annotations

import argparse

from gdr.carry import MANIFEST, unpack_run
from gdr.cli import HELP


def unpack_main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(
        prog="gdr unpack", formatter_class=argparse.RawDescriptionHelpFormatter,
        description=f"gdr unpack: {HELP['unpack']}.\nChecks each piece's size and SHA-256 against OUTDIR/{MANIFEST} "
        "before writing anything;\nDEST must be new or empty.")
    ap.add_argument("source", help="the OUTDIR of a `gdr pack` (gdr-pack.json and gdr-pack.NN)")
    ap.add_argument("dest", help="the run folder to rebuild (new or empty)")
    args = ap.parse_args(argv)
    man = unpack_run(args.source, args.dest)
    print(f"{args.dest}: unpacked {man['files']} files of run {man['run']} from {len(man['pieces'])} pieces")
    return 0
