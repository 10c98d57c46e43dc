"""The compiled decode path on the CPU: the compile switch (sample.compile), row buckets that bound the number
of compilations over a run with varied batch sizes, and the compile cache under GDR_CACHE."""
import json
import logging
import os

import pytest
import torch
from tiny_models import DOCS, tiny_llama

from gdr.io import read_jsonl, read_manifest
from gdr.lm.compiling import (
    AUTO_COMPILE_MIN_QUERIES,
    allow_bucket_recompiles,
    batch_bucket,
    compile_cache_dir,
    want_compile,
)
from gdr.stages.doc_queries import sample_per_doc_run
from gdr.stages.sample import sample_run

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
    reuses one of the two buckets (8, 16), one compiled graph each, rather than one graph per distinct batch shape
    (rows x cache length)."""
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


def _blank_first_draws(lm, monkeypatch, n: int = 3):
    """Make the first n queries of every first draw (attempt 0) come back empty, so that sample_queries re-draws
    them through the real path: the decode of a few rows at attempt 1."""
    import numpy as np

    real = lm.decode_ended

    def decode_ended(docs, rows, qid, attempt, **kw):
        out, ended = real(docs, rows, qid, attempt, **kw)
        return ([""] * n + out[n:] if np.all(np.asarray(attempt) == 0) else out), ended

    monkeypatch.setattr(lm, "decode_ended", decode_ended)


def _counting(lm, backend="eager"):
    import torch._dynamo

    dec = lm.decoder()
    dec.compile_options = dict(backend=backend)
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    return dec


def test_a_redraw_at_batch_64_compiles_no_new_graph(tmp_path, monkeypatch):
    """64 queries at batch 64 decode in one compiled shape (64 rows); the re-draw of 3 empty ones falls in the
    8-row bucket, which has no graph: it decodes eagerly instead of compiling one (on a cold GPU a new bucket
    cost 20-60 s inside the timed loop). Its queries are the eager decoder's."""
    import torch._dynamo

    lm = tiny_llama()
    dec = _counting(lm)
    _blank_first_draws(lm, monkeypatch)
    rows = sample_run(lm, DOCS, DOC_IDS, tmp_path / "c", n_queries=64, seed=3, batch_size=64, compile=True, **KW)
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == 1, dict(torch._dynamo.utils.counters["stats"])
    rec = dec.compile_record()
    assert rec["compiled"] and [g[0] for g in rec["graphs"]] == [64] and rec["eager_redraws"] >= 1
    assert rec["eager_fallback"] == []
    eager_lm = tiny_llama()
    _blank_first_draws(eager_lm, monkeypatch)
    assert sample_run(eager_lm, DOCS, DOC_IDS, tmp_path / "e", n_queries=64, seed=3, batch_size=64, compile=False,
                      **KW) == rows
    assert all(r["text"] for r in rows)
    man = read_manifest(tmp_path / "c", "queries.manifest.json")
    assert man["n_redrawn"] >= 3 and man["compile_last_call"] == json.loads(json.dumps(rec))


def test_a_backend_that_fails_on_the_second_shape_decodes_that_shape_eagerly(tmp_path, caplog):
    """The first shape (16 rows) compiles; the second (the 5-row last batch, bucket 8) runs its graph once -
    writing the cache - then fails, as a CUDA-graph capture can on its second call. That shape decodes
    eagerly from the same step on, with the cache put back, and the queries equal the eager decoder's; the
    16-row shape stays compiled, and `gdr sample` goes on. One log line per failed shape."""
    compiled_shapes = []

    def flaky(gm, example_inputs):
        compiled_shapes.append(len(compiled_shapes))
        if len(compiled_shapes) == 1:
            return gm.forward

        def run_then_fail(*args):
            gm.forward(*args)  # the cache is written before the failure
            raise RuntimeError("capture failed")

        return run_then_fail

    lm = tiny_llama()
    _counting(lm, flaky)  # the backend of lm's own decoder, the one sample_run decodes with
    eager_lm = tiny_llama()
    with caplog.at_level(logging.WARNING, logger="gdr.lm.decode"):
        for n in (21, 13, 5):  # batches of 16 + 5, then 13 (the 16 bucket), then 5 (the failed 8 bucket)
            rows = sample_run(lm, DOCS, DOC_IDS, tmp_path / f"c{n}", n_queries=n, seed=n, batch_size=16,
                              compile=True, **KW)
            assert rows == sample_run(eager_lm, DOCS, DOC_IDS, tmp_path / f"e{n}", n_queries=n, seed=n,
                                      batch_size=16, compile=False, **KW)
            rec = read_manifest(tmp_path / f"c{n}", "queries.manifest.json")["compile_last_call"]
            assert rec["compiled"] and rec["backend"] == "flaky"
            if n != 5:
                assert [g[0] for g in rec["graphs"]] == [16]
            if n != 13:
                assert [g[0] for g in rec["eager_fallback"]] == [8]
    failed = [r.getMessage() for r in caplog.records if "compiled decode step failed" in r.getMessage()]
    assert len(failed) == 1 and "for 8 rows" in failed[0] and "capture failed" in failed[0], failed
    assert len(compiled_shapes) == 2  # the failed shape is never compiled again


