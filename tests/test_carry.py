"""An experiment that carries on (gdr prune / pack / unpack): a run's results leave without its models, rebuild
anywhere, and a rerun with more seeds trains only the new ones. Tiny random-init models, a 30-document corpus, CPU."""
from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import pytest
from test_pipeline import _args

from gdr.carry import MANIFEST, PIECE_MIB, WEIGHTS, pack_run, prunable, prune_run
from gdr.cli import main
from gdr.formats import STAGE_FILE, matches


def _run(tiny_run, out: Path, seeds: str) -> None:
    """`gdr run` of the session's ``tiny_run`` (its LM, corpus and arguments, in their order) into ``out``, with
    ``seeds``."""
    args = _args(tiny_run.root, tiny_run.folder, out, "indexers=[gc,random]")
    assert main([a if not a.startswith("seeds=") else f"seeds={seeds}" for a in args]) == 0


def _records(out: Path) -> dict[str, dict]:
    return {s["name"]: s for s in json.loads((out / "report.json").read_text())["stages"]}


def _without_seconds(x):
    """A report without what differs between identical runs: its seconds, whether a stage was reused, and the
    invocation's own accounts (``training``: what it trained and how fast; ``outside_stages``)."""
    if isinstance(x, dict):
        return {k: _without_seconds(v) for k, v in x.items()
                if "seconds" not in k and k not in ("reused", "training", "outside_stages")}
    if isinstance(x, list):
        return [_without_seconds(v) for v in x]
    return x


def _weights(folder: Path) -> list[str]:
    return [p.relative_to(folder).as_posix() for p in folder.rglob("*")
            if p.is_file() and matches(p.relative_to(folder).as_posix(), WEIGHTS)]


@pytest.fixture
def seed0(tiny_run):
    """A finished run of seed 0 (gc and random): the session's ``tiny_run``, copied by each test."""
    assert _args(tiny_run.root, tiny_run.folder, tiny_run.out, "indexers=[gc,random]") == tiny_run.args
    return tiny_run.out


def _copy(seed0: Path, tmp_path: Path) -> Path:
    out = tmp_path / "run"
    shutil.copytree(seed0, out, ignore=shutil.ignore_patterns(".gdr.lock"))
    return out


def test_prune_keeps_every_result_and_a_rerun_trains_nothing(tiny_run, seed0, tmp_path, capsys):
    out = _copy(seed0, tmp_path)
    capsys.readouterr()
    trains = sorted(out.glob("train-*"))
    assert len(trains) == 2 and all(_weights(t) for t in trains)
    before = {p.relative_to(out).as_posix(): p.read_bytes() for p in out.rglob("*")
              if p.is_file() and not p.name.startswith(".") and not _weights_file(out, p)}
    digests = {t.name: json.loads((t / STAGE_FILE).read_text()) for t in trains}

    assert main(["prune", str(out)]) == 0
    assert "pruned 2 evaluated retrievers" in capsys.readouterr().out
    for t in trains:
        assert _weights(t) == [] and (t / "logs" / "metrics.csv").is_file()
        rec = json.loads((t / STAGE_FILE).read_text())
        old = digests[t.name]
        assert rec["key"] == old["key"] and rec["status"] == "complete" and rec["info"] == old["info"]
        assert set(rec["pruned"]["files"]) == {r for r in old["artifacts"] if matches(r, WEIGHTS)}
        assert rec["pruned"]["bytes"] > 0 and not any(matches(r, WEIGHTS) for r in rec["artifacts"])
        # the digest the evaluation recorded of the weights is kept
        ev = json.loads(next(out.glob(f"eval-{t.name.split('-')[1]}-s0-*/{STAGE_FILE}")).read_text())
        assert ev["upstream"][t.name] == rec["pruned"]["digest"]
    # every other file is as it was (stage.json of the pruned stages aside)
    after = {p.relative_to(out).as_posix(): p.read_bytes() for p in out.rglob("*")
             if p.is_file() and not p.name.startswith(".")}
    assert {k: v for k, v in before.items() if not (k.startswith("train-") and k.endswith(STAGE_FILE))} == \
        {k: v for k, v in after.items() if not (k.startswith("train-") and k.endswith(STAGE_FILE))}
    assert prunable(out) == [] and prune_run(out) == {"pruned": [], "bytes": 0}
    # a pruned retriever cannot be searched: said at the door, naming why
    assert main(["evaluate", f"run_dir={trains[0]}", f"data.name={tiny_run.folder}", f"out_dir={tmp_path / 'ev'}"]) == 2
    assert "has no model/model.pt: its weights were dropped (`gdr prune`)" in capsys.readouterr().err

    # a pruned run reports, and a rerun reuses every evaluation without retraining
    report = json.loads((out / "report.json").read_text())
    _run(tiny_run, out, "[0]")
    stages = _records(out)
    assert all(s["reused"] for s in stages.values()), [n for n, s in stages.items() if not s["reused"]]
    again = json.loads((out / "report.json").read_text())
    assert again.pop("command").endswith(report.pop("command").split(f" out={seed0} ")[1])  # copied: another out=
    assert _without_seconds(again) == _without_seconds(report)
    assert all(_weights(t) == [] for t in trains)


