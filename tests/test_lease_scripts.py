"""The two-lease recipe of examples/lease/README.md rehearsed on the CPU through the real scripts (bash subprocesses),
at test size: the scripts' paths point at a temporary folder per lease (GDR_LEASE_RUNS), their boot file at a
stand-in that sets the environment the kit's boot.sh sets (GDR_LEASE_BOOT), their python at this one
(GDR_LEASE_PY), and `+experiment=bbc` is scaled down by overrides alone (test_bbc_rehearsal's, at two schemes).

Lease 1: bbc.sh starts the run of seed 0 and returns at once (WAIT 0), from a call whose process stays and reaps
nothing, as the device's may (the run then ends a zombie); the next bbc.sh call waits on it to its end; one more
starts seed 1, and pack.sh at once stops that run, prunes and packs, its pieces over two calls. Lease 2, in a fresh
folder: unpack.sh with the pieces, seeds [0, 1]. Every call's $OUT must fit what a device call brings back (8
files, 16 MiB each, 64 MiB in all)."""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from test_bbc_rehearsal import SCALED
from tiny_models import saved_tiny_llama

from gdr.data import data_dir

ROOT = Path(__file__).resolve().parents[1]
LEASE = ROOT / "examples" / "lease"
MIB = 1 << 20
# test_bbc_rehearsal's scaled-down run at two schemes; seeds are given per call (the recipe's)
TINY = [a for a in SCALED if not a.startswith(("indexers=", "seeds="))] + ["indexers=[gc,random]"]
PIECE_MIB = 0.2  # the test run packs to ~0.8 MiB: 4 or 5 pieces, over two calls
CALL_S = 400  # the most one scripted call may take here (its WAIT is 300 s) before the test stops it


def _env(machine: Path, out: Path) -> dict[str, str]:
    """The environment of a call on the lease whose machine's /tmp is ``machine``: its runs folder, its cache, a
    stand-in for the kit's boot.sh (what it exports, the kit in place), and $OUT."""
    boot = machine / "boot.sh"
    if not boot.exists():
        machine.mkdir(parents=True, exist_ok=True)
        path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
        boot.write_text(f"export PYTHONPATH={path} GDR_CACHE={machine / 'gdr-cache'} GDR_DATA_DIR={data_dir()} "
                        "HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1\n")
    out.mkdir(parents=True)
    return {**os.environ, "GDR_LEASE_BOOT": str(boot), "GDR_LEASE_RUNS": str(machine / "gdr-runs"),
            "GDR_LEASE_PY": sys.executable, "OUT": str(out)}


def _brought_back(out: Path) -> dict[str, Path]:
    """``out``'s files, after checking they fit what one device call brings back."""
    files = {p.name: p for p in out.iterdir()}
    assert all(p.is_file() and not p.is_symlink() for p in files.values()), sorted(files)
    assert len(files) <= 8, sorted(files)
    sizes = {name: p.stat().st_size for name, p in files.items()}
    assert max(sizes.values()) <= 16 * MIB and sum(sizes.values()) <= 64 * MIB, sizes
    return files


def _call(script: str, *args: str, env: dict[str, str], printed: list[str] | None = None) -> dict[str, Path]:
    """``bash examples/lease/SCRIPT ARGS`` as a device call runs it; its $OUT's files (what it printed appended to
    ``printed``)."""
    done = subprocess.run(["bash", str(LEASE / script), *args], env=env, capture_output=True, text=True,
                          timeout=CALL_S)
    assert done.returncode == 0, f"{script}: rc {done.returncode}\n{done.stdout}\n{done.stderr}"
    if printed is not None:
        printed.append(done.stdout)
    return _brought_back(Path(env["OUT"]))


def _evaluated(run: Path) -> set[str]:
    """The per_query.json of every finished evaluation (and BM25) of ``run``, relative to it."""
    return {f"{m.parent.name}/per_query.json" for pattern in ("eval-*/stage.json", "bm25-*/stage.json")
            for m in run.glob(pattern) if json.loads(m.read_text())["status"] == "complete"}


