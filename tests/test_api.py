"""The Python API (gdr/__init__.py, gdr/api.py) and examples/demo_api.py, with tiny models (offline, CPU)."""
from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path

import pytest
from test_pipeline import setup  # noqa: F401  (module fixture: a saved tiny LM and a 30-document corpus)

import gdr
from gdr.cli import main
from gdr.validate import ConfigError

ROOT = Path(__file__).resolve().parent.parent


def test_import_is_cheap_and_every_export_resolves():
    code = "import sys, gdr; print(sorted(m for m in ('torch', 'transformers', 'numpy', 'hydra') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == "[]"
    for name in gdr.__all__:
        assert getattr(gdr, name) is not None, name
    assert gdr.GenerativeClustering.__name__ == "GenerativeClustering" and "score" in dir(gdr)
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        _ = gdr.nope
    assert gdr.stages.settings.SampleSettings is gdr.SampleSettings  # submodules load on access too


def test_settings_refuse_unknown_keys_and_merge_dicts():
    with pytest.raises(TypeError, match="SampleSettings: unknown setting.*nqueries"):
        gdr.SampleSettings.from_dict({"nqueries": 3})
    s = gdr.ClusterSettings.merged(gc={"alpha": "auto"})
    assert s.gc == gdr.stages.settings.ClusterGC(alpha="auto", clip_sigma=5.0, phi="power", ess_target=0.5)
    t = gdr.TrainSettings.merged(trainer={"max_epochs": 2})
    assert t.trainer.max_epochs == 2 and t.trainer.batch_size == 64 and t.model.size == "small30m"


def test_run_refuses_bad_settings_before_anything_loads(nothing_loads, tmp_path):
    with pytest.raises(ConfigError, match=r"sample\.n_queries=-3"):
        gdr.run({"sample": {"n_queries": -3}, "out": str(tmp_path)})
    with pytest.raises(ConfigError, match=r"^unknown key sample\.nqueries; did you mean sample\.n_queries\?"):
        gdr.run({"sample": {"nqueries": 3}, "out": str(tmp_path)})


def _as_settings(args: list[str]) -> dict:
    """``gdr run`` overrides (``a.b=v``) as the nested dict gdr.run takes."""
    out: dict = {}
    for arg in args[1:]:
        key, value = arg.split("=", 1)
        node = out
        *parents, leaf = key.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        if value.startswith("["):
            node[leaf] = [int(x) if x.isdigit() else x for x in value[1:-1].split(",")]
        elif value in ("true", "false"):
            node[leaf] = value == "true"
        else:
            try:
                node[leaf] = int(value)
            except ValueError:
                node[leaf] = value
    return out


def test_run_from_a_dict_is_the_command(tiny_run, tmp_path):
    """gdr.run(dict) keys its stages like `gdr run` with the same overrides: it reuses every stage of the
    command's run folder (conftest's tiny_run, copied) and reports the same numbers."""
    _, args = tiny_run.copy(tmp_path / "run")
    cli = json.loads(tiny_run.printed)
    report = gdr.run(_as_settings(args))
    assert all(s["reused"] for s in report["stages"])
    head = gdr.headline(report)
    assert {k: v for k, v in head.items() if k != "seconds"} == {k: v for k, v in cli.items() if k != "seconds"}


@pytest.mark.slow(seconds=15)
def test_example_runs_at_tiny_sizes(setup, tmp_path):
    """examples/demo_api.py, as README runs it, at tiny sizes: every step of the demo through the API."""
    root, _ = setup
    cmd = [sys.executable, str(ROOT / "examples" / "demo_api.py"), "--docs", "20", "--queries", "8", "--model",
           str(root / "tiny-llama"), "--retriever", "tiny", "--epochs", "1", "--max-steps", "2", "--processes", "1",
           "--baselines", "logp", "--out", str(tmp_path / "ex")]
    p = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    line = json.loads(p.stdout.strip().splitlines()[-1])
    assert {"seconds", "gc_ari", "logp_kmeans_ari", "gc_largest_cluster_share", "recall_at_1", "hkmi_recall_at_1",
            "bm25_recall_at_1"} <= set(line)
    assert line["n_docs"] == 20 and line["n_test_queries"] > 0
    assert 0 < line["gc_largest_cluster_share"] <= 1 and all(0 <= line[k] <= 100 for k in
                                                              ("recall_at_1", "hkmi_recall_at_1", "bm25_recall_at_1"))
    for folder in ("score", "cluster", "index-gc", "index-hkmi", "train-gc", "eval-gc", "bm25"):
        assert (tmp_path / "ex" / folder).is_dir(), folder
    assert "LOAD REPORT" not in p.stderr and "faiss.loader" not in p.stderr and "Tip:" not in p.stderr


def test_sample_and_cluster_commands_call_the_stages(setup, tmp_path, capsys, caplog):
    """`gdr sample` (J queries, and per_doc) and `gdr cluster` end to end on the tiny LM: the command layer
    composes the settings the stages take, and the API's score gives the same P as the command."""
    root, folder = setup
    common = [f"data.name={folder}", f"model.name={root / 'tiny-llama'}", "model.max_doc_tokens=24",
              "sample.n_queries=8", "sample.max_new_tokens=6", "progress=false", "threads=1"]
    assert main(["sample", *common, f"out={tmp_path / 's'}"]) == 0
    assert len((tmp_path / "s" / "queries.jsonl").read_text().splitlines()) == 8
    assert main(["sample", *common, "sample.per_doc=2", f"out={tmp_path / 'd'}"]) == 0
    rows = [json.loads(x) for x in (tmp_path / "d" / "doc_queries.jsonl").read_text().splitlines()]
    assert len(rows) == 30 and all(len(r["queries"]) == 2 for r in rows)
    assert main(["cluster", *common, "cluster.n_clusters=3", "cluster.baselines=[logp]", "cluster.repeats=1",
                 "cluster.n_init=1", f"out={tmp_path / 'c'}"]) == 0
    assert "cluster 0:" in capsys.readouterr().out
    labels = (tmp_path / "c" / "labels.tsv").read_text().splitlines()
    assert len(labels) == 30 and {x.split("\t")[1] for x in labels} <= {"0", "1", "2"}
    assert (tmp_path / "c" / "cluster.config.yaml").is_file()
    # again with K = 2 in the same folder: P is reused, the clustering replaced, and a line says what changed
    with caplog.at_level(logging.WARNING, logger="gdr.cli.commands.cluster"):
        assert main(["cluster", *common, "cluster.n_clusters=2", "cluster.baselines=[logp]", "cluster.repeats=1",
                     "cluster.n_init=1", f"out={tmp_path / 'c'}"]) == 0
    assert "replacing the clustering of other settings (cluster.n_clusters (3 -> 2))" in caplog.text
    assert {x.split("\t")[1] for x in (tmp_path / "c" / "labels.tsv").read_text().splitlines()} <= {"0", "1"}

    corpus = gdr.load_corpus(str(folder))
    p = gdr.score(corpus, gdr.LMSettings(name=str(root / "tiny-llama"), max_doc_tokens=24, threads=1),
                  tmp_path / "api", n_queries=8, sampling={"max_new_tokens": 6})
    import numpy as np

    assert np.array_equal(np.asarray(p.logp), np.load(tmp_path / "c" / "P.npy"))
    assert gdr.GenerativeClustering(n_clusters=3, n_init=1).fit_predict(p.logp).shape == (30,)
