"""A command's config is checked once, at its door: `gdr run`, the API's `gdr.run` and `gdr index` each call
`gdr.validate.validate` once, apply each of their rule tables once, check `gdr run`'s cross-section rules and its
corpus-dependent rules once, and hand inward settings that are not checked again (no settings class re-applies its
rules inside the command)."""
from __future__ import annotations

from collections import Counter

import pytest
from test_api import _as_settings
from test_pipeline import _args, setup  # noqa: F401  (module fixture: a saved tiny LM and a 30-document corpus)

import gdr
import gdr.pipeline
import gdr.validate
from gdr.cli import main
from gdr.stages.settings import Settings


@pytest.fixture
def calls(monkeypatch, patch_where_bound) -> Counter:
    """Counts of every check a command can make of its config, by name (``check_rules:<table prefix>``)."""
    seen: Counter = Counter()

    def counting(name, fn, key=None):
        def wrapper(*args, **kwargs):
            seen[name if key is None else f"{name}:{key(*args, **kwargs)}"] += 1
            return fn(*args, **kwargs)

        return wrapper

    patch_where_bound("gdr.validate.validate", counting("validate", gdr.validate.validate))  # every door's name
    monkeypatch.setattr(gdr.validate, "check_rules",
                        counting("check_rules", gdr.validate.check_rules, key=lambda sec, rules, prefix="": prefix))
    monkeypatch.setattr(gdr.validate, "check_run", counting("check_run", gdr.validate.check_run))
    monkeypatch.setattr(gdr.pipeline, "check_corpus", counting("check_corpus", gdr.pipeline.check_corpus))
    monkeypatch.setattr(Settings, "check", counting("Settings.check", Settings.check))
    return seen


RUN_ONCE = {"validate": 1, "check_rules:": 1, "check_rules:index": 1, "check_rules:train": 1,
            "check_rules:evaluate": 1, "check_run": 1, "check_corpus": 1}


def test_gdr_run_and_gdr_dot_run_check_their_config_once(setup, tmp_path, calls):  # noqa: F811
    root, folder = setup
    args = _args(root, folder, tmp_path / "run", "indexers=[random]")
    assert main(args) == 0
    assert dict(calls) == RUN_ONCE, dict(calls)

    calls.clear()
    report = gdr.run(_as_settings(args))  # the same run from a dict: every stage reused, the door checks once
    assert report["stages"] and all(s["reused"] for s in report["stages"] if "reused" in s)
    assert dict(calls) == RUN_ONCE, dict(calls)


def test_gdr_index_checks_its_config_once(setup, tmp_path, calls):  # noqa: F811
    _, folder = setup
    out = tmp_path / "index"
    assert main(["index", "method=random", "data=beir", f"data.path={folder}", f"out={out}", "progress=false",
                 "plot=false"]) == 0
    assert (out / "docids.tsv").is_file()
    assert dict(calls) == {"validate": 1, "check_rules:": 1}, dict(calls)


def test_a_script_building_settings_is_checked_at_its_own_door(calls):
    """Settings a script builds are checked once when made; those a command builds from its checked config are
    not checked again."""
    from gdr.validate import ConfigError

    with pytest.raises(ConfigError, match=r"^n_queries=0: must be a positive integer"):
        gdr.SampleSettings(n_queries=0)
    assert calls["Settings.check"] == 1
    assert gdr.SampleSettings.from_config({"n_queries": 0}).n_queries == 0  # trusted: the door already checked it
    assert calls["Settings.check"] == 1
    with pytest.raises(TypeError, match="unknown setting"):  # an unknown key is still refused by name
        gdr.SampleSettings.from_config({"nqueries": 3})
    calls.clear()
    assert gdr.TrainSettings.merged(trainer={"max_epochs": 2}).trainer.max_epochs == 2  # the API's door
    assert calls["Settings.check"] == 1
