"""``<run>/plan.json``: the seconds ``gdr plan`` predicted for a run, written into its folder before the run (``gdr plan
<the overrides of gdr run>``) or after it (``gdr plan --check RUN``), and read by the run's report for its
"predicted" column. ``gdr run`` reads this file and never imports the planner (:mod:`gdr.plan`, its measured
constants and the models' configs it builds): a report costs no plan.

A plan is made for one composed config on one device kind: the file records both (:func:`plan_identity`), and a
report whose run differs in either leaves the column out and says why, never showing another run's figures.
"""
from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import torch

from gdr.io import atomic_write_text

__all__ = ["DEVICES", "PLAN_FILE", "RUN_GROUPS", "TWO_SHOT", "plan_identity", "planned_names", "predicted_from_plan",
           "read_plan", "run_device", "stage_seconds", "write_plan"]

PLAN_FILE = "plan.json"
DEVICES = {"h200": "H200", "h100": "H100", "a100": "A100", "cpu": "cpu"}
# qg.compare_two_shot: the run's second score and cluster stages (the base model's two-shot P and its clustering) are
# named as the first; the plan's stages of that second pass carry this suffix (``scoring (two-shot)``)
TWO_SHOT = " (two-shot)"
# The run's stage names (gdr/pipeline.py; a second score or cluster stage as :func:`planned_names` names it) -> the
# plan's stages that make them
RUN_GROUPS = {"qg": ("qg",), "score": ("lm_load", "sampling", "scoring"), "cluster": ("clustering",),
              "doc-queries": ("doc_queries",), "bm25": ("bm25",),
              "score" + TWO_SHOT: tuple(p + TWO_SHOT for p in ("lm_load", "sampling", "scoring")),
              "cluster" + TWO_SHOT: ("clustering" + TWO_SHOT,)}
# Settings that name where a run writes, not what it computes: not part of the config a plan was made for
_NOT_PLANNED = ("out",)


def run_device(setting: str | None) -> tuple[str | None, int]:
    """(the plan's device kind a run with ``device=<setting>`` runs on here: ``cpu``, or the GPU's model among
    :data:`DEVICES`, None for a GPU without figures; the number of GPUs)."""
    device = str(setting or "auto")
    if device == "cpu" or (device == "auto" and not torch.cuda.is_available()):
        return "cpu", 1
    name = torch.cuda.get_device_name(0).lower()
    return next((k for k in DEVICES if k != "cpu" and k in name), None), torch.cuda.device_count()


def plan_identity(settings: dict, device: str | None) -> dict:
    """What a plan was made for: the sha256 of the composed run config ``settings`` (a resolved container, ``out``
    left out) and the device kind."""
    made = {k: v for k, v in settings.items() if k not in _NOT_PLANNED}
    text = json.dumps(made, sort_keys=True, default=str)
    return {"config_sha256": hashlib.sha256(text.encode("utf-8")).hexdigest(), "device": device}


def planned_names(names: list[str]) -> list[str]:
    """The run's stage names in order (a report's, with repeats) as the plan names them: the second ``score`` and
    ``cluster`` of a run with ``qg.compare_two_shot`` (the generator's come first, gdr/pipeline.py
    ``compare_two_shot``) are ``score (two-shot)`` and ``cluster (two-shot)``; every other name as it is."""
    seen: set[str] = set()
    out = []
    for name in names:
        out.append(name + TWO_SHOT if name in ("score", "cluster") and name in seen else name)
        seen.add(name)
    return out


def stage_seconds(stages: dict[str, float], parts: dict[str, float], names: list[str],
                  n_ret: int) -> dict[str, float | None]:
    """The plan's seconds of each run stage in ``names`` (``qg``, ``score``, ``cluster``, ``doc-queries``,
    ``index-<indexer>`` or ``index-<indexer>-s<seed>``, ``bm25``, ``train-<indexer>-s<seed>``,
    ``eval-<indexer>-s<seed>``; a repeat as :func:`planned_names` names it, and so keyed) from the plan's ``stages``
    (plan stage -> seconds) and indexing ``parts`` (indexer -> seconds of one index); training and evaluation are
    shared evenly by the ``n_ret`` retrievers. None for a stage the plan does not have."""
    out: dict[str, float | None] = {}
    for name in planned_names(names):
        kind = name.split("-", 1)[0]
        if name in RUN_GROUPS:
            got = [stages[p] for p in RUN_GROUPS[name] if p in stages]
            out[name] = sum(got) if got else None
        elif kind == "index" and "indexing" in stages:  # index-<indexer>, or index-<indexer>-s<seed>: one index
            out[name] = parts.get(re.sub(r"-s\d+$", "", name.split("-", 1)[1]))
        elif kind in ("train", "eval"):
            total = stages.get("training" if kind == "train" else "evaluation")
            out[name] = None if total is None else total / n_ret
        else:
            out[name] = None
    return out


def write_plan(run_dir: str | Path, identity: dict, gpus: int, stages: dict[str, float], parts: dict[str, float],
               n_ret: int, wall: dict | None = None) -> Path:
    """``<run_dir>/plan.json``: the plan's seconds per plan stage and per docid scheme's indexing, the retrievers
    training and evaluation are shared by, what the plan was made for (:func:`plan_identity`) and ``wall``: the
    run's predicted wall clock with the host stages beside the device stages (``seconds_wall``, ``overlap``)."""
    path = Path(run_dir) / PLAN_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    rec = {"made_for": identity, "gpus": gpus, "n_retrievers": n_ret,
           "stages": {k: round(v, 1) for k, v in stages.items()},
           "index_parts": {k: round(v, 1) for k, v in parts.items()}, **(wall or {})}
    atomic_write_text(path, json.dumps(rec, indent=2) + "\n")
    return path


def read_plan(run_dir: str | Path, identity: dict) -> tuple[dict | None, str]:
    """(``<run_dir>/plan.json``, or None; one line for the report): None when there is none, when it cannot be
    read, or when it was made for another config or device (``identity``: this run's :func:`plan_identity`)."""
    path = Path(run_dir) / PLAN_FILE
    fill = f"`gdr plan <the overrides of this gdr run> device={identity['device'] or '...'}` before the run, or " \
           f"`gdr plan --check {run_dir}` after it, fills it."
    if not path.is_file():
        return None, f"No predicted seconds: no {PLAN_FILE} in the run folder; {fill}"
    try:
        rec = json.loads(path.read_text(encoding="utf-8"))
        made = rec["made_for"]
        rec["stages"], rec["n_retrievers"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        return None, f"No predicted seconds: {path} cannot be read ({type(e).__name__}: {e}); {fill}"
    if made != identity:
        what = [k for k in ("config_sha256", "device") if made.get(k) != identity.get(k)]
        said = ", ".join("the config" if k == "config_sha256" else
                         f"device {made.get('device')} (this run: {identity.get('device')})" for k in what)
        return None, f"No predicted seconds: {path} was made for other settings ({said}), not used; {fill}"
    return rec, f"Predicted: what `gdr plan` predicted for the stage from these settings on {made['device']} " \
                f"({PLAN_FILE}; n/a: not modelled)."


def predicted_from_plan(rec: dict, names: list[str]) -> dict[str, float | None]:
    """The predicted seconds of the run stages ``names`` from a read ``plan.json`` (:func:`stage_seconds`)."""
    got = stage_seconds(rec["stages"], rec.get("index_parts") or {}, names, int(rec["n_retrievers"]))
    return {k: None if v is None else round(v, 1) for k, v in got.items()}
