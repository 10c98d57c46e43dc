import re
from pathlib import Path

import numpy as np
import pytest
from hydra.errors import MissingConfigException
from omegaconf import OmegaConf

from gdr.cli import COMMANDS, main
from gdr.config import load_config, save_config
from gdr.eval.cluster_report import cluster_corpus, restrict, results_table


def test_every_command_resolves():
    import importlib

    for name, (module, func) in COMMANDS.items():
        assert callable(getattr(importlib.import_module(module), func)), name


def test_help_and_unknown_command(capsys):
    assert main(["--help"]) == 0
    assert "cluster" in capsys.readouterr().out
    assert main(["nope"]) == 2


def test_config_composition_and_overrides(tmp_path):
    cfg = load_config("cluster", ["data=r5", "data.n_docs=10", "cluster.gc.alpha=1.0", "+experiment=reuters"])
    assert cfg.data.name == "r5" and cfg.data.n_docs == 10  # command-line overrides win over the experiment
    assert cfg.cluster.gc.alpha == 1.0 and set(cfg.cluster.variants) == {"gc", "alpha=1", "naive-phi", "no-clip"}
    assert cfg.model.name == "smollm2-135m" and cfg.model.prompt.style == "chat"
    assert cfg.score.shard_size > 0 and cfg.sample.n_queries == 64
    path = save_config(cfg, tmp_path)
    assert "alpha: 1.0" in path.read_text()
    with pytest.raises(MissingConfigException, match="data/does-not-exist"):
        load_config("cluster", ["data=does-not-exist"])


def test_a_composed_config_is_kept_handed_out_as_a_copy_and_composed_again_when_a_file_changes(tmp_path,
                                                                                                monkeypatch):
    import os
    import shutil

    from gdr.config import conf_dir
    from gdr.rerun import _composed

    shutil.copytree(conf_dir(), tmp_path / "conf")
    monkeypatch.setenv("GDR_CONF_DIR", str(tmp_path / "conf"))
    _composed.cache_clear()
    first = load_config("cluster", ["cluster.gc.alpha=0.5"])
    first.cluster.gc.alpha = 9.0  # the caller's copy
    again = load_config("cluster", ["cluster.gc.alpha=0.5"])
    assert again.cluster.gc.alpha == 0.5 and (_composed.cache_info().hits, _composed.cache_info().misses) == (1, 1)
    # an edited file (the same size, a later time) is read again
    stage = tmp_path / "conf" / "stage" / "cluster.yaml"
    text = stage.read_text()
    assert "repeats: 10" in text
    stage.write_text(text.replace("repeats: 10", "repeats: 11"))
    os.utime(stage, ns=(stage.stat().st_atime_ns, stage.stat().st_mtime_ns + 10**9))
    assert load_config("cluster", ["cluster.gc.alpha=0.5"]).cluster.repeats == 11
    assert _composed.cache_info().misses == 2


def test_restrict_keeps_rows_and_their_queries():
    labels = ["earn", "acq", "crude", "earn"]
    source = np.array([0, 2, 3, 1, 2])
    rows, cols = restrict(np.zeros((4, 5)), labels, source, ["earn", "acq"])
    assert rows.tolist() == [0, 1, 3] and cols.tolist() == [0, 2, 3]
    with pytest.raises(ValueError, match="not among the corpus labels"):
        restrict(np.zeros((4, 5)), labels, source, ["ship"])


def test_cluster_corpus_on_planted_logp():
    rng = np.random.default_rng(0)
    k, per, j = 3, 20, 30
    profile = rng.normal(-60, 15, (k, j))
    y = np.repeat(np.arange(k), per)
    logp = profile[y] + rng.normal(0, 2, (k * per, j))
    queries = [f"query {q}" for q in range(j)]
    res = cluster_corpus(logp, queries, k, {"gc": {"alpha": 0.25, "clip_sigma": 5.0, "phi": "power"}},
                         labels=[f"t{v}" for v in y], baselines=["logp"], n_init=3, repeats=2, seed=0,
                         describe_top=5)
    gc = res["methods"]["GC"]
    assert gc["mean"]["acc"] == pytest.approx(100.0)
    assert len(gc["descriptions"]) == k and all(len(d) == 5 for d in gc["descriptions"])
    tops = [d[0][0] for d in gc["descriptions"]]
    assert len(set(tops)) == k  # each cluster is described by what sets it apart
    for c, d in enumerate(gc["descriptions"]):  # the top query is one the cluster's own profile favours
        members = np.asarray(gc["labels"]) == c
        j = int(d[0][0].split()[1])
        assert logp[members, j].mean() > logp[~members, j].mean()
    assert "k-means (logp)" in res["methods"]
    table = results_table(res)
    assert "| GC | 100.0 (0.0)" in table


