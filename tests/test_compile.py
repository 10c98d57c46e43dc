"""The compiled decode path on the CPU: the compile switch (sample.compile), row buckets that bound the number
of compilations over a run with varied batch sizes, and the compile cache under GDR_CACHE."""
import os

import pytest
import torch

from gdr.io import read_jsonl
from gdr.lm.compiling import (AUTO_COMPILE_MIN_QUERIES, allow_bucket_recompiles, batch_bucket, compile_cache_dir,
                              want_compile)
from gdr.store import sample_per_doc_run, sample_run
from tiny_models import DOCS, tiny_llama

DOC_IDS = [f"d{i}" for i in range(len(DOCS))]
KW = dict(max_new_tokens=5, top_k=50, top_p=0.99, progress=False)


def test_compile_switch():
    assert not want_compile("auto", "cpu", 10**6)  # the CPU runs eagerly unless asked
    assert want_compile("auto", "cuda", AUTO_COMPILE_MIN_QUERIES)
    assert not want_compile("auto", "cuda", AUTO_COMPILE_MIN_QUERIES - 1)  # small work: eager
    assert want_compile(None, "cuda", 100, min_queries=100) and not want_compile("auto", "cuda", 99, 100)
    assert want_compile(True, "cpu", 1) and want_compile("true", "cpu", 1)
    assert not want_compile(False, "cuda", 10**6) and not want_compile("false", "cuda", 10**6)
    with pytest.raises(ValueError, match="compile='yes'"):
        want_compile("yes", "cpu", 1)


def test_batch_buckets():
    assert [batch_bucket(n, 64) for n in (1, 5, 8, 9, 33, 63, 64, 70)] == [8, 8, 8, 16, 64, 64, 64, 70]
    assert batch_bucket(1023, 1024) == 1024 and batch_bucket(600, 1000) == 1000 and batch_bucket(3, None) == 8
    assert batch_bucket(5, 4) == 5  # past the cap: not padded


def test_compiled_sampling_compiles_once_per_bucket_and_keeps_the_queries(tmp_path):
    """The CUDA configuration (sample.compile=true: row buckets, bucketed cache lengths, a compiled step),
    traced by dynamo on the CPU with the eager backend. Runs of 21, 5, 13 and 30 queries at batch size 16
    and per-document runs (15 and 9 rows a batch) decode batches of 16, 15, 14, 13, 9, 5 rows: every one
    reuses one of the two buckets (8, 16), one compiled graph each. The old decoder compiled one graph per
    distinct batch shape (rows x cache length)."""
    import torch._dynamo

    lm = tiny_llama()
    dec = lm.decoder()
    dec.compile_options = dict(backend="eager")
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    compiled = {}
    for n in (21, 5, 13, 30):
        compiled[n] = sample_run(lm, DOCS, DOC_IDS, tmp_path / f"c{n}", n_queries=n, seed=n, batch_size=16,
                                 compile=True, **KW)
        assert dec.compile and dec._step_ok  # really compiled (no silent eager fallback)
    per_doc = read_jsonl(sample_per_doc_run(lm, DOCS, DOC_IDS, tmp_path / "pd", n_per_doc=3, seed=1, batch_size=16,
                                            compile=True, **KW))
    counters = torch._dynamo.utils.counters
    graphs = counters["stats"]["unique_graphs"]
    assert 1 <= graphs <= 2, dict(counters["stats"])
    assert {k[1] for k in dec._pool} <= {8, 16}
    # the same queries as the eager decoder (compile=false)
    eager_lm = tiny_llama()
    for n, rows in compiled.items():
        assert sample_run(eager_lm, DOCS, DOC_IDS, tmp_path / f"e{n}", n_queries=n, seed=n, batch_size=16,
                          compile=False, **KW) == rows
    assert not eager_lm.decoder().compile
    assert read_jsonl(sample_per_doc_run(eager_lm, DOCS, DOC_IDS, tmp_path / "pde", n_per_doc=3, seed=1,
                                         batch_size=16, compile=False, **KW)) == per_doc


def test_auto_compiles_nothing_on_the_cpu(tmp_path):
    import torch._dynamo

    lm = tiny_llama()
    torch._dynamo.utils.counters.clear()
    sample_run(lm, DOCS, DOC_IDS, tmp_path, n_queries=6, seed=0, batch_size=4, **KW)  # compile: auto
    assert not lm.decoder().compile and lm.decoder()._step_fn is None
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == 0


def test_compile_cache_lives_under_gdr_cache(tmp_path, monkeypatch):
    from torch._inductor.runtime.cache_dir_utils import cache_dir, default_cache_dir

    monkeypatch.setenv("GDR_CACHE", str(tmp_path / "gdr"))
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", default_cache_dir())  # what inductor writes once it looked
    assert compile_cache_dir() == tmp_path / "gdr" / "torch-compile"
    assert cache_dir() == str(tmp_path / "gdr" / "torch-compile") and (tmp_path / "gdr" / "torch-compile").is_dir()
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "mine"))  # a user's choice is kept
    assert compile_cache_dir() == tmp_path / "mine"
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR")
    assert compile_cache_dir() == tmp_path / "gdr" / "torch-compile"
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "gdr" / "torch-compile")


def test_recompile_limit_fits_the_buckets():
    import torch._dynamo.config as dc

    with dc.patch(recompile_limit=8):  # (monkeypatch would delete the option on undo: it is an alias)
        allow_bucket_recompiles()
        assert dc.recompile_limit >= 8 + 1 + 8  # pow2 buckets 8..1024 and a full batch, for two cache lengths
    assert hasattr(dc, "recompile_limit")
