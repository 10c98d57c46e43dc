"""A stage's seconds add up over every attempt of a stage resumed after a stop (the last attempt kept apart), in
stage.json, its record and the report."""
from __future__ import annotations

import json
import os
import time

import pytest

from gdr import guard
from gdr.pipeline import STAGE_FILE, Pipeline


@pytest.fixture(autouse=True)
def _release():
    yield
    guard.release_all()


def _slow_build(calls: list, stop_first: bool):
    def build(folder):
        calls.append(1)
        time.sleep(0.3)
        (folder / f"part{len(calls)}.txt").write_text("x")
        if stop_first and len(calls) == 1:
            raise KeyboardInterrupt  # what a stop by SIGINT raises in the stage
        return {"n": len(calls)}
    return build


def test_a_stopped_attempt_counts_in_the_stage_seconds(tmp_path):
    calls: list = []
    build = _slow_build(calls, stop_first=True)
    with pytest.raises(KeyboardInterrupt):
        Pipeline(tmp_path).stage("s", {"a": 1}, build)
    rec = Pipeline(tmp_path).stage("s", {"a": 1}, build)
    assert len(calls) == 2 and rec.attempts == 2 and not rec.reused
    assert 0.3 <= rec.last_seconds < 0.6 <= rec.seconds
    marker = json.loads((rec.path / STAGE_FILE).read_text())
    assert len(marker["attempts"]) == 2 and marker["seconds"] == pytest.approx(sum(marker["attempts"]), abs=0.02)
    assert marker["last_seconds"] == rec.last_seconds

    again = Pipeline(tmp_path).stage("s", {"a": 1}, build)  # reused: the same figures, nothing rebuilt
    assert again.reused and len(calls) == 2
    assert (again.seconds, again.last_seconds, again.attempts) == (rec.seconds, rec.last_seconds, 2)


def test_an_attempt_killed_without_a_word_counts_until_its_newest_file(tmp_path):
    """kill -9 leaves the stage marked running since its start: that attempt counts until the last file it wrote."""
    calls: list = []
    pipe = Pipeline(tmp_path)
    rec = pipe.stage("s", {"a": 1}, _slow_build(calls, stop_first=False))
    marker = json.loads((rec.path / STAGE_FILE).read_text())
    now = time.time()
    running = {k: marker[k] for k in ("format", "stage", "key", "inputs")}
    (rec.path / STAGE_FILE).write_text(json.dumps({**running, "status": "running", "attempts": [5.0],
                                                   "started": now - 100}))
    for p in rec.path.iterdir():
        if p.name != guard.LOCK_FILE:
            os.utime(p, (now - 60, now - 60))  # the killed attempt's newest write, 40 s after its start
    rec2 = Pipeline(tmp_path).stage("s", {"a": 1}, _slow_build(calls, stop_first=False))
    assert rec2.attempts == 3 and 0.3 <= rec2.last_seconds < 5
    assert rec2.seconds == pytest.approx(5.0 + 40.0 + rec2.last_seconds, abs=0.5)