def _weights_file(root: Path, p: Path) -> bool:
    rel = p.relative_to(root).parts
    return rel[0].startswith("train-") and matches("/".join(rel[1:]), WEIGHTS)


def test_a_pruned_retriever_needed_again_is_retrained_under_its_key(tiny_run, seed0, tmp_path, caplog):
    out = _copy(seed0, tmp_path)
    prune_run(out)
    train = next(out.glob("train-gc-s0-*"))
    shutil.rmtree(next(out.glob("eval-gc-s0-*")))  # its evaluation is gone: the weights are needed again
    with caplog.at_level(logging.INFO, logger="gdr.pipeline"):
        _run(tiny_run, out, "[0]")
    stages = _records(out)
    ran = {n for n, s in stages.items() if not s["reused"]}
    assert ran == {"train-gc-s0", "eval-gc-s0"}
    assert stages["train-gc-s0"]["folder"] == train.name  # the same key
    lines = [r.getMessage() for r in caplog.records if "was pruned" in r.getMessage()]
    assert len(lines) == 1 and train.name in lines[0]
    rec = json.loads((train / STAGE_FILE).read_text())
    assert "pruned" not in rec and _weights(train)


def test_pack_refuses_an_unpruned_run_and_one_too_large(tiny_run, seed0, tmp_path, capsys):
    out = _copy(seed0, tmp_path)
    capsys.readouterr()
    assert main(["pack", str(out), str(tmp_path / "p")]) == 2
    err = capsys.readouterr().err
    assert "is not pruned: 2 evaluated retrievers" in err and "gdr prune" in err and "--prune" in err
    assert not (tmp_path / "p" / MANIFEST).exists()
    prune_run(out)
    with pytest.raises(ValueError, match=r"does not fit in 2 pieces of 0.01 MiB .* the run's files hold [0-9.]+ MiB"):
        pack_run(out, tmp_path / "p", piece_mib=0.01, max_pieces=2)
    assert list((tmp_path / "p").iterdir()) == []  # no pieces left behind
    # small pieces: many of them, each within its size, and a damaged one is refused by name
    man = pack_run(out, tmp_path / "p", piece_mib=0.25, max_pieces=64)
    assert len(man["pieces"]) > 1 and all(p["bytes"] <= 0.25 * (1 << 20) for p in man["pieces"])
    piece = tmp_path / "p" / man["pieces"][1]["file"]
    data = bytearray(piece.read_bytes())
    data[10] ^= 1
    piece.write_bytes(bytes(data))
    assert main(["unpack", str(tmp_path / "p"), str(tmp_path / "dest")]) == 2
    assert f"{piece.name}: its size or SHA-256 differs" in capsys.readouterr().err
    assert not (tmp_path / "dest").exists()


def test_a_refused_pack_leaves_the_earlier_pack_whole_and_another_runs_pack_is_refused(seed0, tmp_path, capsys):
    out = _copy(seed0, tmp_path)
    prune_run(out)
    man = pack_run(out, tmp_path / "p", piece_mib=0.25, max_pieces=64)
    before = {p.name: p.read_bytes() for p in (tmp_path / "p").iterdir()}
    with pytest.raises(ValueError, match="does not fit in 2 pieces"):
        pack_run(out, tmp_path / "p", piece_mib=0.01, max_pieces=2)
    assert {p.name: p.read_bytes() for p in (tmp_path / "p").iterdir()} == before  # still unpacks
    other = out.parent / "other-run"
    shutil.copytree(out, other)
    with pytest.raises(ValueError, match=f"holds the pack of run {out.name!r}, not of 'other-run'"):
        pack_run(other, tmp_path / "p")
    assert json.loads((tmp_path / "p" / MANIFEST).read_text()) == man
    capsys.readouterr()
    for bad in ("inf", "nan", "0"):
        assert main(["pack", str(out), str(tmp_path / "q"), "--piece-mib", bad]) == 2
        assert f"argument --piece-mib: {bad}: must be a number > 0" in capsys.readouterr().err


