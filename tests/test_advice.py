"""Every advised command works as printed: each place in the code that builds a `gdr ...` command
into a message (found by grep, below) is run here: the message is provoked, the command taken from it verbatim,
run, and the folder then reads. The commands are rebuilt from the folder's own saved config
(:func:`gdr.rerun.rerun_command`), with the corpus's ``data=`` group and every key the command needs."""
from __future__ import annotations

import json
import re
import shlex
import shutil
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from test_cli_errors import error_of
from test_pipeline import setup  # noqa: F401  (module fixture: a saved tiny LM and a 30-document corpus)

from gdr.cli import main

ROOT = Path(__file__).resolve().parent.parent
# A message holding a command is built by one of these; each site is run by the tests named here.
ADVICE = re.compile(r"RerunCommand\(|sample_command\(|_RescoreAdvice\(|next_steps\(")
SITES = {
    "gdr/store/__init__.py": ["test_queries_changed_after_sampling", "test_a_p_matrix_without_its_manifest",
                              "test_an_unfinished_p_matrix",
                              "test_the_advised_rescore_command_works_as_printed (test_guard)",
                              "test_doc_ids_json_damaged"],
    "gdr/store/rows.py": ["test_a_truncated_p_matrix_given_to_gdr_index"],
    "gdr/stages/doc_queries.py": ["test_finished_doc_queries_damaged"],
    "gdr/stages/index_add.py": ["test_a_damaged_gc_index_given_to_index_add", "test_index_add_advice_pastes",
                                "test_index_add_advice_pastes (a P of fewer queries)"],
    "gdr/upgrade.py": ["test_a_gc_index_of_format_0_given_to_index_add"],
    "gdr/cli/commands/index.py": ["test_index_add_advice_pastes"],
    "training/data.py": ["test_the_advised_resample_command_works_as_printed (test_faults)",
                         "test_doc_queries_without_a_manifest_with_a_doc_twice"],
    "training/search.py": ["test_the_advised_retrain_command_works_as_printed (test_faults)"],
    "indexing/docids.py": ["test_the_docids_advice_of_an_hkmi_index_names_its_corpus"],
    "gdr/stages/score.py": ["test_the_sample_command_for_a_multi_process_score",
                            "test_shards_left_unscored_are_scored_by_the_advised_rerun"],
    "gdr/cli/commands/sample.py": ["test_the_sample_command_for_a_multi_process_score"],
}


def test_every_advice_site_is_run_by_a_test():
    """A new place that prints a command must be added to SITES with the test that runs its command."""
    found = Counter()
    for top in ("gdr", "indexing", "training", "eval"):
        for path in sorted((ROOT / top).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            for line in path.read_text(encoding="utf-8").splitlines():
                if ADVICE.search(line) and not re.match(r"\s*(def|class) ", line) and not line.lstrip().startswith(
                        ("#", "from ", "import ", '"""')) and rel != "gdr/rerun.py":
                    found[rel] += len(ADVICE.findall(line))
    assert found == Counter({k: len(v) for k, v in SITES.items()}), found
    tests = {name for names in SITES.values() for name in names if " (" not in name}
    assert tests <= set(globals()), tests - set(globals())


@pytest.fixture(scope="module")
def scored(setup, tmp_path_factory):  # noqa: F811
    """A finished `gdr score` folder (kept pristine: tests work on copies) and its command line."""
    root, folder = setup
    out = tmp_path_factory.mktemp("advice") / "scored"
    args = ["score", f"data.name={folder}", f"model.name={root / 'tiny-llama'}", "model.max_doc_tokens=24",
            "sample.n_queries=8", "sample.max_new_tokens=6", "score.shard_size=8", "progress=false", "threads=1",
            f"out={out}"]
    assert main(args) == 0
    return out, args


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns(".gdr.lock"))
    return dst


def _run_advised(text: str) -> None:
    """Delete what the message says to delete, then run the command in its backticks, as printed."""
    deletes = re.search(r"delete (\S+?)(?: and (\S+?))?(?: \(|,|$| in)", text)
    if deletes and "then run" in text or deletes and "and run" in text:
        for f in filter(None, deletes.groups()):
            Path(f).unlink(missing_ok=True)
    cmd = re.search(r"`(gdr [^`]+)`", text)  # the first: the command to run (others are named)
    assert cmd, text
    assert main(shlex.split(cmd.group(1))[1:]) == 0, cmd.group(1)


