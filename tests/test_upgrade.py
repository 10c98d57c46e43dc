"""A folder of an older gdr is brought to the current format by one upgrade step, keeping its P: the old folder is a
tiny ``gdr run`` made by gdr at commit 101d818 (format 0), built once per module from the repository's history by
``fixtures/make_run_101d818.py`` (no run folder is committed)."""
from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from gdr.cli import main
from gdr.formats import FORMAT

FIXTURES = Path(__file__).parent / "fixtures"
ROOT = Path(__file__).resolve().parent.parent
OLD_COMMIT = "101d818"


@dataclass
class OldRun:
    """The stage folders of a run made by gdr at :data:`OLD_COMMIT`: ``path`` holds them (and its run.config.yaml),
    ``score`` and ``index`` name its score and GC index folders."""

    path: Path
    score: str
    index: str


def _fixture():
    """The fixture's module (its inputs and its run's arguments), loaded from its file."""
    spec = importlib.util.spec_from_file_location("make_run_101d818", FIXTURES / "make_run_101d818.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def old(tmp_path_factory) -> OldRun:
    """The score, doc-queries and GC index stages of a tiny run made by gdr at :data:`OLD_COMMIT` (its code taken
    from the repository's history with ``git archive``, run in a subprocess)."""
    base = tmp_path_factory.mktemp("old")
    checkout, where = base / "checkout", base / "made"
    checkout.mkdir()
    tar = subprocess.run(["git", "-C", str(ROOT), "archive", OLD_COMMIT], capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(checkout)], input=tar, check=True)
    subprocess.run([sys.executable, str(FIXTURES / "make_run_101d818.py"), str(checkout), str(where)], check=True,
                   capture_output=True, env={**os.environ, "PYTHONPATH": str(checkout)}, cwd=checkout)
    kept = base / "run"
    kept.mkdir()
    for pattern in ("score-*", "doc-queries-*", "index-gc-*"):
        for folder in (where / "run").glob(pattern):
            shutil.copytree(folder, kept / folder.name)
    shutil.copy(where / "run" / "run.config.yaml", kept)
    return OldRun(kept, next(kept.glob("score-*")).name, next(kept.glob("index-gc-*")).name)


@pytest.fixture
def old_run(old, tmp_path, monkeypatch):
    """A copy of the format-0 run folder beside the same tiny LM and corpus, the working folder set there (the
    fixture names its LM by the relative path ``tiny-llama``)."""
    fx = _fixture()
    fx.write_inputs(tmp_path)
    shutil.copytree(old.path, tmp_path / "run")
    monkeypatch.chdir(tmp_path)
    return tmp_path, fx


def _stages(run: Path) -> dict[str, dict]:
    return {s["name"]: s for s in json.loads((run / "report.json").read_text())["stages"]}


