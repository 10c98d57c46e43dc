"""``gdr plan <the overrides of gdr run> device=h200|h100|a100|cpu [gpus=N] [free_gb=GB]``: each stage's predicted
seconds and peak memory (:func:`gdr.plan.plan_run`), printed before anything loads, with what each figure rests on;
``free_gb``: the device memory free when training starts, which resolves ``batch_size`` and ``concurrent``
``auto`` (default: all of it). On the CPU the plan first calibrates this machine (:mod:`gdr.calibrate`), once per
machine and shapes (``--recalibrate``: again).

With ``out=`` known (the composed config's), the plan is written to ``<out>/plan.json``, which the run's report
sets beside its measured seconds (:mod:`gdr.stages.plan_file`; ``gdr run`` makes no plan itself). Where ``out``
already holds finished stages (a later lease of one experiment, a run cut short), the plan also prints what is left
of the run (:func:`gdr.plan.remaining`) and its wall clock, ``remaining`` in the JSON line.

``gdr plan --check RUN_DIR [device=...] [--write-factors]``: a finished run's measured seconds beside the plan of
its config, stage by stage, with their ratios (:func:`gdr.plan.check_run`); the device is read from the run's
``run.json`` unless named; the plan is written to ``RUN_DIR/plan.json`` too; ``--write-factors`` saves the
run's measured / predicted ratios as ``reports/gpu-runs/<run>-factors.json`` (``$GDR_GPU_RUNS/`` when set, the wheel's
copy when installed), which the plan of that device reads."""
from __future__ import annotations

import json
import math
import sys
from pathlib import Path

from gdr.config import command_config
from gdr.plan import (
    DEVICES,
    check_run,
    finished_stages,
    format_check,
    format_plan,
    format_remaining,
    gpus_problem,
    plan_run,
    plan_wall,
    remaining,
    sized_config,
    write_factors,
    write_run_plan,
)
from gdr.stages.command_keys import PLAN_DEVICE
from gdr.validate import validate


def plan_main(argv: list[str]) -> int:
    if "--check" in argv:
        return _check(argv)
    device, gpus, free, rest = PLAN_DEVICE, "1", None, []
    calibrate = "refresh" if "--recalibrate" in argv else "run"
    for a in argv:
        key, _, value = a.partition("=")
        if a == "--recalibrate":
            continue
        if key == "device" and value in DEVICES:
            device = value
        elif key == "free_gb":
            try:
                free = float(value) * 1e9
            except ValueError:
                free = None
            if free is None or not math.isfinite(free) or free <= 0:
                raise SystemExit(f"free_gb={value!r}: must be a number > 0, the GB of device memory free when training "
                                 "starts")
        elif key == "gpus":
            gpus = value
        else:
            rest.append(a)
    if gpus_problem(device, gpus):
        raise SystemExit(gpus_problem(device, gpus))
    gpus = int(gpus)
    if any(a.startswith("device=") for a in rest):
        raise SystemExit(f"{next(a for a in rest if a.startswith('device='))}: gdr plan plans for "
                         f"device={' | '.join(DEVICES)}")
    cfg = command_config("run", rest)
    if cfg is None:  # --cfg: printed
        return 0

    validate("run", cfg)
    stages = plan_run(sized_config(cfg), device, gpus, free=free, calibrate=calibrate)
    wall = plan_wall(cfg, stages, device)
    print(format_plan(stages, device, gpus, wall))
    left = None  # a run folder that holds finished stages (a later lease of one experiment): what is left of it
    finished = finished_stages(Path(cfg.out)) if cfg.get("out") else {}
    if finished:
        left_stages, left = remaining(cfg, stages, finished)
        left_wall = plan_wall(cfg, left_stages, device, left=left)
        print(format_remaining(left_stages, left, left_wall, Path(cfg.out)))
    # the plan into the run folder, where the run's report reads it (said on stderr: stdout ends in the JSON line)
    written = write_run_plan(cfg, Path(cfg.out), device, gpus, stages, wall) if cfg.get("out") else None
    if written is not None:
        print(f"wrote {written} (the run's report reads it)", file=sys.stderr)
    print(json.dumps({"device": device, "gpus": gpus, "plan_file": None if written is None else str(written),
                      "seconds": round(sum(s.seconds for s in stages), 1),
                      "seconds_early_stop": round(sum(s.seconds_low for s in stages), 1), **wall.record(),
                      "remaining": None if left is None else left.record(left_stages, left_wall),
                      "stages": {s.name: {"seconds": round(s.seconds, 1), "peak_bytes": s.peak_bytes,
                                          "basis": s.basis} for s in stages}}))
    return 0


def _check(argv: list[str]) -> int:
    """``gdr plan --check RUN_DIR [device=...] [gpus=N] [--write-factors]``."""
    i = argv.index("--check")
    if i + 1 >= len(argv) or argv[i + 1].startswith("-") or "=" in argv[i + 1]:
        raise SystemExit("gdr plan --check RUN_DIR: name the run folder (or the folder holding its report.json)")
    run_dir, rest = Path(argv[i + 1]), argv[:i] + argv[i + 2:]
    device, gpus, write = None, 1, False
    for a in rest:
        key, _, value = a.partition("=")
        if a == "--write-factors":
            write = True
        elif key == "device" and value in DEVICES:
            device = value
        elif key == "gpus" and value.isdigit() and int(value) >= 1:
            gpus = int(value)
        else:
            raise SystemExit(f"gdr plan --check: {a!r}: use device={' | '.join(DEVICES)}, gpus=N or --write-factors")
    try:
        check = check_run(run_dir, device, gpus)
    except ValueError as e:
        raise SystemExit(str(e)) from None
    print(format_check(check))
    try:
        written = write_run_plan(check.cfg, check.run, check.device, gpus, check.plan, check.wall)
        print(f"wrote {written} (the predicted seconds of the run's report from its next gdr run)")
    except OSError as e:  # a folder only read (a copy brought back, a committed report): the check stands
        print(f"plan.json not written into {check.run} ({type(e).__name__}: {e})")
    if write:
        print(f"wrote {write_factors(check)}")
    return 0
