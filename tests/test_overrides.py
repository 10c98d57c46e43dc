"""Command-line overrides read by Hydra's own parser (gdr.cli.common), not split on '=' by hand."""
from __future__ import annotations

from gdr.cli.common import in_section, override_keys, without_section


def test_override_keys_are_read_by_hydras_parser():
    argv = ["+model.name=x", "data=bbc", "score.processes=2", "~seed", "++train.trainer.max_steps=3",
            "q='a=b c'", "model_dir=runs/m"]
    assert override_keys(argv) == ["model.name", "data", "score.processes", "seed", "train.trainer.max_steps", "q",
                                   "model_dir"]


def test_a_section_holds_its_own_keys_only():
    assert in_section("data", "data") and in_section("data.path", "data")
    assert not in_section("data_dir", "data") and not in_section("model_dir", "model")


def test_without_section_keeps_the_other_overrides_as_given():
    argv = ["data=jsonl", "score.processes=2", "+score.doc_batch_size=4", "sample.n_queries=8", "scores=x"]
    assert without_section(argv, "score") == ["data=jsonl", "sample.n_queries=8", "scores=x"]
