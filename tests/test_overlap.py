"""`gdr run overlap=true`: the host stages (the flat clustering, the indexes, BM25) run in a background thread beside
the device stages and leave every stage key, result file and report figure as a run without overlap does; a host
stage that fails is raised with its name, and what finished is reused by the rerun (gdr/stages/overlap.py)."""
from __future__ import annotations

import json
import signal
import threading
from pathlib import Path

import pytest
from test_faults import _signalled_at
from test_pipeline import TOPICS, _args
from tiny_models import tiny_llama

import gdr.pipeline
from gdr import signals
from gdr.cli import main
from gdr.data import Corpus, QuerySet
from gdr.data.beir import write_beir
from gdr.stages.overlap import HostStages, Priority

pytestmark = pytest.mark.cost(seconds=22)  # the file's tests in all, fast lane, 2 cores: dealt first

INDEXERS = "indexers=[gc,hkmi,bmi,random]"
# the flat clustering too (the toy corpus is labelled), its tf-idf and log P baselines (no embedding model here)
CLUSTER = ("cluster.baselines=[tfidf,logp]", "cluster.repeats=1", "cluster.n_init=1")
# the figures drawn (test_pipeline's runs leave them out): a figure drawn in the background thread is compared too
FIGURES = ("plot=true", "index.plot=true")
# the files that hold seconds, rates, times or the run folder's path (their figures are compared through the stages'
# info); every other file of every stage is compared by its checksum
TIMED = {"metrics.json", "results.md", "trained_on.json", "tree_state.npz"}
VOLATILE = {"seconds", "last_seconds", "attempts", "training", "outside_stages", "overlapped", "command",
            "train_seconds", "eval_seconds"}


@pytest.fixture(scope="module")
def labelled(tmp_path_factory):
    """test_pipeline's tiny LM and a 30-document BEIR folder of five labelled topics."""
    root = tmp_path_factory.mktemp("overlap")
    lm = tiny_llama()
    lm.model.save_pretrained(root / "tiny-llama")
    lm.tokenizer.save_pretrained(root / "tiny-llama")
    ids, texts, labels, qtexts = [], [], [], []
    for i in range(30):
        t = TOPICS[i % 5].split()
        ids.append(f"d{i}")
        texts.append(f"{' '.join(t)} story number {i} about {t[0]} and {t[-1]} item{i}")
        labels.append(t[0])
        qtexts.append(f"{t[0]} item{i}")
    qs = QuerySet(name="toy", qids=[f"q{i}" for i in range(30)], texts=qtexts, relevant=[[d] for d in ids],
                  splits=["test" if i % 3 == 0 else "train" for i in range(30)])
    folder = write_beir(Corpus(name="toy", doc_ids=ids, texts=texts, labels=labels), qs, root / "toy")
    return root, folder


def _without_seconds(x, also: frozenset = frozenset()):
    """A report (or a stage's info) without what differs between two identical runs: seconds, the command line
    (and the keys ``also``)."""
    if isinstance(x, dict):
        return {k: _without_seconds(v, also) for k, v in x.items() if k not in VOLATILE | also}
    if isinstance(x, list):
        return [_without_seconds(v, also) for v in x]
    return x


def _stage_folders(out: Path) -> dict[str, dict]:
    """Every stage folder of a run: its stage.json's key, inputs, info and the checksums of its files (all but the
    logs, configs and manifests that hold times or the run's own path)."""
    found = {}
    for marker in sorted(out.glob("*/stage.json")):
        s = json.loads(marker.read_text())
        assert s["status"] == "complete", marker
        files = {k: v["crc32"] for k, v in s["artifacts"].items() if Path(k).name not in TIMED
                 and not k.endswith((".yaml", "manifest.json")) and not k.startswith(("checkpoints/", "logs/"))}
        found[marker.parent.name] = {"key": s["key"], "inputs": s["inputs"], "info": _without_seconds(s["info"]),
                                     "files": files}
    return json.loads(json.dumps(found).replace(str(out), "<run>"))  # paths in an info name the run folder


@pytest.fixture(scope="module")
def without_overlap(labelled, tmp_path_factory) -> Path:
    """The tiny labelled run with overlap off: the reference."""
    root, folder = labelled
    out = tmp_path_factory.mktemp("reference") / "run"
    assert main(_args(root, folder, out, INDEXERS, *CLUSTER, *FIGURES, "overlap=false")) == 0
    return out


