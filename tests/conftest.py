import contextlib
import functools
import gc
import importlib
import io
import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

# Idle OpenMP threads sleep rather than spin. A retriever trains on one torch thread per core (gdr.stages.train:
# training_threads); on a 2-core machine where another test worker or job holds a core, spinning threads wait for
# one that is not running and a training step takes ~30x longer. Only the waiting changes: the thread count, and
# so every sum, stays as the code under test sets it. libgomp reads this once, when torch loads it (the imports
# below); subprocesses inherit it.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import pytest  # noqa: E402 (after OMP_WAIT_POLICY)
import torch  # noqa: E402
from filelock import FileLock  # noqa: E402

# tiny_models.py and score_script.py live next to the tests.
sys.path.insert(0, str(Path(__file__).parent))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
# Tiny models gain nothing from threads, and on a 2-core machine shared with other work, thread
# wake-ups dominate their run time.
torch.set_num_threads(1)


@pytest.fixture
def data_dir() -> Path:
    from gdr.data import data_dir as _d

    return _d()


# A tiny random-init GenerativeLM of each family, built once per test module (a module may change its
# weights: module scope keeps that from leaking into another file's tests).
@pytest.fixture(scope="module")
def llama():
    from tiny_models import tiny_llama

    return tiny_llama()


@pytest.fixture(scope="module")
def t5():
    from tiny_models import tiny_t5

    return tiny_t5()


@dataclass(frozen=True)
class TinyRun:
    """A finished `gdr run`: its saved tiny LM's folder ``root``, its BEIR ``folder``, its run folder ``out``, its
    ``args`` (``gdr run`` first) and the JSON line it printed."""

    root: Path
    folder: Path
    out: Path
    args: list[str]
    printed: str

    def copy(self, dst: Path) -> tuple[Path, list[str]]:
        """The run folder copied to ``dst`` (without its writer's lock file) and ``args`` with ``out=dst``: for a
        test that runs in it again."""
        from gdr.guard import LOCK_FILE

        shutil.copytree(self.out, dst, ignore=shutil.ignore_patterns(LOCK_FILE))
        return dst, [a if not a.startswith("out=") else f"out={dst}" for a in self.args]


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory) -> TinyRun:
    """test_pipeline's tiny LM and 30-document corpus run with ``indexers=[gc,random]``, built once per test session
    (the xdist workers share one build: under their common temporary folder, behind a file lock) for the tests that
    read a finished run; one that runs in it again works on :meth:`TinyRun.copy`."""
    from test_pipeline import _args, toy_collection
    from tiny_models import saved_tiny_llama

    from gdr.cli import main

    base = tmp_path_factory.getbasetemp()
    shared = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "tiny-run"
    shared.mkdir(exist_ok=True)
    root, done = shared / "models", shared / "printed.json"
    args = _args(root, shared / "toy", shared / "run", "indexers=[gc,random]")
    with FileLock(str(shared / "build.lock")):
        if not done.exists():
            saved_tiny_llama(root / "tiny-llama")
            toy_collection(shared / "toy")
            printed = io.StringIO()
            with contextlib.redirect_stdout(printed):
                assert main(args) == 0
            done.write_text(printed.getvalue().strip().splitlines()[-1])
    return TinyRun(root, shared / "toy", shared / "run", args, done.read_text())


def _first_party_names(obj):
    """(module, name) of every loaded first-party module's global bound to ``obj``."""
    # sys.modules holds ~4,000 modules once torch and transformers load: a copy of the dict, not a list of its
    # items, whose 4,000 new tuples set off garbage collections over the whole heap (3 ms a call, 0.4 ms so)
    for mod_name, mod in sys.modules.copy().items():
        if mod is not None and (mod_name == "gdr" or mod_name.startswith("gdr.")):
            yield from ((mod, attr) for attr, bound in vars(mod).copy().items() if bound is obj)