def test_a_run_folder_of_101d818_is_upgraded_and_its_p_kept_but_scored_again_under_the_end_rule(old, old_run, capsys):
    """Upgraded in place; its P scored every query's end as the end-of-sequence token, today's P scores the end as
    the sampler stopped (gdr.lm.scoring.QUERY_END keys the stage): the run scores a new P under a new key and leaves
    the upgraded one's bytes as they were."""
    root, fx = old_run
    run = root / "run"
    p_before = (old.path / old.score / "P.npy").read_bytes()
    assert main(["upgrade", str(run)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert any(line.startswith(f"{old.score}: format 0 -> 1, now score-") for line in lines)
    assert any(f"{old.index}: format 0 -> 1, retired (keyed by the corpus's settings and paths" in line
               for line in lines)
    score = next(run.glob("score-*"))
    stage = json.loads((score / "stage.json").read_text())
    assert stage["format"] == FORMAT and "name" not in stage["inputs"]["lm"]
    assert stage["inputs"]["lm"]["weights"].startswith("sha256:")
    for name in ("P.manifest.json", "queries.manifest.json"):
        man = json.loads((score / name).read_text())
        assert man["format"] == FORMAT and man["lm"]["weights"] == stage["inputs"]["lm"]["weights"]
    assert main(["upgrade", str(run)]) == 0  # a second upgrade finds nothing to do
    assert capsys.readouterr().out.strip() == f"{run}: already format {FORMAT}, nothing to upgrade"

    assert main(fx.run_args(root)) == 0
    stages = _stages(run)
    assert not stages["score"]["reused"] and stages["score"]["folder"] != score.name  # QUERY_END keys it
    # per-document queries are drawn again: that gdr dropped an empty generation, this one re-draws it
    # (gdr.lm.decode.PER_DOC_SAMPLER keys the stage)
    assert not stages["doc-queries"]["reused"]
    assert not stages["index-gc"]["reused"]  # keyed by paths at 101d818: built again under its content key
    assert (score / "P.npy").read_bytes() == p_before


def test_gdr_run_upgrades_an_old_folder_when_it_opens_it(old, old_run):
    root, fx = old_run
    assert main(fx.run_args(root)) == 0
    stages = _stages(root / "run")
    # QUERY_END keys the score stage and PER_DOC_SAMPLER the doc-queries one: both built again
    assert not stages["score"]["reused"] and not stages["doc-queries"]["reused"]
    upgraded = next(d for d in (root / "run").glob("score-*") if d.name != stages["score"]["folder"])
    assert json.loads((upgraded / "stage.json").read_text())["format"] == FORMAT
    assert (upgraded / "P.npy").read_bytes() == (old.path / old.score / "P.npy").read_bytes()


def test_a_newer_format_is_refused_in_one_line_naming_it(old, old_run, capsys):
    root, fx = old_run
    marker = root / "run" / old.score / "stage.json"
    marker.write_text(json.dumps({**json.loads(marker.read_text()), "format": FORMAT + 1}))
    before = {p: p.read_bytes() for p in (root / "run").rglob("*") if p.is_file()}
    for argv in (["upgrade", str(root / "run")], fx.run_args(root)):
        assert main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1
        assert f"{marker}: format {FORMAT + 1} is newer than this gdr's format {FORMAT}" in err
    after = {p: p.read_bytes() for p in before}
    assert after == before  # refused before any stage was changed


def test_a_p_folder_whose_model_is_gone_cannot_be_upgraded(old, tmp_path, capsys):
    """Format 0 named the LM by its path; where nothing is there any more its files cannot key P: refused in one
    line naming the version and the path, the manifest left as it was."""
    score = tmp_path / "score"
    shutil.copytree(old.path / old.score, score)
    (score / "stage.json").unlink()  # a P folder of `gdr score`, not a stage of a run
    man = json.loads((score / "P.manifest.json").read_text())
    gone = str(tmp_path / "moved" / "tiny-llama")
    (score / "P.manifest.json").write_text(json.dumps({**man, "lm": {**man["lm"], "model": gone}}))
    before = (score / "P.manifest.json").read_bytes()
    assert main(["upgrade", str(score)]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1
    assert f"format 0 names its model by the path {gone}, which is not there" in err
    assert (score / "P.manifest.json").read_bytes() == before


def test_an_upgrade_cut_short_before_a_rename_is_finished_by_the_next(old, old_run, monkeypatch):
    """stage.json is rewritten (to a temporary name, then renamed) before its folder takes the new key: an upgrade
    stopped between the two leaves a format-1 stage.json in the old folder, and the next upgrade renames it."""
    import gdr.upgrade as up

    root, _ = old_run
    run = root / "run"
    replace = os.replace

    def stopped(src, dst):  # files are still written (temporary name, then renamed); a stage folder is not
        if Path(dst).parent == run:
            raise KeyboardInterrupt
        replace(src, dst)

    monkeypatch.setattr(up.os, "replace", stopped)
    with pytest.raises(KeyboardInterrupt):
        up.upgrade_run(run)
    monkeypatch.undo()
    marker = json.loads((run / old.score / "stage.json").read_text())
    assert marker["format"] == FORMAT and marker["key"] != old.score.split("-", 1)[1]
    up.upgrade_run(run)
    assert not (run / old.score).exists()
    assert (run / f"score-{marker['key']}" / "P.npy").read_bytes() == (old.path / old.score / "P.npy").read_bytes()


def test_a_training_s_best_score_of_format_0_is_named_by_the_metric_that_chose_it():
    """Format 0 kept a training stage's best dev score as best_val_recall1 whatever trainer.monitor was."""
    from gdr.upgrade import _best_score

    assert _best_score({"best_val_recall1": 0.4, "global_step": 9}, {"monitor": "val/mrr"}) == \
        {"best_val_recall1": 0.4, "global_step": 9, "best_val_metric": "val/mrr", "best_val_score": 0.4}
    now = {"best_val_metric": "val/recall@1", "best_val_score": 0.5, "best_val_recall1": 0.5}
    assert _best_score(now, {"monitor": "val/mrr"}) == now  # recorded by its metric already


def _files(folder: Path) -> dict[Path, bytes]:
    """Every file of ``folder`` and its bytes, the lock a command takes on it (``.gdr.lock``) left out."""
    return {p: p.read_bytes() for p in folder.rglob("*") if p.is_file() and p.name != ".gdr.lock"}


def test_p_s_shard_markers_without_a_checksum_are_dropped_and_the_finished_p_kept(old, old_run, capsys):
    """A score stage of format 0 from before its files or its shard markers carried checksums: the markers (whose
    rows need the documents' prompt-length order) are dropped in one line, P's bytes stay, the stage's files are
    checked and recorded; the run scores under today's end rule in a stage of its own, leaving them."""
    root, fx = old_run
    run = root / "run"
    score = run / old.score
    for marker in (score / "P.shards").glob("*.done"):
        marker.write_text("")
    record = json.loads((score / "stage.json").read_text())
    (score / "stage.json").write_text(json.dumps({k: v for k, v in record.items() if k not in ("artifacts",
                                                                                               "outputs")}))
    p_before = (score / "P.npy").read_bytes()
    assert main(["upgrade", str(run)]) == 0
    out = capsys.readouterr().out
    assert any(line.startswith(f"{old.score}: format 0 -> 1, now score-") for line in out.splitlines())
    now = next(run.glob("score-*"))
    assert not list((now / "P.shards").glob("*.done"))
    stage = json.loads((now / "stage.json").read_text())
    assert stage["status"] == "complete" and "P.npy" in stage["artifacts"]
    assert not any(k.startswith("P.shards/") for k in stage["artifacts"])
    assert (now / "P.npy").read_bytes() == p_before

    assert main(fx.run_args(root)) == 0
    stages = _stages(run)
    assert not stages["score"]["reused"] and stages["score"]["folder"] != now.name
    assert (now / "P.npy").read_bytes() == p_before


def test_a_sampling_without_its_numerics_cannot_be_upgraded(old, tmp_path, capsys):
    """Format 0 before the numerics of the decode (device, dtype, decode path) were recorded: the folder cannot say
    what they were, so the upgrade refuses it in one line naming the format, before any file changes."""
    score = tmp_path / "score"
    shutil.copytree(old.path / old.score, score)
    (score / "stage.json").unlink()  # a P folder of `gdr score`, not a stage of a run
    man = json.loads((score / "queries.manifest.json").read_text())
    del man["numerics"]
    (score / "queries.manifest.json").write_text(json.dumps(man))
    before = _files(score)
    assert main(["upgrade", str(score)]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1
    assert (f"{score / 'queries.manifest.json'}: format 0 from before gdr recorded the numerics its queries were "
            "decoded with") in err and "sample them again into another out= folder" in err
    assert _files(score) == before


def test_a_gc_index_that_recorded_only_its_query_ids_is_refused_by_index_add(old, old_run, capsys):
    """A GC index of format 0 before its queries were recorded by content (tree_state.npz held their ids, q0 ..
    q{J-1} in every run): `gdr index add` cannot check new documents' P against them and refuses in one line
    naming the format and `gdr index`, changing nothing."""
    from gdr.indexing.state import load_tree_state, save_tree_state
    from gdr.io import refresh_manifest_files

    root, _ = old_run
    index = root / "run" / old.index
    state = load_tree_state(index / "tree_state.npz")
    state.meta.pop("queries")
    save_tree_state(index / "tree_state.npz", state)
    refresh_manifest_files(index)  # a whole index of that gdr: its manifest records these files
    before = _files(index)
    assert main(["index", "add", f"run={root / 'run' / old.score}", f"index={index}"]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1
    assert (f"{index / 'tree_state.npz'}: a GC index of format 0, from before gdr recorded the texts of the queries "
            "it was built on") in err and "build the index again with `gdr index" in err
    assert _files(index) == before


def test_upgrade_of_a_path_that_is_no_folder_says_which_it_is(tmp_path, capsys):
    (tmp_path / "afile").write_text("x")
    for path, what in ((tmp_path / "afile", "is a file, not a folder"), (tmp_path / "nowhere", "no such folder")):
        assert main(["upgrade", str(path)]) == 2
        assert f"{path}: {what}; pass a `gdr run` or `gdr score` output folder" in capsys.readouterr().err