def test_a_capture_that_fails_after_writing_the_cache_puts_it_back(monkeypatch):
    """A capture can fail after its warm-up run wrote the step's keys and values and counted them: the eager
    redo must start from the cache as it was, so every step's logits equal those of an eager decoder of the
    same shapes (a count left one ahead shifts every later key by a slot)."""
    from gdr.lm.decode import Decoder

    def run_then_fail(gm, example_inputs):
        def run(*args):
            gm.forward(*args)
            raise RuntimeError("capture failed")

        return run

    lm = tiny_llama()
    logits = {}
    for name, dec in (("compiled", Decoder(lm, compile=True)), ("eager", Decoder(lm, compile=False, bucket=True))):
        dec.compile_options = dict(backend=run_then_fail)
        real, seen = dec._run_step, logits.setdefault(name, [])
        monkeypatch.setattr(dec, "_run_step", lambda *a, real=real, seen=seen: seen.append(real(*a)) or seen[-1])
        args = (lm.prompt_ids(DOCS[:4]), torch.arange(4), torch.arange(4), torch.zeros(4, dtype=torch.long))
        dec.decode(*args, seed=1, max_new_tokens=6, top_k=0, top_p=1.0)
    assert len(logits["compiled"]) == len(logits["eager"]) >= 2
    for a, b in zip(logits["compiled"], logits["eager"]):
        torch.testing.assert_close(a, b)


def test_a_failed_compiled_flex_attention_scores_on_the_dense_path(monkeypatch, caplog):
    """Compiled flex attention (the CUDA scoring path) that fails to compile: the batch is scored again on the
    dense path - never on eager flex, which materialises the fp32 score matrix (~42 GB a layer at the CUDA
    auto sizes) - and so is every later batch, with one log line."""
    import numpy as np
    import torch.nn.attention.flex_attention as fa
    from tiny_models import QUERIES

    from gdr.lm import scoring

    compiles = []

    def broken(gm, example_inputs):
        compiles.append(1)
        raise RuntimeError("no triton for this GPU")

    def eager_flex(*args, **kwargs):
        raise AssertionError("eager flex attention ran: it builds the full fp32 score matrix")

    compiled = torch.compile(fa.flex_attention, backend=broken)
    monkeypatch.setattr(scoring, "compiled_flex", lambda options=(): compiled)
    monkeypatch.setattr(fa, "flex_attention", eager_flex)
    lm = tiny_llama()
    lm.kernels.compile, lm.kernels.options = True, {"backend": "eager"}  # the CUDA configuration, on the CPU
    kw = dict(doc_batch_size=3, max_query_tokens=7, progress=False)
    with caplog.at_level(logging.WARNING, logger="gdr.lm.scoring"):
        got = lm.score(DOCS, QUERIES, attention="flex", **kw)
        again = lm.score(DOCS[:2], QUERIES, attention="flex", **kw)
    np.testing.assert_array_equal(got, lm.score(DOCS, QUERIES, attention="dense", **kw))
    np.testing.assert_array_equal(again, lm.score(DOCS[:2], QUERIES, attention="dense", **kw))
    lines = [r.getMessage() for r in caplog.records if "flex" in r.getMessage()]
    assert len(lines) == 1 and "dense path" in lines[0] and "no triton" in lines[0], lines
    assert len(compiles) == 1  # not tried again for the later batches
    assert lm.kernels.flex_failed and not tiny_llama().kernels.flex_failed  # the scorer's own record, not the process's


def test_the_compile_record_does_not_make_a_finished_folder_stale(tmp_path, monkeypatch):
    """compile_last_call is what a call did, not a setting: a folder whose manifest lacks it is reused as it is, not
    re-sampled (one that records another decode path is refused: test_sampling.py; one of format 0 without the
    numerics is refused by the upgrade: test_upgrade.py)."""
    lm = tiny_llama()
    rows = sample_run(lm, DOCS, DOC_IDS, tmp_path, n_queries=6, seed=2, batch_size=4, compile=False, **KW)
    man = read_manifest(tmp_path, "queries.manifest.json")
    assert man["compile_last_call"]["compiled"] is False and man["compile_last_call"]["graphs"] == []
    path = tmp_path / "queries.manifest.json"
    path.write_text(json.dumps({k: v for k, v in man.items() if k != "compile_last_call"}))

    def resample(*a, **k):
        raise AssertionError("re-sampled a finished folder")

    monkeypatch.setattr(lm, "sample_queries", resample)
    # compile=auto: another setting, the same decode path here (eager on the CPU)
    assert sample_run(lm, DOCS, DOC_IDS, tmp_path, n_queries=6, seed=2, batch_size=4, compile="auto", **KW) == rows