def _same_run(out: Path, ref: Path, resumed: bool = False) -> None:
    """``out`` holds the same stage folders as ``ref`` (keys, inputs, info, file checksums: P, docids, models, runs),
    P and the docids byte for byte, the same retrievers.jsonl, and report.json equal but for seconds (``resumed``:
    and for which stages this invocation reused)."""
    off, on = _stage_folders(ref), _stage_folders(out)
    assert {"score-", "cluster-", "doc-queries-", "index-gc-", "index-hkmi-", "index-bmi-", "index-random-", "bm25-",
            "train-gc-s0-", "eval-bmi-s0-"} <= {name.rsplit("-", 1)[0] + "-" for name in off}
    assert on == off
    for name in off:
        for f in ("P.npy", "docids.tsv"):
            if (ref / name / f).exists():
                assert (ref / name / f).read_bytes() == (out / name / f).read_bytes(), name
    lines = [[json.loads(x) for x in (d / "retrievers.jsonl").read_text().splitlines()] for d in (out, ref)]
    assert _without_seconds(lines[0]) == _without_seconds(lines[1])
    assert (out / "per_query.jsonl").read_text() == (ref / "per_query.jsonl").read_text()
    reports = [json.loads((d / "report.json").read_text()) for d in (out, ref)]
    also = frozenset({"reused"} if resumed else ())
    assert _without_seconds(reports[0], also) == _without_seconds(reports[1], also)


def test_overlap_leaves_every_stage_and_figure_as_without_it(labelled, without_overlap, tmp_path):
    """The same tiny run with overlap forced on (on the CPU, in the production code path) as with it off; its
    report says which stages ran in the background."""
    root, folder = labelled
    out = tmp_path / "run"
    assert main(_args(root, folder, out, INDEXERS, *CLUSTER, *FIGURES, "overlap=true")) == 0
    _same_run(out, without_overlap)
    report = json.loads((out / "report.json").read_text())
    assert json.loads((without_overlap / "report.json").read_text())["overlapped"] is None
    assert set(report["overlapped"]["stages"]) == {"cluster", "index-gc", "index-hkmi", "index-bmi", "index-random",
                                                   "bm25"}
    assert "In the background, beside the device stages" in (out / "report.md").read_text()


@pytest.mark.slow  # a subprocess stopped by a signal and a rerun, as test_faults' signal tests
def test_a_sigterm_beside_host_stages_stops_with_one_line_and_resumes_to_the_same_run(labelled, without_overlap,
                                                                                       tmp_path):
    """SIGTERM once the generated queries are made, while host stages run or have run in the background: the
    one stop line and 143, as without overlap; the rerun finishes the same run as one without a stop."""
    root, folder = labelled
    out = tmp_path / "run"
    args = _args(root, folder, out, INDEXERS, *CLUSTER, *FIGURES, "overlap=true")
    rc, err = _signalled_at("stage:doc-queries", signal.SIGTERM, args[1:], tmp_path)
    assert rc == 128 + signal.SIGTERM, err[-2000:]
    assert err.strip().splitlines()[-1].startswith("gdr run: stopped by SIGTERM"), err[-2000:]
    assert "Traceback" not in err
    assert main(args) == 0
    _same_run(out, without_overlap, resumed=True)


