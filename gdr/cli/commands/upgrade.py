"""``gdr upgrade RUN_DIR``: a folder of an older gdr brought to the current format (:func:`gdr.upgrade.upgrade`).

``gdr run`` does this itself when it opens its folder; this command does it without running anything, for a
``gdr run`` folder or a P run folder of ``gdr score``. It prints one line per change and exits 0; a folder of a
newer or unknown format, or one that cannot be upgraded, is refused in one line naming its version (exit 2)."""
from __future__ import annotations

import argparse
from pathlib import Path

from gdr.cli import HELP
from gdr.formats import FORMAT
from gdr.guard import claim_folder
from gdr.upgrade import upgrade


def upgrade_main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(
        prog="gdr upgrade", formatter_class=argparse.RawDescriptionHelpFormatter,
        description=f"gdr upgrade: {HELP['upgrade']}.\nTo format {FORMAT}, in place, keeping the work (P, sampled "
        "queries, finished stages);\na `gdr run` folder is also upgraded when it is run.")
    ap.add_argument("folder", help="a `gdr run` folder (with its <stage>-<key>/ folders) or a `gdr score` folder")
    args = ap.parse_args(argv)
    if not Path(args.folder).is_dir():
        what = "is a file, not a folder" if Path(args.folder).exists() else "no such folder"
        raise SystemExit(f"{args.folder}: {what}; pass a `gdr run` or `gdr score` output folder")
    claim_folder(args.folder, "folder")  # one writer: a run of this folder elsewhere is refused (released at exit)
    done = upgrade(args.folder)
    print("\n".join(done) if done else f"{args.folder}: already format {FORMAT}, nothing to upgrade")
    return 0
