"""Every stage key of ``gdr run`` for every experiment stays what ``tests/fixtures/stage_keys.json`` holds: how the
settings reach the stages (typed sections, saved configs) may change, the keys of finished stages may not, or every
run folder would be recomputed. A key change that is meant (a setting that now changes results) rewrites the
fixture: ``PYTHONPATH=$PWD python -m tests.stage_keys --write``, and says so in its commit."""
from __future__ import annotations

import json

from tests.stage_keys import EXPERIMENTS, FIXTURE, all_keys, runs


def test_stage_keys_unchanged(monkeypatch):
    """Every experiment, and the overrides that reach the stages they leave out (qg, folds, every indexer)."""
    want = json.loads(FIXTURE.read_text(encoding="utf-8"))
    got = all_keys(EXPERIMENTS, patch=monkeypatch.setattr)
    assert sorted(got) == sorted(name for name, _ in runs(EXPERIMENTS))
    changed = {run: sorted(k for k in set(got[run]) | set(want.get(run, {}))
                          if got[run].get(k) != want.get(run, {}).get(k))
               for run in got}
    assert not any(changed.values()), f"stage keys changed: {({r: c for r, c in changed.items() if c})}"

