"""Each setting's rule (range, choices) is said on its field (``rule`` in its metadata, :func:`gdr.rules.setting`):
the settings' rule tables that gdr.validate composes per command are derived from the fields, so a field that says
none is refused here."""
from __future__ import annotations

import re
from dataclasses import dataclass, fields

import pytest
from omegaconf import OmegaConf

from gdr.cli import main
from gdr.config import load_config
from gdr.pipeline import run_settings
from gdr.rules import POSITIVE, ConfigError, any_value, check_rules, fields_rules, same_setting, setting
from gdr.stages.settings import (
    CLUSTER_RULES,
    EVALUATE_RULES,
    INDEX_RULES,
    TRAIN_RULES,
    EvaluateSettings,
    QGKeys,
    RunQG,
    TrainSettings,
    section_classes,
    section_from,
    settings_classes,
)
from gdr.training.options import QGOptions, TrainerOptions
from gdr.validate import TABLES

# the classes of `gdr qg`'s own keys and of `gdr run`'s qg section, parents before their sections
QG_CLASSES = [QGKeys, *section_classes(QGKeys, "qg"), *section_classes(QGKeys, "queries"), RunQG, QGOptions]


def test_every_setting_declares_its_rule():
    silent = [f"{cls.__name__}.{f.name}" for cls in settings_classes() for f in fields(cls)
              if f.metadata.get("rule") is None and not section_classes(cls, f.name)]
    assert silent == [], f"declare rule= (gdr.rules.any_value where nothing can be checked) on: {', '.join(silent)}"


def test_every_qg_setting_declares_its_rule():
    """The query generator's keys (qg.train: QGOptions; qg.*, queries.* of `gdr qg`; `gdr run`'s qg) too."""
    silent = [f"{cls.__name__}.{f.name}" for cls in QG_CLASSES for f in fields(cls)
              if f.metadata.get("rule") is None and not section_classes(cls, f.name)]
    assert silent == [], f"declare rule= (gdr.rules.any_value where nothing can be checked) on: {', '.join(silent)}"


@pytest.mark.parametrize("command", ["qg", "run"])
def test_the_qg_train_rules_are_its_fields_in_both_commands(command):
    table = {r.key: r for _, rules in TABLES[command] for r in rules}
    for f in fields(QGOptions):
        rule = table.get(f"qg.train.{f.name}")
        if f.metadata["rule"] is any_value:
            assert rule is None, f.name
        else:
            assert rule is not None and rule.check is f.metadata["rule"], f.name


@pytest.mark.parametrize("command", ["qg", "run"])
@pytest.mark.parametrize("name, value, problem", [
    ("lr", "2", r"must be a number in \(0, 1\] \(AdamW learning rate"),
    ("max_steps", "0", r"must be -1 \(no limit\) or a positive integer"),  # 0 would train no step
    ("precision", "fp8", r"must be null, auto or one of bf16-mixed"),
    ("gradient_clip_val", "-1", r"must be null or a number >= 0"),
])
def test_a_bad_qg_train_value_is_refused_at_the_door(command, name, value, problem, tmp_path, capsys, nothing_loads):
    """`gdr qg` and `gdr run` refuse it naming the key, before any model, corpus or out folder."""
    assert main([command, f"out={tmp_path / 'out'}", f"qg.train.{name}={value}"]) == 2
    err = capsys.readouterr().err.strip()
    assert re.match(rf"gdr {command}: error: qg\.train\.{name}={value}: {problem}", err), err
    assert not (tmp_path / "out").exists()


def test_qg_train_is_typed_once_at_the_door():
    q = run_settings(load_config("run", ["qg.enabled=true", "qg.train.lr=0.001", "progress=false"])).qg
    assert isinstance(q.train, QGOptions) and q.train.lr == 0.001 and q.train.enable_progress_bar is False
    with pytest.raises(TypeError, match=r"^qg\.train: unknown setting\(s\) lrr; known: train_layers, lr,"):
        section_from(RunQG, {"train": {"lrr": 1}}, "qg")