def test_every_refusal_of_a_pack_comes_before_prune_drops_anything(seed0, tmp_path, capsys, monkeypatch):
    """`gdr pack --prune` prunes only a run it will pack: an OUTDIR that is a file or holds another run's pack, or a
    symbolic link in the run, is refused (one line each) with every weight still there. A pack stopped midway
    leaves no pieces; a pack too large after pruning names the stages that still hold weights."""
    out = _copy(seed0, tmp_path).rename(tmp_path / "mine")
    weights = {t.folder.name: _weights(t.folder) for t in prunable(out)}
    assert len(weights) == 2
    (tmp_path / "file").write_text("")
    other = _copy(seed0, tmp_path / "o")
    prune_run(other)
    pack_run(other, tmp_path / "theirs", piece_mib=0.25, max_pieces=64)
    (out / "link.jsonl").symlink_to(tmp_path / "file")
    capsys.readouterr()
    for outdir, said in ((tmp_path / "file", "exists and is not a folder"),
                         (tmp_path / "theirs", "holds the pack of run 'run', not of"),
                         (tmp_path / "p", "link.jsonl: a symbolic link in the run folder")):
        assert main(["pack", str(out), str(outdir), "--prune"]) == 2
        lines = capsys.readouterr().err.strip().splitlines()
        assert len(lines) == 1 and said in lines[0], lines
        assert {t.folder.name: _weights(t.folder) for t in prunable(out)} == weights
    (out / "link.jsonl").unlink()

    def stopped(*a, **k):
        raise KeyboardInterrupt
    with monkeypatch.context() as m:
        m.setattr("tarfile.TarFile.add", stopped)
        with pytest.raises(KeyboardInterrupt):
            pack_run(out, tmp_path / "p", prune=True)
    assert list((tmp_path / "p").iterdir()) == []  # no partial pack left
    kept = next(out.glob("train-gc-*"))
    (kept / STAGE_FILE).write_text(json.dumps({**json.loads((kept / STAGE_FILE).read_text()), "status": "running"}))
    (kept / "checkpoints").mkdir(exist_ok=True)
    (kept / "checkpoints" / "last.ckpt").write_bytes(bytes(200_000))  # a training stopped midway
    with pytest.raises(ValueError, match=rf"no finished evaluation stands on hold 0.2 MiB of weights \({kept.name}\)"):
        pack_run(out, tmp_path / "p", piece_mib=0.01, max_pieces=2)


def test_unpacking_into_the_current_folder_keeps_the_folder(seed0, tmp_path, monkeypatch):
    """`gdr unpack PACK .` in an empty folder: the run's entries land in it, and the folder itself (where a shell
    stands) is the same one."""
    out = _copy(seed0, tmp_path)
    pack_run(out, tmp_path / "p", prune=True, piece_mib=0.25, max_pieces=64)
    here = tmp_path / "here"
    here.mkdir()
    inode = here.stat().st_ino
    monkeypatch.chdir(here)
    assert main(["unpack", str(tmp_path / "p"), "."]) == 0
    assert here.stat().st_ino == inode and sorted(p.name for p in here.iterdir()) == sorted(
        p.name for p in out.iterdir() if not p.name.startswith("."))
    assert not list(tmp_path.glob(".here.unpacking-*"))


@pytest.mark.slow
def test_a_run_carried_to_another_folder_trains_only_its_new_seeds(tiny_run, seed0, tmp_path, capsys, monkeypatch):
    """Done when (issue 47): seeds [0], prune, pack (every piece <= 16 MiB), unpack elsewhere, seeds [0, 1]: only
    seed 1 trains, and report.json equals that of one run of [0, 1] but for seconds."""
    lease1 = _copy(seed0, tmp_path / "lease1")
    assert main(["pack", str(lease1), str(tmp_path / "OUT"), "--prune"]) == 0
    assert "(pruned first: 2 retrievers)" in capsys.readouterr().out
    man = json.loads((tmp_path / "OUT" / MANIFEST).read_text())
    assert 1 <= len(man["pieces"]) <= 8 and all(p["bytes"] <= PIECE_MIB << 20 for p in man["pieces"])
    # lease 2: only the pieces and the manifest, at another path
    carried = tmp_path / "lease2" / "in"
    carried.mkdir(parents=True)
    for f in [MANIFEST, *(p["file"] for p in man["pieces"])]:
        shutil.copy(tmp_path / "OUT" / f, carried / f)
    (tmp_path / "lease2" / "work").mkdir()
    assert main(["pack", "--unpack", str(carried), str(tmp_path / "lease2" / "work")]) == 0
    # the same relative out= in both runs, so their commands (in the report) are the same
    monkeypatch.chdir(tmp_path / "lease2")
    _run(tiny_run, Path("work"), "[0,1]")
    stages = _records(tmp_path / "lease2" / "work")
    ran = sorted(n for n, s in stages.items() if not s["reused"])
    assert ran == ["eval-gc-s1", "eval-random-s1", "train-gc-s1", "train-random-s1"]
    one = tmp_path / "one"
    one.mkdir()
    monkeypatch.chdir(one)
    _run(tiny_run, Path("work"), "[0,1]")
    assert not any(s["reused"] for s in _records(one / "work").values())
    carried_report = json.loads((tmp_path / "lease2" / "work" / "report.json").read_text())
    one_report = json.loads((one / "work" / "report.json").read_text())
    lines = (tmp_path / "lease2" / "work" / "retrievers.jsonl").read_text().splitlines()
    assert [(r["indexer"], r["seed"]) for r in map(json.loads, lines)] == \
        [("gc", 0), ("random", 0), ("gc", 1), ("random", 1)]
    assert _without_seconds(carried_report) == _without_seconds(one_report)
