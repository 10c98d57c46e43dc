"""A stage's seconds add up over every attempt of a stage resumed after a stop (the last attempt kept apart), in
stage.json, its record and the report. A stage is timed by ``time.perf_counter``: here a clock the test moves (each
build takes 0.3 s of it), so that the figures are exact on any machine, however busy."""
from __future__ import annotations

import json
import os
import time

import pytest

from gdr import guard
from gdr.pipeline import STAGE_FILE, Pipeline

BUILD_S = 0.3  # the seconds each build takes on the test's clock


@pytest.fixture(autouse=True)
def _release():
    yield
    guard.release_all()


@pytest.fixture
def clock(monkeypatch) -> list[float]:
    """``time.perf_counter`` as a clock that moves only when a build says so: a one-element list, its reading."""
    now = [1000.0]
    monkeypatch.setattr(time, "perf_counter", lambda: now[0])
    return now


def _slow_build(calls: list, stop_first: bool, clock: list[float]):
    def build(folder):
        calls.append(1)
        clock[0] += BUILD_S
        (folder / f"part{len(calls)}.txt").write_text("x")
        if stop_first and len(calls) == 1:
            raise KeyboardInterrupt  # what a stop by SIGINT raises in the stage
        return {"n": len(calls)}
    return build


def test_a_stopped_attempt_counts_in_the_stage_seconds(tmp_path, clock):
    calls: list = []
    build = _slow_build(calls, stop_first=True, clock=clock)
    with pytest.raises(KeyboardInterrupt):
        Pipeline(tmp_path).stage("s", {"a": 1}, build)
    rec = Pipeline(tmp_path).stage("s", {"a": 1}, build)
    assert len(calls) == 2 and rec.attempts == 2 and not rec.reused
    assert (rec.last_seconds, rec.seconds) == (BUILD_S, 2 * BUILD_S)  # the stopped attempt's 0.3 s counts
    marker = json.loads((rec.path / STAGE_FILE).read_text())
    assert marker["attempts"] == [BUILD_S, BUILD_S] and marker["seconds"] == rec.seconds
    assert marker["last_seconds"] == rec.last_seconds

    again = Pipeline(tmp_path).stage("s", {"a": 1}, build)  # reused: the same figures, nothing rebuilt
    assert again.reused and len(calls) == 2
    assert (again.seconds, again.last_seconds, again.attempts) == (rec.seconds, rec.last_seconds, 2)


def test_an_attempt_killed_without_a_word_counts_until_its_newest_file(tmp_path, clock):
    """kill -9 leaves the stage marked running since its start: that attempt counts until the last file it wrote."""
    calls: list = []
    pipe = Pipeline(tmp_path)
    rec = pipe.stage("s", {"a": 1}, _slow_build(calls, stop_first=False, clock=clock))
    marker = json.loads((rec.path / STAGE_FILE).read_text())
    now = time.time()
    running = {k: marker[k] for k in ("format", "stage", "key", "inputs")}
    (rec.path / STAGE_FILE).write_text(json.dumps({**running, "status": "running", "attempts": [5.0],
                                                   "started": now - 100}))
    for p in rec.path.iterdir():
        if p.name != guard.LOCK_FILE:
            os.utime(p, (now - 60, now - 60))  # the killed attempt's newest write, 40 s after its start
    rec2 = Pipeline(tmp_path).stage("s", {"a": 1}, _slow_build(calls, stop_first=False, clock=clock))
    assert rec2.attempts == 3 and rec2.last_seconds == BUILD_S
    assert rec2.seconds == pytest.approx(5.0 + 40.0 + BUILD_S, abs=0.01)