def test_the_tables_are_the_fields_rules_keyed_as_in_the_config():
    train = {r.key: r for r in TRAIN_RULES}
    f = TrainerOptions.__dataclass_fields__["patience_steps"]
    assert train["trainer.patience_steps"].check is f.metadata["rule"]
    assert train["trainer.patience_steps"].what == f.metadata["rule_help"]
    # sections: a typed one (trainer), a dict one (index.gc: IndexGC's and GCOptions' keys), each of a mapping
    assert {"gc.n_queries", "gc.alpha", "kmeans.svd_dim", "atomic.warn_above"} <= {r.key for r in INDEX_RULES}
    assert {"cluster.gc.phi", "cluster.variants.*.phi"} <= {r.key for r in CLUSTER_RULES}
    # a rule that checks nothing is left out of the tables
    assert "trainer.strategy" not in train and "tag" not in {r.key for r in EVALUATE_RULES}


def test_a_rule_without_help_says_the_fields_help():
    @dataclass
    class Section:
        n: int = setting(1, "how many", rule=POSITIVE)
        name: str = setting("x", "free", rule=any_value)
        m: int = setting(1, "long help", rule=POSITIVE, rule_help="")

    assert [(r.key, r.what) for r in fields_rules(Section, "s.")] == [("s.n", "how many"), ("s.m", "")]
    with pytest.raises(ConfigError, match=r"^s\.n=0: must be a positive integer \(how many\)$"):
        check_rules(OmegaConf.create({"s": {"n": 0}}), fields_rules(Section, "s."))


def test_a_same_setting_carries_its_rule_and_a_new_help_says_it():
    @dataclass
    class Origin:
        n: int = setting(1, "a long help", rule=POSITIVE, rule_help="how many")

    @dataclass
    class Same:
        kept: int = same_setting(Origin, "n")
        told: int = same_setting(Origin, "n", "how many here")

    assert [(r.key, r.check, r.what) for r in fields_rules(Same)] == [("kept", POSITIVE, "how many"),
                                                                     ("told", POSITIVE, "how many here")]


def test_cross_field_rules_see_their_section():
    with pytest.raises(ConfigError, match=r"^k=20: must be <= beam=5"):
        EvaluateSettings(k=20, beam=5)
    with pytest.raises(ConfigError, match=r"^trainer\.min_steps=9: must be <= trainer\.max_steps=3"):
        TrainSettings(trainer={"min_steps": 9, "max_steps": 3})
    cfg = OmegaConf.create({"trainer": {"min_steps": 9, "max_steps": 3}})
    with pytest.raises(ConfigError, match=r"^train\.trainer\.min_steps=9: must be <="):
        check_rules(cfg, TRAIN_RULES, "train")
    # NCI's corrupted view is the regulariser's second view: refused where the regulariser is off
    with pytest.raises(ConfigError, match=r"^optim\.consistency_view=corrupted: corrupted is the second view of the "
                                          r"consistency regulariser, which optim\.consistency_weight=0 turns off"):
        TrainSettings(optim={"consistency_view": "corrupted"})
    with pytest.raises(ConfigError, match=r"^optim\.consistency_view=mask: must be one of dropout, corrupted"):
        TrainSettings(optim={"consistency_view": "mask", "consistency_weight": 0.15})
    assert TrainSettings(optim={"consistency_view": "corrupted", "consistency_weight": 0.15}).optim.consistency_view \
        == "corrupted"


def test_a_training_setting_is_checked_by_its_fields_rule():
    with pytest.raises(ConfigError, match=r"^trainer\.patience_steps=0: must be null or a positive integer "
                                          r"\(steps without improvement before stopping; null = `patience`\)$"):
        TrainSettings(trainer={"patience_steps": 0})
    assert TrainSettings(trainer={"patience_steps": 200}).trainer.patience_steps == 200
