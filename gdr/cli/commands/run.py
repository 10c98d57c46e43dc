"""``gdr run``: the whole pipeline (:func:`gdr.pipeline.run_pipeline`), its report and one JSON line last."""
from __future__ import annotations

import json
import sys
from pathlib import Path

from gdr.config import command_config
from gdr.guard import claim_out
from gdr.pipeline import run_pipeline
from gdr.stages.report import headline
from gdr.validate import validate


def run_main(argv: list[str]) -> int:
    cfg = command_config("run", argv)
    if cfg is None:  # --cfg: printed
        return 0

    validate("run", cfg)  # with the rules across its sections (check_run)

    claim_out("run", cfg)  # the run folder: writable, and this process's alone; stages lock their folders too
    report = run_pipeline(cfg, argv)
    print(open(Path(cfg.out) / "report.md", encoding="utf-8").read())
    if report.get("verdict"):
        print(report["verdict"])
    print(json.dumps(headline(report)))
    sys.stdout.flush()
    return 0
