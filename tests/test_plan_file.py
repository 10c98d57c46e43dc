"""The planner beside the run, not under it: `gdr run` never imports gdr.plan; its report's predicted column comes
from the `plan.json` that `gdr plan` (out= known) or `gdr plan --check RUN` writes into the run folder, used only
when made for the run's settings. And a run folder says what ran it: `run.json` and P's manifest record the
machine (information, in no key), `gdr plan --check` reads the device from it, and a P reused from another machine
is named in one log line. Offline, CPU: conftest's tiny run, copied where a test runs in it again."""
from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

from gdr import pipeline
from gdr.cli import main
from gdr.device import machine_differences, machine_record
from gdr.stages.plan_file import PLAN_FILE

ROOT = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


def _stage_header(md: str) -> str:
    return next(line for line in md.split("## Stages", 1)[1].splitlines() if line.startswith("| stage |"))


def test_run_help_loads_no_planner():
    out = subprocess.run([sys.executable, "-X", "importtime", "-m", "gdr.cli", "run", "--help"], capture_output=True,
                         text=True, env=ENV, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    loaded = {line.rsplit("|", 1)[-1].strip() for line in out.stderr.splitlines() if line.startswith("import time:")}
    assert "gdr.cli" in loaded and "gdr.plan" not in loaded


def test_a_run_loads_no_planner(tiny_run, tmp_path):
    """`gdr run` in a process of its own (every stage reused, the report written again) never imports gdr.plan."""
    _, args = tiny_run.copy(tmp_path / "run")
    code = (f"import sys; from gdr.cli import main; rc = main({args!r}); "
            "print(rc, 'gdr.plan' in sys.modules, 'gdr.calibrate' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=ENV, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "0 False False"


def test_the_report_reads_the_plan_written_for_its_settings_only(tiny_run, tmp_path, capsys):
    out, args = tiny_run.copy(tmp_path / "run")
    (out / PLAN_FILE).unlink(missing_ok=True)
    assert main(args) == 0
    md = (out / "report.md").read_text()
    assert "predicted" not in _stage_header(md) and f"no {PLAN_FILE} in the run folder" in md
    assert "gdr plan" in md.split("## Stages", 1)[1]

    assert main(["plan", *args[1:], "device=cpu"]) == 0  # out= known: the plan goes into the run folder
    printed = capsys.readouterr()
    assert f"wrote {out / PLAN_FILE}" in printed.err
    assert json.loads(printed.out.strip().splitlines()[-1])["plan_file"] == str(out / PLAN_FILE)
    plan = json.loads((out / PLAN_FILE).read_text())
    assert plan["made_for"]["device"] == "cpu" and plan["n_retrievers"] == 2
    assert main(args) == 0
    report = json.loads((out / "report.json").read_text())
    predicted = {s["name"]: s["predicted_seconds"] for s in report["stages"]}
    assert all(isinstance(v, float) and v >= 0 for v in predicted.values()), predicted
    assert predicted["train-gc-s0"] == predicted["train-random-s0"] == round(plan["stages"]["training"] / 2, 1)
    md = (out / "report.md").read_text()
    assert _stage_header(md) == "| stage | folder | seconds | predicted | last attempt | attempts | |"
    assert f"({PLAN_FILE}; n/a: not modelled)" in md

    # a plan made for other settings (here: the same run's with another seed list) is not used, and said so
    assert main(["plan", *args[1:], "device=cpu", "seeds=[0,1]"]) == 0
    assert main(args) == 0
    md = (out / "report.md").read_text()
    assert "predicted" not in _stage_header(md) and "was made for other settings (the config)" in md
    assert all(s["predicted_seconds"] is None for s in json.loads((out / "report.json").read_text())["stages"])
    # ... nor one for another device
    plan["made_for"]["device"] = "h200"
    (out / PLAN_FILE).write_text(json.dumps(plan))
    assert main(args) == 0
    assert "device h200 (this run: cpu)" in (out / "report.md").read_text()


def test_a_run_folder_says_what_ran_it_and_check_needs_no_device(tiny_run, tmp_path, capsys):
    out, args = tiny_run.copy(tmp_path / "run")
    machine = json.loads((out / "run.json").read_text())["machine"]
    assert machine == json.loads(json.dumps(machine_record()))
    assert machine["cpu_capability"] and machine["torch"] and machine["python"] and "host" not in str(machine)
    p_manifest = next(out.glob("score-*/P.manifest.json"))
    assert json.loads(p_manifest.read_text())["machine"]["cpu_capability"] == machine["cpu_capability"]
    assert json.loads(next(out.glob("score-*/queries.manifest.json")).read_text())["machine"] == machine

    (out / PLAN_FILE).unlink(missing_ok=True)
    assert main(["plan", "--check", str(out)]) == 0  # the device read from run.json, no device= needed
    printed = capsys.readouterr().out
    assert f"gdr plan --check {out} on cpu" in printed and f"wrote {out / PLAN_FILE}" in printed
    assert main(args) == 0  # the plan --check wrote fills the report's predicted column
    predicted = [s["predicted_seconds"] for s in json.loads((out / "report.json").read_text())["stages"]]
    assert all(isinstance(v, float) for v in predicted), predicted
    assert "| predicted |" in _stage_header((out / "report.md").read_text())


def test_a_p_from_another_machine_is_reused_and_named(tiny_run, tmp_path, caplog, monkeypatch):
    """The tiny run's P, reused on a machine whose CPU kernels dispatch to another instruction set (this one, told
    so): every stage reused under its key, and one log line names the difference."""
    out, args = tiny_run.copy(tmp_path / "run")
    made = json.loads(next(out.glob("score-*/P.manifest.json")).read_text())["machine"]
    monkeypatch.setattr(pipeline, "machine_record", lambda: {**made, "cpu_capability": "OTHER-ISA"})
    before = {s["name"]: s["folder"] for s in json.loads((out / "report.json").read_text())["stages"]}
    with caplog.at_level(logging.INFO, logger="gdr.pipeline"):
        assert main(args) == 0
    report = json.loads((out / "report.json").read_text())
    assert {s["name"]: s["folder"] for s in report["stages"]} == before  # no key changed
    assert all(s["reused"] for s in report["stages"])
    said = [r.getMessage() for r in caplog.records if "made on another machine" in r.getMessage()]
    assert len(said) == 1 and f"cpu_capability {made['cpu_capability']} there, OTHER-ISA here" in said[0]
    assert "reused, not refused" in said[0] and "last bits may differ" in said[0]


def test_machine_differences_name_what_decides_the_last_bits():
    now = machine_record()
    assert machine_differences(None, now) == [] and machine_differences(now, now) == []
    other = {**now, "gpu": "NVIDIA H200", "cpu": "another model name"}  # the CPU's name alone is information
    assert machine_differences(other, now) == [f"gpu NVIDIA H200 there, {now['gpu']} here"]