@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_every_command_has_help(capsys, flag):
    """`gdr <command> --help` (and -h) prints the command's help for every command, not Hydra's
    `LexerNoViableAltException: --help` (exit 2)."""
    from gdr.cli import HELP

    for name in COMMANDS:
        assert main([name, flag]) == 0, name
        out = capsys.readouterr().out
        assert out.startswith(f"usage: gdr {name}") and HELP[name] in out, out[:300]
    assert main(["run", "data=r5", flag]) == 0  # anywhere on the line, with overrides before it
    assert capsys.readouterr().out.startswith("usage: gdr run")


def test_help_is_generated_from_the_configs_and_the_rules(capsys):
    """Defaults from the composed config, meanings from the YAML comments (else the rule), allowed values
    from the rules: every key a rule checks appears with its default; groups list conf/'s options."""
    from gdr.cli.help import CONFIG_OF
    from gdr.validate import TABLES

    assert main(["run", "--help"]) == 0
    out = capsys.readouterr().out
    lines = {ln.split(" = ")[0].strip(): ln for ln in out.splitlines() if " = " in ln}
    assert "J [a positive integer]" in lines["sample.n_queries"] and "= 64 " in lines["sample.n_queries"]
    fractions = lines["queries.fractions"]
    assert "= null" in fractions and "train/dev/test shares of the topics" in fractions
    assert "[null or three numbers >= 0" in out  # the rule, on a wrapped line
    assert "= null" in lines["queries.folds"] and "cross-validate over K folds" in lines["queries.folds"]
    assert "= small30m" in lines["train.model.size"] and "tiny | mini" in out
    assert "bbc (default) |" in out and "+experiment" in out and "demo" in out
    for command in ("train", "sample", "index"):
        assert main([command, "-h"]) == 0
        text = capsys.readouterr().out
        cfg = load_config(CONFIG_OF[command], ["docids=x"] if command == "train" else [])
        for prefix, rules in TABLES[command]:
            for rule in rules:
                key = f"{prefix}.{rule.key}" if prefix else rule.key
                if "*" not in key and OmegaConf.select(cfg, key, default="<absent>") != "<absent>":
                    assert f"  {key} = " in text, (command, key)


@pytest.mark.parametrize("option", sorted(p.stem for p in (Path(__file__).resolve().parent.parent / "conf" / "data")
                                          .glob("*.yaml")))
def test_run_help_lists_every_setting_of_the_chosen_data_group(capsys, option):
    """`gdr run data=trec --help` lists what data=trec is set with (data.text_fields, data.queries, data.qrels,
    data.on_empty, ...) with its defaults, not those of the default corpus: every key of conf/data/<option>.yaml."""
    assert main(["run", f"data={option}", "--help"]) == 0
    out = capsys.readouterr().out
    assert f"{option} (chosen)" in out
    for key in OmegaConf.to_container(OmegaConf.load(
            Path(__file__).resolve().parent.parent / "conf" / "data" / f"{option}.yaml")):
        if key != "defaults":
            assert f"\n  data.{key} = " in out, (option, key)
    if option == "trec":
        lines = {ln.split(" = ")[0].strip(): ln for ln in out.splitlines() if " = " in ln}
        assert "= [TEXT]" in lines["data.text_fields"] and "= trec" in lines["data.name"]


def test_a_misspelt_experiment_is_named_not_the_argument_whose_path_holds_a_quoted_word(capsys):
    """Hydra's message quotes 'run' (the config) and 'experiment/bcc': the argument named is +experiment=bcc, not
    out=runs/bbc, which holds 'run'."""
    assert main(["run", "+experiment=bcc", "out=runs/bbc"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("gdr run: error: +experiment=bcc: In 'run': Could not find 'experiment/bcc'"), err


def test_the_help_example_runs(capsys):
    assert main(["--help"]) == 0
    command, *overrides = re.search(r"e\.g\. `gdr (cluster [^`]+)`", capsys.readouterr().out).group(1).split()
    assert load_config(command, overrides).sample.n_queries == 64  # every key exists (Hydra refuses one that does not)


def test_help_with_an_option_that_does_not_exist_says_so_in_one_line(capsys):
    """`gdr run data=nosuch --help`: the help of the defaults, with one line naming the option, not a traceback."""
    assert main(["run", "data=nosuch", "--help"]) == 0
    out = capsys.readouterr().out
    assert "data=nosuch: " in out and "Could not find 'data/nosuch' (the defaults follow)" in out
    assert "bbc (default)" in out and "Traceback" not in out


def test_a_next_line_repeats_the_corpus_the_user_named_and_quotes_what_it_adds():
    from gdr.cli.common import next_command

    argv = ["data=r5", "data.n_docs=800", "sample.n_queries=64", "out=runs/r 5"]
    assert next_command(argv, "train", "docids=runs/r 5-gc/docids.tsv") == \
        "gdr train data=r5 data.n_docs=800 'docids=runs/r 5-gc/docids.tsv'"
    assert next_command(argv, "cluster", keep=("data", "sample", "out")) == \
        "gdr cluster data=r5 data.n_docs=800 sample.n_queries=64 'out=runs/r 5'"
    assert next_command(["method=gc", "run=runs/r5"], "train", "docids=x") == "gdr train data=<your corpus> docids=x"