def test_a_failing_host_stage_is_raised_with_its_name_and_the_rerun_reuses_what_finished(labelled, tmp_path,
                                                                                         monkeypatch, capsys):
    """HKmI's index fails in the background: `gdr run` stops with one line naming the stage; the stages that
    finished (the LM stages, the other indexes, the clustering) are reused by the rerun, which runs the rest."""
    root, folder = labelled
    out = tmp_path / "run"
    real = gdr.pipeline.build_index
    failing = True

    def build(settings, folder, **kw):
        if failing and settings.method == "hkmi":
            raise ValueError("no good clusters for this test")
        return real(settings, folder, **kw)

    monkeypatch.setattr("gdr.pipeline.build_index", build)
    args = _args(root, folder, out, INDEXERS, *CLUSTER, *FIGURES, "overlap=true")
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "stage index-hkmi (run in the background): no good clusters for this test" in err
    hkmi = [json.loads(p.read_text()) for p in out.glob("index-hkmi-*/stage.json")]
    assert [s["status"] for s in hkmi] == ["running"]
    assert not list(out.glob("train-*"))  # nothing trained on a missing index
    finished = {p.parent.name for p in out.glob("*/stage.json") if json.loads(p.read_text())["status"] == "complete"}
    assert {n.rsplit("-", 1)[0] for n in finished} >= {"score", "index-gc"}  # the others: as far as they got

    failing = False
    assert main(args) == 0
    stages = {s["folder"]: s for s in json.loads((out / "report.json").read_text())["stages"]}
    assert all(stages[n]["reused"] for n in finished)
    assert not next(s for n, s in stages.items() if n.startswith("index-hkmi-"))["reused"]


def test_host_stages_run_in_their_order_and_are_taken_in_the_records_at_their_place():
    """The worker takes what the next device stage waits on first (the indexes before the clustering before BM25),
    and each record goes where its stage was started, whatever order they finish in."""
    records: list = ["score"]
    ran, gate = [], threading.Event()
    host = HostStages(records, enabled=True)

    def job(name):
        def run():
            gate.wait()
            ran.append(name)
            return name
        return run

    with host.running():
        host.start("hold", job("hold"), Priority.INDEX)  # the worker takes it at once and waits at the gate
        host.start("bm25", job("bm25"), Priority.BM25)
        host.start("cluster", job("cluster"), Priority.CLUSTER)
        host.start("index-gc", job("index-gc"), Priority.INDEX)
        records.append("doc-queries")
        gate.set()
        assert host.take("index-gc") == "index-gc"
        host.take_all()
    assert ran[1:] == ["index-gc", "cluster", "bm25"]
    assert records == ["score", "hold", "bm25", "cluster", "index-gc", "doc-queries"]
    assert set(host.accounts()["stages"]) == {"hold", "bm25", "cluster", "index-gc"}


def test_host_stages_run_at_once_without_overlap_and_raise_as_they_are():
    """overlap off: each host stage runs where it is started, in this thread, and its error is raised there as
    it is (no background to name); nothing is accounted as overlapped."""
    records: list = []
    host = HostStages(records, enabled=False)
    threads = []
    with host.running():
        host.start("index-gc", lambda: threads.append(threading.current_thread()) or "rec", Priority.INDEX)
        assert records == ["rec"] and threads == [threading.main_thread()]
    assert host.accounts() is None

    def fail():
        raise ValueError("plain")

    with pytest.raises(ValueError, match="^plain$"), HostStages([], enabled=False).running() as h:
        h.start("bm25", fail, Priority.BM25)


def test_a_stop_does_not_wait_for_the_host_stage_and_an_error_waits_and_drops_the_queued():
    """A signal (Stopped) in the main thread leaves the running host stage to the process's end, as a kill would
    (its stage resumes on the rerun); another error waits for it, so no thread writes into the run folder after
    the run returned, and drops the stages queued behind it."""
    def job(name, gate, ran, began=None):
        def run():
            if began is not None:
                began.set()
            gate.wait(timeout=60)
            ran.append(name)
            return name
        return run

    gate, ran, records = threading.Event(), [], []
    with pytest.raises(signals.Stopped), HostStages(records, enabled=True).running() as host:
        host.start("cluster", job("cluster", gate, ran), Priority.CLUSTER)
        raise signals.Stopped(15)
    assert ran == [] and records == []  # not waited for; its placeholder gone
    gate.set()

    gate, ran, records = threading.Event(), [], []
    with pytest.raises(RuntimeError, match="device stage failed"), \
            HostStages(records, enabled=True).running() as host:
        began = threading.Event()
        host.start("index-gc", job("index-gc", gate, ran, began), Priority.INDEX)
        host.start("bm25", job("bm25", gate, ran), Priority.BM25)
        began.wait(timeout=60)  # index-gc runs, bm25 waits behind it
        threading.Timer(0.2, gate.set).start()
        raise RuntimeError("device stage failed")
    assert ran == ["index-gc"] and records == ["index-gc"]  # waited for, kept; bm25 never started