def test_a_p_matrix_without_its_manifest(scored, tmp_path):
    from gdr.store import load_run

    out = _copy(scored[0], tmp_path / "s")
    (out / "P.manifest.json").unlink()
    with pytest.raises(FileNotFoundError) as e:
        load_run(out)
    _run_advised(str(e.value))
    assert load_run(out).logp.shape == (30, 8)


@pytest.mark.parametrize("require_manifest", [True, False])  # as `gdr cluster` and `gdr index` open a run
def test_an_unfinished_p_matrix(scored, tmp_path, require_manifest):
    from gdr.store import load_run

    out = _copy(scored[0], tmp_path / "s")
    man = json.loads((out / "P.manifest.json").read_text())
    man["status"] = "running"
    (out / "P.manifest.json").write_text(json.dumps(man))
    with pytest.raises(ValueError) as e:
        load_run(out, require_manifest=require_manifest)
    _run_advised(str(e.value))
    assert np.array_equal(load_run(out).logp, np.load(scored[0] / "P.npy"))


def test_doc_ids_json_damaged(scored, tmp_path):
    from gdr.store import load_run

    out = _copy(scored[0], tmp_path / "s")
    (out / "doc_ids.json").write_text("[")
    with pytest.raises(ValueError) as e:
        load_run(out)
    _run_advised(str(e.value))
    assert load_run(out).doc_ids == json.loads((scored[0] / "doc_ids.json").read_text())


def test_queries_changed_after_sampling(scored, tmp_path):
    from gdr.store import load_run, read_queries

    out = _copy(scored[0], tmp_path / "s")
    lines = (out / "queries.jsonl").read_text().splitlines(keepends=True)
    (out / "queries.jsonl").write_text("".join(lines[1:]))
    with pytest.raises(ValueError) as e:
        read_queries(out)
    text = str(e.value)
    assert "re-sample: delete" in text and "P.npy" in text
    for name in ("queries.jsonl", "queries.manifest.json", "P.npy", "P.manifest.json"):
        (out / name).unlink(missing_ok=True)  # what the message names, P included
    shutil.rmtree(out / "P.shards", ignore_errors=True)
    _run_advised(text.split("(and any")[0] + re.search(r"then run `[^`]+`", text).group(0))
    assert np.array_equal(load_run(out).logp, np.load(scored[0] / "P.npy"))  # the same seed: the same queries