@pytest.fixture
def patch_where_bound(monkeypatch):
    """``patch(target, value)``: set the function ``target`` ("package.module.name") to ``value`` in its module and
    in every loaded first-party module that holds it under a name of its own (``from package.module import name``
    binds the function when the importing module loads), so that a call by any path reaches ``value``. A module
    first loaded during the test binds ``value``: it gets the real function back at the end."""
    swapped = []

    def patch(target: str, value) -> None:
        module, name = target.rsplit(".", 1)
        real = getattr(importlib.import_module(module), name)
        # a stand-in of this target's alone, so that the end of the test puts back `real` where it is bound and not
        # the function of another target patched with the same value
        value = functools.wraps(value)(lambda *args, _value=value, **kwargs: _value(*args, **kwargs))
        for mod, attr in _first_party_names(real):
            monkeypatch.setattr(mod, attr, value)
        monkeypatch.setattr(target, value)
        swapped.append((value, real))

    yield patch
    for value, real in swapped:
        for mod, attr in _first_party_names(value):
            setattr(mod, attr, real)


@pytest.fixture
def nothing_loads(monkeypatch, patch_where_bound):
    """Make loading a model or a corpus fail the test: refusals (bad config, unusable out folder) must come first."""
    def forbidden(*args, **kwargs):
        raise AssertionError("loaded a model or a corpus before checking the config and the out folder")

    monkeypatch.setattr("gdr.lm.GenerativeLM.__init__", forbidden)
    monkeypatch.setattr("transformers.AutoModelForCausalLM.from_pretrained", forbidden)
    monkeypatch.setattr("gdr.training.search.Retriever.load", forbidden)
    patch_where_bound("gdr.data.corpus_from_config", forbidden)
    patch_where_bound("gdr.data.load_corpus", forbidden)


@pytest.fixture
def repeat_kv_calls(monkeypatch):
    """Counts calls of transformers' ``repeat_kv`` (the SDPA integration's and Llama's eager one): each call copies
    a layer's keys or values G times. Returns a one-element list, the count so far."""
    import transformers.integrations.sdpa_attention as sdpa
    import transformers.models.llama.modeling_llama as llama_mod

    calls, orig = [0], sdpa.repeat_kv

    def counting(hidden_states, n_rep):
        calls[0] += 1
        return orig(hidden_states, n_rep)

    monkeypatch.setattr(sdpa, "repeat_kv", counting)
    monkeypatch.setattr(llama_mod, "repeat_kv", counting)
    return calls


# The lanes deal their tests to the workers in order, a few at a time (the slow lane, `--dist load`) or a file at a
# time (the fast lane, `--dist loadfile`): a long test or file dealt last keeps one worker busy while the other has
# nothing left. What is marked with its rough seconds on 2 cores goes first, the longest first: a slow test by
# `slow(seconds=N)`, a fast-lane file by `pytestmark = pytest.mark.cost(seconds=N)` (its tests in all); the rest keep
# their order and fill in behind.
def pytest_collection_modifyitems(config, items):
    def seconds(item) -> float:
        for name in ("slow", "cost"):
            mark = item.get_closest_marker(name)
            if mark is not None and "seconds" in mark.kwargs:
                return mark.kwargs["seconds"]
        return 0

    items.sort(key=lambda item: -seconds(item))  # stable


# Each test file starts with a full collection, then freezes what survives (gc.freeze): the modules torch,
# transformers and Lightning loaded, the session's fixtures and caches, ~millions of objects that live to the end.
# Without it, every collection of the oldest generation walks them all again: ~0.9 s each, a quarter of a worker's
# time over the scoring, indexing, planning and training tests. What a test makes and drops is collected as before;
# only cycles among objects older than the file would outlive it.
_frozen_before: list = [None]


def pytest_runtest_setup(item):
    if item.module is not _frozen_before[0]:
        gc.collect()
        gc.freeze()
        _frozen_before[0] = item.module
