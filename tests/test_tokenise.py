"""Tokenise once: no tokenizer sees the same text twice in a run, whatever the score shard size, and search
tokenises its queries in one call. Counted by wrapping the tokenizers' ``__call__``, ``encode`` and
``apply_chat_template`` over small ``gdr`` runs with the tiny models."""
from __future__ import annotations

import json
from collections import Counter

import numpy as np
import torch
from test_pipeline import _args, setup  # noqa: F401 - a fixture
from test_retriever import tiny_config, word_tokenizer  # noqa: F401 - a fixture
from transformers import PreTrainedTokenizerBase

from gdr.cli import main

_KW = ("add_special_tokens", "truncation", "max_length")


class TokenizerCalls:
    """Every text each tokenizer instance was asked to tokenise: ``calls`` lists (tokenizer, method, kwargs,
    texts of the call); for ``apply_chat_template``, the conversation as JSON."""

    def __init__(self, monkeypatch):
        self.calls: list[tuple[int, str, tuple, list[str]]] = []
        self.tokenizers: list[PreTrainedTokenizerBase] = []  # held: their ids are not reused within a test
        for name in ("__call__", "encode", "apply_chat_template"):
            monkeypatch.setattr(PreTrainedTokenizerBase, name, self._wrap(name, getattr(PreTrainedTokenizerBase, name)))

    def _wrap(self, name, orig):
        def method(tok, first=None, *a, **k):
            texts = [json.dumps(first)] if name == "apply_chat_template" else (
                [first] if isinstance(first, str) else list(first or k.get("text") or []))
            if not any(t is tok for t in self.tokenizers):
                self.tokenizers.append(tok)
            self.calls.append((id(tok), name, tuple(k.get(x) for x in _KW), texts))
            return orig(tok, *((first,) if first is not None else ()), *a, **k)
        return method

    def repeated(self) -> dict:
        """(tokenizer, method, kwargs, text) seen in more than one call (a repeat within one batched call is one
        tokenizer call: not counted)."""
        seen = Counter((tok, name, kw, t) for tok, name, kw, texts in self.calls for t in set(texts))
        return {key[1:]: n for key, n in seen.items() if n > 1}

    def texts(self) -> Counter:
        return Counter((name, kw, t) for _, name, kw, texts in self.calls for t in texts)


def test_a_gdr_run_tokenises_every_text_once(setup, tmp_path, monkeypatch):  # noqa: F811 - the fixture
    """A `gdr run` (sampling in 2 batches, scoring in 15 shards of 2 documents, generated training queries,
    training, search): no tokenizer tokenises a text in two calls; each document's prompt is rendered and
    tokenised once and each sampled query once, never again in every sampling batch or scoring shard that holds
    it."""
    root, folder = setup
    calls = TokenizerCalls(monkeypatch)
    out = tmp_path / "run"
    assert main(_args(root, folder, out, "indexers=[gc]", "bm25=false", "cluster.enabled=false", "plot=false",
                      "score.shard_size=2")) == 0
    assert calls.repeated() == {}
    score = next(out.glob("score-*"))
    queries = [json.loads(line)["text"] for line in (score / "queries.jsonl").read_text().splitlines()]
    docs = json.loads((score / "doc_ids.json").read_text())
    texts = calls.texts()
    assert sum(n for (name, _, _), n in texts.items() if name == "apply_chat_template") == len(docs) + 1  # + ""
    assert all(texts[("__call__", (False, None, None), q)] == 1 for q in queries)


def test_scoring_tokenises_the_same_whatever_the_shard_size(setup, tmp_path, monkeypatch):  # noqa: F811
    """`gdr score` in 15 shards of 2 documents and in one of 64: the same tokenizer calls text by text, each
    text once, and the same P bit for bit."""
    root, folder = setup
    common = ["score", f"data.name={folder}", f"model.name={root / 'tiny-llama'}", "model.max_doc_tokens=24",
              "sample.n_queries=12", "sample.batch_size=4", "sample.max_new_tokens=6", "progress=false",
              "threads=1"]
    seen = {}
    for size in (2, 64):
        calls = TokenizerCalls(monkeypatch)
        assert main([*common, f"out={tmp_path / str(size)}", f"score.shard_size={size}"]) == 0
        assert calls.repeated() == {}, f"shard size {size}"
        seen[size] = calls.texts()
        monkeypatch.undo()
    assert seen[2] == seen[64] and max(seen[2].values()) == 1
    assert np.array_equal(np.load(tmp_path / "2" / "P.npy"), np.load(tmp_path / "64" / "P.npy"))


def test_search_tokenises_its_queries_in_one_call(word_tokenizer, monkeypatch):  # noqa: F811 - the fixture
    """Search in batches of 2: one tokenizer call for all queries, batches padded as the tokenizer pads them,
    and the same docids and scores as searching each batch alone."""
    from gdr.indexing.trie import build_trie
    from gdr.training.model import GenerativeRetriever, load_tokenizer
    from gdr.training.search import Retriever

    torch.manual_seed(0)
    codes = [(0, 1), (1, 0), (1, 2), (2, 2), (0, 0)]
    model = GenerativeRetriever.build(tiny_config(word_tokenizer, K=3, L=2)).eval()
    tok = load_tokenizer(word_tokenizer)
    r = Retriever(model, tok, build_trie(codes, n_digits=3), [f"d{i}" for i in range(5)], device="cpu",
                  beam=5, batch_size=2)
    queries = ["apple river stone", "cloud", "tiger piano garden silver", "winter", "castle ocean"]
    alone = [r.search_nodes(queries[s:s + 2], k=3) for s in range(0, 5, 2)]
    calls = TokenizerCalls(monkeypatch)
    nodes, scores = r.search_nodes(queries, k=3)
    assert len(calls.calls) == 1, f"{len(calls.calls)} tokenizer calls for 3 batches"
    assert np.array_equal(nodes, np.concatenate([n for n, _ in alone]))
    assert np.array_equal(scores, np.concatenate([s for _, s in alone]))
    for s in range(0, 5, 2):  # each batch as the tokenizer pads it
        enc = tok(queries[s:s + 2], padding=True, truncation=True, max_length=model.config.max_query_len,
                  return_tensors="pt")
        got = r.tokenize(queries[s:s + 2])
        assert all(torch.equal(got[key], enc[key]) for key in ("input_ids", "attention_mask"))
