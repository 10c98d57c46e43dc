"""gdr as a user installs it: a wheel (built from the source tree, and from the sdist), installed with ``--no-deps``
and no index into a fresh virtual environment that sees this environment's packages through a ``.pth`` file but
not the checkout, and run from a folder outside the checkout: ``gdr --help``, ``gdr plan``, a tiny ``gdr run``."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest
from tiny_models import saved_tiny_llama

from gdr.config import conf_dir
from gdr.data import Corpus, QuerySet, write_beir
from gdr.paths import KERNELS, SHIPPED, checkout, shipped_dir

pytestmark = pytest.mark.cost(seconds=24)  # the file's tests in all, fast lane, 2 cores: dealt first

ROOT = Path(__file__).resolve().parents[1]
_NOT_SOURCE = shutil.ignore_patterns("__pycache__", "*.egg-info", "*.npy")


def _not_source(folder: str, names: list[str]) -> set[str]:
    """What the copy of the source tree leaves out: at the top the hidden folders (.git, .venv, caches) and the
    outputs of builds and runs; everywhere bytecode and build metadata."""
    top = Path(folder) == ROOT
    return _NOT_SOURCE(folder, names) | {n for n in names if top and (n.startswith(".") or n in (
        "build", "dist", "runs", "outputs", "lightning_logs"))}


def _run(argv: list[str], **kw) -> subprocess.CompletedProcess:
    p = subprocess.run(argv, capture_output=True, text=True, timeout=300, **kw)
    assert p.returncode == 0, f"{' '.join(map(str, argv))}: exit {p.returncode}\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
    return p


def _build(src: Path, out: Path) -> dict[str, Path]:
    """The wheel pip builds from the source tree ``src`` (what ``pip install git+<repo>`` does) and the one it
    builds from the sdist of that tree (what ``python -m build`` does), offline: name -> wheel."""
    pip_wheel = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-q"]
    _run([*pip_wheel, "-w", str(out / "tree"), str(src)])
    _run([sys.executable, "-c", f"from setuptools import build_meta; build_meta.build_sdist({str(out / 'sdist')!r})"],
         cwd=src)
    (sdist,) = (out / "sdist").glob("gdr-*.tar.gz")
    _run([*pip_wheel, "-w", str(out / "from-sdist"), str(sdist)])
    return {k: next((out / k).glob("gdr-*.whl")) for k in ("tree", "from-sdist")}


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """(the wheels, the fresh environment's bin folder, the environment to run it in, a folder outside the checkout)."""
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    shutil.copytree(ROOT, src, ignore=_not_source)  # builds write build/ and *.egg-info beside the sources
    wheels = _build(src, tmp / "dist")
    venv = tmp / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)])
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "GDR_CONF_DIR", "GDR_GPU_RUNS", "GDR_DATA_DIR", "VIRTUAL_ENV")}
    env.update(GDR_CACHE=str(tmp / "cache"), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    # Installed before the environment sees ours: pip would take our editable gdr for this one, and a reinstall
    # would remove it from there
    _run([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install", "-q", "--no-deps",
          "--no-index", str(wheels["tree"])], env=env)
    site = Path(_run([str(venv / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                     cwd=tmp, env=env).stdout.strip())
    # This environment's packages (torch, transformers, ...), as a plain path: its own .pth files, the editable
    # install of the checkout among them, are not read from there
    ours = dict.fromkeys([sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]])
    (site / "project-deps.pth").write_text("\n".join(ours) + "\n")
    work = tmp / "work"
    work.mkdir()
    return wheels, venv / "bin", env, work


def _names(wheel: Path) -> set[str]:
    with zipfile.ZipFile(wheel) as z:
        return set(z.namelist())


def test_the_wheel_carries_the_configs_and_gpu_figures_under_one_namespace_each(installed):
    wheels, _, _, _ = installed
    names = _names(wheels["tree"])
    assert names == _names(wheels["from-sdist"])  # the sdist holds everything the wheel is built from
    conf = {n.removeprefix("gdr/_shipped/conf/") for n in names if n.startswith("gdr/_shipped/conf/")}
    assert conf == {p.relative_to(ROOT / "conf").as_posix() for p in (ROOT / "conf").rglob("*.yaml")}
    assert "experiment/demo.yaml" in conf and "stage/train.yaml" in conf
    runs = {n.removeprefix("gdr/_shipped/gpu-runs/") for n in names if n.startswith("gdr/_shipped/gpu-runs/")}
    assert runs == {p.name for p in (ROOT / "reports" / "gpu-runs").glob("*.json")} and runs
    assert "gdr/_shipped/plan-constants/plan-constants.json" in names  # the plan's measured constants, as data
    assert "gdr/device_peaks.json" in names
    top = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert top == {"gdr"}  # one namespace: no indexing/, conf/, reports/ or tests/ of their own in site-packages
    # every module of the checkout, the kernels' folders as gdr.<name> (pyproject.toml lists the packages by hand)
    sources = {p.relative_to(ROOT).as_posix() for d in ("gdr", *KERNELS) for p in (ROOT / d).rglob("*.py")}
    assert {n for n in names if n.endswith(".py")} == {s if s.startswith("gdr/") else f"gdr/{s}" for s in sources}


def test_installed_gdr_reads_its_own_copies_and_keeps_data_in_the_user_cache(installed):
    _, bin_, env, work = installed
    code = ("import json, gdr, gdr.indexing, gdr.training, gdr.eval, gdr.config, gdr.paths, gdr.data, gdr.io; "
            "print(json.dumps({'modules': [m.__file__ for m in (gdr, gdr.indexing, gdr.training, gdr.eval)], "
            "'conf': str(gdr.config.conf_dir()), 'gpu_runs': str(gdr.paths.shipped_dir('gpu-runs')), "
            "'data': str(gdr.data.data_dir()), 'commit': gdr.io._git_commit()}))")
    got = json.loads(_run([str(bin_ / "python"), "-c", code], cwd=work, env=env).stdout.strip().splitlines()[-1])
    site = bin_.parent / "lib"
    assert all(Path(f).is_relative_to(site) for f in got["modules"]), got["modules"]
    assert [Path(f).parent.relative_to(Path(got["modules"][0]).parent).as_posix() for f in got["modules"][1:]] == list(
        KERNELS)  # inside the installed gdr package
    assert Path(got["conf"]) == Path(got["modules"][0]).parent / "_shipped" / "conf"
    assert Path(got["gpu_runs"]) == Path(got["modules"][0]).parent / "_shipped" / "gpu-runs"
    assert got["data"] == str(Path(env["GDR_CACHE"]) / "data") and got["commit"] is None


def test_installed_help_and_plan_run_outside_the_checkout(installed):
    _, bin_, env, work = installed
    assert "gdr <command>" in _run([str(bin_ / "gdr"), "--help"], cwd=work, env=env).stdout
    helped = _run([str(bin_ / "gdr"), "run", "--help"], cwd=work, env=env).stdout
    assert "experiment" in helped and "indexers" in helped  # the settings and groups read from the shipped conf/
    out = _run([str(bin_ / "gdr"), "plan", "+experiment=demo", "device=h200"], cwd=work, env=env).stdout
    plan = json.loads(out.strip().splitlines()[-1])
    assert plan["device"] == "h200" and plan["seconds"] > 0
    basis = " ".join(s["basis"] for s in plan["stages"].values())
    assert "2026-11-27-h200-after-e8e1a8e-scoring.json" in basis  # a shipped GPU figure
    assert "-factors.json" in basis  # and a shipped per-stage factor


def test_installed_tiny_run_outside_the_checkout(installed):
    _, bin_, env, work = installed
    saved_tiny_llama(work / "tiny-llama")
    ids = [f"d{i}" for i in range(20)]
    texts = [f"story {i} about topic{i % 4} and item{i}" for i in range(20)]
    qs = QuerySet(name="toy", qids=[f"q{i}" for i in range(20)], texts=[f"topic{i % 4} item{i}" for i in range(20)],
                  relevant=[[d] for d in ids], splits=["test" if i % 3 == 0 else "train" for i in range(20)])
    write_beir(Corpus(name="toy", doc_ids=ids, texts=texts), qs, work / "toy")
    argv = [str(bin_ / "gdr"), "run", "data.name=./toy", "model.name=./tiny-llama", "model.max_doc_tokens=24",
            "indexers=[gc,random]", "seeds=[0]", "sample.n_queries=8", "sample.batch_size=8", "sample.max_new_tokens=4",
            "doc_queries.per_doc=0", "index.n_clusters=4", "index.leaf_size=4", "index.gc.n_init=1",
            "index.gc.n_init_inner=1", "train.model.size=tiny", "train.trainer.max_steps=2",
            "train.trainer.batch_size=8", "train.trainer.enable_progress_bar=false", "train.trainer.tensorboard=false",
            "train.trainer.val_beam=2", "train.trainer.num_sanity_val_steps=0", "train.optim.warmup_steps=1",
            "evaluate.k=4", "evaluate.beam=4", "plot=false", "progress=false", "threads=1", "out=runs/tiny"]
    # Relative names: the data, the model and the out folder are the working directory's, not the checkout's
    last = json.loads(_run(argv, cwd=work, env=env).stdout.strip().splitlines()[-1])
    report = json.loads((work / "runs" / "tiny" / "report.json").read_text())
    assert set(report["retrieval"]) >= {"gc", "random"} and 0.0 <= last["recall_at_1"] <= 100.0
    assert {s["name"] for s in report["stages"]} >= {"score", "index-gc", "index-random", "train-gc-s0", "eval-gc-s0"}


def test_in_the_checkout_the_repository_folders_are_read_and_settings_override_them(tmp_path, monkeypatch):
    for name in SHIPPED:
        monkeypatch.delenv({"conf": "GDR_CONF_DIR", "gpu-runs": "GDR_GPU_RUNS",
                            "plan-constants": "GDR_PLAN_CONSTANTS"}[name], raising=False)
    assert checkout() == ROOT
    assert shipped_dir("conf") == ROOT / "conf" and shipped_dir("gpu-runs") == ROOT / "reports" / "gpu-runs"
    assert (shipped_dir("plan-constants") / "plan-constants.json").is_file()
    monkeypatch.setenv("GDR_GPU_RUNS", str(tmp_path))
    monkeypatch.setenv("GDR_CONF_DIR", str(tmp_path / "conf"))
    assert shipped_dir("gpu-runs") == tmp_path and conf_dir() == tmp_path / "conf"