def test_a_truncated_p_matrix_given_to_gdr_index(scored, tmp_path, capsys):
    out = _copy(scored[0], tmp_path / "s")
    data = (out / "P.npy").read_bytes()
    (out / "P.npy").write_bytes(data[: len(data) // 2])
    man = json.loads((out / "P.manifest.json").read_text())
    man.pop("file", None)  # a manifest without the file's checksum: the header check of PMatrix speaks
    (out / "P.manifest.json").write_text(json.dumps(man))
    from gdr.store.rows import PMatrix

    with pytest.raises(ValueError) as e:
        PMatrix(out / "P.npy")
    assert "is truncated" in str(e.value)
    _run_advised(str(e.value))
    assert (out / "P.npy").read_bytes() == data


def test_the_sample_command_for_a_multi_process_score(scored, tmp_path):
    """A rank > 0 of a multi-process `gdr score` without sampled queries names the `gdr sample` that makes them."""
    from gdr.cli.common import without_section
    from gdr.stages.score import sample_command

    out = tmp_path / "s"
    args = [a if not a.startswith("out=") else f"out={out}" for a in scored[1]]
    _run_advised(f"run `{sample_command(out, without_section(args[1:], 'score'))}` before a multi-process `gdr score`")
    assert (out / "queries.jsonl").read_text() == (scored[0] / "queries.jsonl").read_text()


def test_shards_left_unscored_are_scored_by_the_advised_rerun(scored, tmp_path):
    """Scoring processes that left shards unscored: the stage fails with the rerun that scores them."""
    from gdr.stages.score import _check_complete
    from gdr.store import load_run

    out = _copy(scored[0], tmp_path / "s")
    man = json.loads((out / "P.manifest.json").read_text())
    (out / "P.manifest.json").write_text(json.dumps({**man, "status": "partial"}))
    for s in (1, 3):
        (out / "P.shards" / f"{s:05d}.done").unlink()
    with pytest.raises(RuntimeError, match=r"2 shard\(s\) left unscored \(1, 3\)") as e:
        _check_complete(out)
    _run_advised(str(e.value))
    assert np.array_equal(load_run(out).logp, load_run(scored[0]).logp)


# ----------------------------------------------------------------------------------- generated queries
@pytest.fixture(scope="module")
def doc_queries(setup, tmp_path_factory):  # noqa: F811
    root, folder = setup
    out = tmp_path_factory.mktemp("advice-dq") / "dq"
    assert main(["sample", f"data.name={folder}", f"model.name={root / 'tiny-llama'}", "model.max_doc_tokens=24",
                 "sample.per_doc=2", "sample.max_new_tokens=6", "progress=false", "threads=1", f"out={out}"]) == 0
    return out


def test_finished_doc_queries_damaged(setup, doc_queries, tmp_path, capsys):  # noqa: F811
    """`gdr sample sample.per_doc=N` into a finished folder whose file was changed: refused with the command."""
    root, folder = setup
    out = _copy(doc_queries, tmp_path / "dq")
    good = (out / "doc_queries.jsonl").read_bytes()
    lines = good.splitlines(keepends=True)
    (out / "doc_queries.jsonl").write_bytes(b"".join(lines[:1] + lines[2:]))
    from gdr.config import rerun_command

    line = error_of(capsys, shlex.split(rerun_command("sample", out))[1:])
    assert "re-sample: delete" in line, line
    _run_advised(line)
    assert (out / "doc_queries.jsonl").read_bytes() == good


def test_doc_queries_without_a_manifest_with_a_doc_twice(doc_queries, tmp_path):
    from gdr.training.data import read_generated_queries

    out = _copy(doc_queries, tmp_path / "dq")
    good = (out / "doc_queries.jsonl").read_bytes()
    lines = good.splitlines(keepends=True)
    (out / "doc_queries.jsonl").write_bytes(b"".join(lines + lines[-1:]))
    (out / "doc_queries.manifest.json").unlink()  # a copy without its manifest: the lines are checked
    with pytest.raises(ValueError) as e:
        read_generated_queries(out / "doc_queries.jsonl", [f"d{i}" for i in range(30)])
    assert "also on line" in str(e.value) and "delete" in str(e.value)
    _run_advised(str(e.value))
    assert (out / "doc_queries.jsonl").read_bytes() == good


def test_a_damaged_gc_index_given_to_index_add(scored, tmp_path, capsys):
    idx = tmp_path / "idx"
    build = ["index", "method=gc", f"run={scored[0]}", "n_clusters=4", "leaf_size=4", "gc.n_init=1", "plot=false",
             f"out={idx}"]
    assert main(build) == 0
    good = (idx / "docids.tsv").read_text()
    (idx / "docids.tsv").write_text(good + good.splitlines(keepends=True)[-1])
    capsys.readouterr()
    line = error_of(capsys, ["index", "add", f"run={scored[0]}", f"index={idx}"])
    assert "rebuild the index with `gdr index " in line, line
    _run_advised(line)
    assert (idx / "docids.tsv").read_text() == good


def test_a_gc_index_of_format_0_given_to_index_add(scored, tmp_path, capsys):
    """A GC index that recorded only its queries' ids (format 0): the `gdr index` it advises builds it again, and
    the index then records its queries by content."""
    from gdr.indexing.state import load_tree_state, save_tree_state
    from gdr.io import refresh_manifest_files

    idx = tmp_path / "idx"
    assert main(["index", "method=gc", f"run={scored[0]}", "n_clusters=4", "leaf_size=4", "gc.n_init=1",
                 "plot=false", f"out={idx}"]) == 0
    state = load_tree_state(idx / "tree_state.npz")
    state.meta.pop("queries")
    save_tree_state(idx / "tree_state.npz", state)
    refresh_manifest_files(idx)
    capsys.readouterr()
    line = error_of(capsys, ["index", "add", f"run={scored[0]}", f"index={idx}"])
    assert "a GC index of format 0" in line and "build the index again with `gdr index " in line, line
    _run_advised(line)
    assert load_tree_state(idx / "tree_state.npz").meta["queries"]["n_queries"] == state.n_queries


def test_index_add_advice_pastes(setup, tmp_path, capsys):  # noqa: F811
    """The refusal of a P of other queries prints the `gdr score` of the new documents, filled from the saved
    configs; the `gdr train` that ends a successful `gdr index add` trains on every document, old and new."""
    from gdr.data import load_corpus, write_beir

    root, folder = setup
    corpus = load_corpus(str(folder))
    old = write_beir(corpus.select(np.arange(24)), None, tmp_path / "old")
    new = write_beir(corpus.select(np.arange(24, 30)), None, tmp_path / "new")
    lm = [f"model.name={root / 'tiny-llama'}", "model.max_doc_tokens=24", "sample.n_queries=16",
          "sample.max_new_tokens=6", "progress=false", "threads=1"]
    run, idx, resampled = tmp_path / "run", tmp_path / "idx", tmp_path / "resampled"
    assert main(["score", f"data.name={old}", *lm, f"out={run}"]) == 0
    assert main(["index", "method=gc", f"run={run}", f"out={idx}", "n_clusters=4", "leaf_size=4", "gc.n_init=1",
                 "plot=false"]) == 0
    assert main(["score", f"data.name={new}", *lm, "sample.seed=1", f"out={resampled}"]) == 0
    capsys.readouterr()
    line = error_of(capsys, ["index", "add", f"run={resampled}", f"index={idx}", "plot=false"])
    cmd = re.search(r"`(gdr score [^`]+)`", line).group(1)
    assert "<" not in cmd and f"queries_from={run.resolve()}" in cmd and f"out={resampled}-rescored" in cmd, cmd
    _run_advised(line)
    # a P of fewer queries than the index's J: the same advice, which scores against all of them
    narrow = tmp_path / "narrow"
    assert main(["score", f"data.name={new}", *[a for a in lm if not a.startswith("sample.n_queries")],
                 "sample.n_queries=8", f"out={narrow}"]) == 0
    capsys.readouterr()
    line = error_of(capsys, ["index", "add", f"run={narrow}", f"index={idx}", "plot=false"])
    assert "P has 8 query columns, but the index" in line and f"out={narrow}-rescored" in line, line
    _run_advised(line)
    from gdr.store import load_run
    assert load_run(f"{narrow}-rescored").pmatrix.n_cols == 16
    assert main(["index", "add", f"run={resampled}-rescored", f"index={idx}", "plot=false"]) == 0
    said = capsys.readouterr().out
    cmd = re.search(r"`(gdr train [^`]+)`", said).group(1)
    assert "<" not in cmd and f"docids={idx / 'docids.tsv'}" in cmd and f"out_dir={resampled}-rescored-train" in cmd
    assert load_corpus("jsonl", path=idx / "documents.jsonl").doc_ids == [f"d{i}" for i in range(30)]
    tiny = ["model.size=tiny", "trainer.max_steps=2", "trainer.max_epochs=100", "trainer.batch_size=16",
            "trainer.tensorboard=false", "trainer.val_beam=4", "trainer.num_sanity_val_steps=0",
            "trainer.enable_progress_bar=false", "optim.warmup_steps=1"]  # the default retriever takes minutes
    assert main(shlex.split(cmd)[1:] + tiny) == 0, cmd
    assert len((tmp_path / "resampled-rescored-train" / "docids.tsv").read_text().splitlines()) == 30


# ----------------------------------------------------------------------------------- docids
def test_the_docids_advice_of_an_hkmi_index_names_its_corpus(setup, tmp_path, capsys):  # noqa: F811
    """The advice for a damaged docids.tsv of an hkmi index names its corpus (data=), without which it fails with
    `method=hkmi: needs the document texts`."""
    root, folder = setup
    idx = tmp_path / "idx"
    assert main(["index", "method=hkmi", "data=beir", f"data.path={folder}", "n_clusters=4", "leaf_size=4",
                 "plot=false", f"out={idx}"]) == 0
    good = (idx / "docids.tsv").read_text()
    lines = good.splitlines(keepends=True)
    (idx / "docids.tsv").write_text("".join(lines + lines[-1:]))
    capsys.readouterr()
    line = error_of(capsys, ["train", f"data.name={folder}", f"docids={idx / 'docids.tsv'}", "model.size=tiny",
                             f"out_dir={tmp_path / 't'}"])
    cmd = re.search(r"rebuild the file with `(gdr index [^`]+)`", line)
    assert cmd and "data=beir" in cmd.group(1), line
    assert main(shlex.split(cmd.group(1))[1:]) == 0
    assert (idx / "docids.tsv").read_text() == good
