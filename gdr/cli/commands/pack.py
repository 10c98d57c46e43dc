"""``gdr pack RUN_DIR OUTDIR``: a pruned run as checksummed pieces (:func:`gdr.carry.pack_run`), for a lease's
``$OUT``; ``gdr pack --unpack OUTDIR DEST`` (or ``gdr unpack``) checks them and rebuilds the folder. Exit 0, or one
line and 2 for an unpruned run (without ``--prune``), a run too large for the pieces, or a damaged piece."""
from __future__ import annotations

import argparse

from gdr.carry import MANIFEST, MAX_PIECES, PIECE_MIB, pack_run, unpack_run
from gdr.cli import HELP
from gdr.rules import POSITIVE, number, option_type


def pack_main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(
        prog="gdr pack", formatter_class=argparse.RawDescriptionHelpFormatter,
        description=f"gdr pack: {HELP['pack']}.\nWrites OUTDIR/gdr-pack.00 ... (a gzip'd tar in pieces) and "
        f"OUTDIR/{MANIFEST} (each piece's size and SHA-256).\nAn unpruned run is refused unless --prune; "
        "`gdr pack --unpack OUTDIR DEST` rebuilds the folder at DEST.")
    ap.add_argument("source", help="the `gdr run` folder to pack (with --unpack: the OUTDIR of a pack)")
    ap.add_argument("target", help="the folder the pieces go to (with --unpack: DEST, a new or empty folder)")
    ap.add_argument("--prune", action="store_true", help="prune the run first (gdr prune) instead of refusing it")
    ap.add_argument("--unpack", action="store_true", help="check the pieces in SOURCE and rebuild the run at TARGET")
    ap.add_argument("--piece-mib", type=option_type(number(0), float), default=PIECE_MIB,
                    help="the most MiB of one piece")
    ap.add_argument("--max-pieces", type=option_type(POSITIVE), default=MAX_PIECES,
                    help="the most pieces; a larger run is refused")
    args = ap.parse_args(argv)
    if args.unpack:
        man = unpack_run(args.source, args.target)
        print(f"{args.target}: unpacked {man['files']} files of run {man['run']} from {len(man['pieces'])} pieces")
        return 0
    man = pack_run(args.source, args.target, prune=args.prune, piece_mib=args.piece_mib, max_pieces=args.max_pieces)
    packed = sum(p["bytes"] for p in man["pieces"]) / (1 << 20)
    print(f"{args.target}: {len(man['pieces'])} pieces ({packed:.1f} MiB) and {MANIFEST} of {args.source}"
          + (f" (pruned first: {len(man['pruned_first'])} retrievers)" if man["pruned_first"] else ""))
    return 0