def _archived(tgz: Path) -> set[str]:
    with tarfile.open(tgz) as tar:
        return set(tar.getnames())


def _state(pid: int) -> str | None:
    """Process ``pid``'s state letter (R, S, Z ...), or None when there is none."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1][0]
    except FileNotFoundError:
        return None


PR_SET_CHILD_SUBREAPER = 36


def _first_call_that_reaps_nothing(args: list[str], env: dict[str, str]) -> subprocess.Popen:
    """``bash bbc.sh ARGS`` from a process that adopts the run the call leaves behind and never reaps it (a
    subreaper that sleeps), as a device machine's process tree may: the run ends a zombie, which `kill -0` still
    finds. It prints ``call done RC`` when bbc.sh returned."""
    code = ("import ctypes, subprocess, sys, time\n"
            f"ctypes.CDLL(None, use_errno=True).prctl({PR_SET_CHILD_SUBREAPER}, 1, 0, 0, 0)\n"
            "rc = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL).returncode\n"
            "print('call done', rc, flush=True)\n"
            "time.sleep(3600)\n")
    return subprocess.Popen([sys.executable, "-c", code, "bash", str(LEASE / "bbc.sh"), *args], env=env,
                            stdout=subprocess.PIPE, text=True)


@pytest.fixture(scope="module")
def lm_path(tmp_path_factory):
    return saved_tiny_llama(tmp_path_factory.mktemp("lease-lm") / "tiny-llama")


@pytest.mark.slow(seconds=55)  # two leases of +experiment=bbc at test size through bash
def test_two_leases_through_the_scripts_carry_the_run_and_train_only_the_new_seed(lm_path, tmp_path):
    tiny = [f"model.name={lm_path}", *TINY]
    lease1, lease2 = tmp_path / "lease1", tmp_path / "lease2"  # each machine's /tmp
    runs1 = lease1 / "gdr-runs"
    run1, run2 = runs1 / "bbc", lease2 / "gdr-runs" / "bbc"

    # lease 1, call 1: plan, start, back at once; the call's process stays and reaps nothing
    first = _first_call_that_reaps_nothing(["0", "seeds=[0]", *tiny], _env(lease1, tmp_path / "out1"))
    try:
        assert first.stdout.readline().split() == ["call", "done", "0"]
        out = _brought_back(tmp_path / "out1")
        status = out["status.txt"].read_text()
        assert "gdr plan on 1 x cpu" in status and '"plan_file"' in status  # bbc.sh's `gdr plan` line

        # call 2: waits on the run (no child of this call) to its end, and copies it
        out = _call("bbc.sh", "300", "seeds=[0]", *tiny, env=_env(lease1, tmp_path / "out2"))
        assert _state(int((runs1 / "pid").read_text())) == "Z"  # the run ended, and nothing reaped it
    finally:  # the run's session stopped if a failure left it running, then the call that holds it as a zombie
        with contextlib.suppress(OSError, ValueError):
            os.killpg(int((runs1 / "pid").read_text()), signal.SIGKILL)
        first.kill()
        first.wait()
    status = out["status.txt"].read_text().splitlines()
    assert status[0].startswith("gdr run: ended") and status[1] == "retrievers evaluated: 2", status[:2]
    assert set(out) >= {"report.md", "report.json", "retrievers.jsonl", "stages.json", "run.log", "status.txt",
                        "per-query.tgz"}
    assert {r["status"] for r in json.loads(out["stages.json"].read_text())} == {"complete"}
    evaluated = _evaluated(run1)
    assert len(evaluated) == 3 and evaluated <= _archived(out["per-query.tgz"])  # gc, random, BM25

    # seed 1 started, and the lease's last calls at once: pack.sh stops that run, prunes and packs, the pieces small
    # enough that they come back in two calls
    _call("bbc.sh", "0", "seeds=[0,1]", *tiny, env=_env(lease1, tmp_path / "out3"))
    pid = int((runs1 / "pid").read_text())
    env = {**_env(lease1, tmp_path / "out4"), "GDR_LEASE_PIECE_MIB": str(PIECE_MIB)}
    printed: list[str] = []
    out = _call("pack.sh", env=env, printed=printed)
    assert f"pack.sh: stopped gdr run (pid {pid})" in printed[0]
    assert _state(pid) in (None, "Z")  # ended (reaped, or not yet)
    assert set(out) == {"gdr-pack.json", "gdr-pack.00", "gdr-pack.01", "gdr-pack.02", "report.json", "per-query.tgz",
                        "run.log", "status.txt"}
    assert evaluated <= _archived(out["per-query.tgz"])
    assert not any(run1.glob("train-*/model/*.pt")) and not any(run1.glob("qg-*/model/*.safetensors"))
    n = len(json.loads(out["gdr-pack.json"].read_text())["pieces"])
    assert 3 < n <= 6 and "left: bash examples/lease/pack.sh 3 " in out["status.txt"].read_text()
    carried = tmp_path / "repo" / ".lease-pack"  # here: each call's pieces copied into the checkout, a folder a call
    calls = [out, _call("pack.sh", "3", env={**env, "OUT": str(tmp_path / "out5")})]
    assert set(calls[1]) == {f"gdr-pack.{i:02d}" for i in range(3, n)} | {"status.txt"}
    assert "left" not in calls[1]["status.txt"].read_text()
    for k, files in enumerate(calls, 1):
        (carried / str(k)).mkdir(parents=True)
        for p in files.values():
            if p.name.startswith("gdr-pack."):
                shutil.copy(p, carried / str(k))

    # lease 2, a bare machine: unpack, then seeds [0, 1]
    stash = lease2 / "gdr-pack"  # a call a folder carried in: cp .lease-pack/K/* /tmp/gdr-pack/
    stash.mkdir(parents=True)
    for k in (1, 2):
        for p in (carried / str(k)).iterdir():
            shutil.copy(p, stash)
    out = _call("unpack.sh", str(stash), "300", "seeds=[0,1]", *tiny, env=_env(lease2, tmp_path / "out6"))
    status = out["status.txt"].read_text()
    assert status.startswith("gdr run: ended")
    left = json.loads(status.strip().splitlines()[-1])["remaining"]  # planned after the unpack: what is left
    assert left["retrievers"] == 4 and left["retrievers_left"] == 4 - left["finished"].get("eval-gc-s0", 0) \
        - left["finished"].get("eval-random-s0", 0) and left["finished"]["score"] >= 1
    report = json.loads(out["report.json"].read_text())
    made = {s["name"] for s in report["stages"] if not s["reused"]}  # seed 1's indexes may have been built in lease 1
    assert {f"{k}-{m}-s1" for k in ("train", "eval") for m in ("gc", "random")} <= made
    assert made <= {f"{k}-{m}-s1" for k in ("index", "train", "eval") for m in ("gc", "random")}
    assert report["training"]["retrievers"] == 2 and report["partial"] is None
    assert {(c["n_seeds_a"], c["n_seeds_b"]) for c in report["comparisons"] if c["b"] != "bm25"} == {(2, 2)}
    lines = [json.loads(x) for x in out["retrievers.jsonl"].read_text().splitlines()]
    assert [(x["indexer"], x["seed"]) for x in lines] == [("gc", 0), ("random", 0), ("gc", 1), ("random", 1)]
    assert "pruned: its evaluation stands without its weights" in out["run.log"].read_text()
    evaluated = _evaluated(run2)
    assert len(evaluated) == 5 and evaluated <= _archived(out["per-query.tgz"])
