"""``gdr plan <the overrides of gdr run> device=h200|h100|a100|cpu [gpus=N]``: each stage's predicted seconds and
peak memory (:func:`gdr.plan.plan_run`), printed before anything loads, with what each figure rests on."""
from __future__ import annotations

import json

from gdr.config import command_config
from gdr.plan import DEVICES, format_plan, gpus_problem, plan_run


def plan_main(argv: list[str]) -> int:
    device, gpus, rest = "h200", "1", []
    for a in argv:
        key, _, value = a.partition("=")
        if key == "device" and value in DEVICES:
            device = value
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
    from gdr.validate import validate

    validate("run", cfg)
    stages = plan_run(cfg, device, gpus)
    print(format_plan(stages, device, gpus))
    print(json.dumps({"device": device, "gpus": gpus, "seconds": round(sum(s.seconds for s in stages), 1),
                      "seconds_early_stop": round(sum(s.seconds_low for s in stages), 1),
                      "stages": {s.name: {"seconds": round(s.seconds, 1), "peak_bytes": s.peak_bytes,
                                          "basis": s.basis} for s in stages}}))
    return 0
