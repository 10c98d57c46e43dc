"""Whether a setting keys its stage is said on its field (``effect`` in its metadata, gdr.rules.EFFECTS): the stage
keys' exclusions (gdr.pipeline), the settings a resumed `gdr train` may change (gdr.stages.train.RESUMABLE) and the
settings each indexer's ids depend on are derived from the fields, so a field that says nothing is refused here."""
from __future__ import annotations

from dataclasses import fields

import pytest

from gdr.rules import EFFECTS, effect_of, setting
from gdr.stages.settings import (
    EvaluateSettings,
    IndexSettings,
    SampleSettings,
    TrainSettings,
    config_dict,
    index_key_values,
    index_keys,
    keyed_values,
    settings_classes,
)
from gdr.stages.train import RESUMABLE
from gdr.training.options import TrainerOptions


def test_every_setting_says_what_it_does_to_the_result():
    classes = settings_classes()
    assert {TrainSettings, TrainerOptions, IndexSettings} <= set(classes)
    silent = [f"{cls.__name__}.{f.name}" for cls in classes for f in fields(cls) if effect_of(f) not in EFFECTS]
    assert silent == [], f"declare effect= (one of {', '.join(EFFECTS)}) on: {', '.join(silent)}"


def test_an_unknown_effect_is_refused_by_name():
    with pytest.raises(ValueError, match="effect='fast': must be one of result, speed, resume"):
        setting(1, effect="fast")


def test_resumable_trainer_settings_come_from_the_fields():
    assert {"patience_steps", "max_epochs", "accelerator", "compile", "enable_progress_bar"} <= RESUMABLE
    assert not {"batch_size", "precision", "gradient_clip_val", "length_buckets", "monitor"} & RESUMABLE


def test_speed_settings_key_no_stage_but_the_result_ones_do():
    sample = keyed_values(SampleSettings, {"n_queries": 8, "batch_size": 4, "compile": True, "top_k": 5})
    assert sample == {"n_queries": 8, "top_k": 5}
    assert keyed_values(EvaluateSettings, {"k": 10, "device": "cpu", "batch_size": 8}) == {"k": 10, "batch_size": 8}
    # per field, not per name: the trainer's batch size keys the retriever, the sampler's does not
    train = keyed_values(TrainSettings, {"concurrent": 2, "trainer": {"batch_size": 64, "num_workers": 4}})
    assert train == {"trainer": {"batch_size": 64}}


def test_each_indexer_is_keyed_by_the_settings_its_ids_depend_on():
    assert index_keys() == {"gc": ("seed", "n_clusters", "leaf_size", "gc"),
                            "hkmi": ("seed", "n_clusters", "leaf_size", "kmeans"),
                            "bmi": ("seed", "n_clusters", "leaf_size", "kmeans", "bmi"),
                            "random": ("seed", "n_clusters", "leaf_size"),
                            "atomic": ("atomic",)}
    # bmi's own section keys it as far as its inputs read it: not at all for its generated queries alone
    values = config_dict(IndexSettings())
    assert "bmi" not in index_key_values("bmi", values)
    values["bmi"].update(inputs="realq_genq_docseg", real_queries="/any/path.jsonl")
    assert index_key_values("bmi", values)["bmi"] == {"inputs": "realq_genq_docseg", "segments": 10,
                                                      "segment_words": 64}
    assert index_key_values("hkmi", values) == {k: values[k] for k in index_keys()["hkmi"]}


def test_the_consistency_view_keys_a_training_only_when_it_is_not_r_drops_own():
    """``optim.consistency_view: dropout`` is what every training did before the choice: it keys nothing, so their
    stages and `gdr train` folders stay; NCI's corrupted view keys the retriever it trains."""
    from gdr.stages.train import keyed_optim

    optim = config_dict(TrainSettings(optim={"consistency_weight": 0.15}))["optim"]
    assert optim["consistency_view"] == "dropout" and "consistency_view" not in keyed_optim(optim)
    assert keyed_optim({**optim, "consistency_view": "corrupted"}) == {**optim, "consistency_view": "corrupted"}


def test_a_dict_section_becomes_its_dataclass_at_the_door():
    """A script may give a section as a dict: it is converted to the section's dataclass (the rest at the class's
    defaults; merged keeps the stage's), and an unknown key is refused by name."""
    s = TrainSettings(trainer={"max_epochs": 3})
    assert isinstance(s.trainer, TrainerOptions) and s.trainer.max_epochs == 3
    assert s.trainer.patience_steps is TrainerOptions.patience_steps
    assert TrainSettings.merged(optim={"warmup_steps": 2}).optim.lr_scaling == TrainSettings().optim.lr_scaling
    with pytest.raises(TypeError, match=r"TrainSettings.trainer: unknown setting\(s\) max_epoch;"):
        TrainSettings(trainer={"max_epoch": 3})
