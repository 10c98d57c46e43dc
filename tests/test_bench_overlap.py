"""`gdr bench overlap` (gdr/bench/overlap.py): every host stage of `gdr run`, run in the background thread beside a
dispatch-bound proxy, gets its ratios. The figures are the machine's; only their shape is checked here."""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gdr.bench.overlap import CONTROLS, STAGES

pytestmark = pytest.mark.cost(seconds=24)  # the file's tests in all, fast lane, 2 cores: dealt first

REPO = Path(__file__).resolve().parents[1]


def test_smoke_prints_a_table_and_a_json_line_with_a_ratio_per_stage(tmp_path):
    # its own process: the benchmark pins torch's, the BLAS's and faiss's threads for the whole process
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    p = subprocess.run([sys.executable, "-m", "gdr.cli", "bench", "overlap", "--smoke", "--tmp", str(tmp_path)],
                       cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    lines = p.stdout.strip().splitlines()
    out = json.loads(lines[-1])
    assert set(out["stages"]) == set(STAGES + CONTROLS)
    for name, r in out["stages"].items():
        assert len(r["ratios"]) == out["repeats"] == 1, name
        for key in ("ratio", "free_ratio", "seconds"):  # free_ratio: None without Linux's schedstat
            assert (key == "free_ratio" and r[key] is None) or (math.isfinite(r[key]) and r[key] > 0), (name, key)
        assert any(ln.startswith(name) for ln in lines[:-1]), f"no table row for {name}"
    assert set(out["slow"]) <= set(STAGES)
    assert out["threads"]["torch"] == 1
    assert not list(tmp_path.iterdir()), "the stage folders are removed at the end"
