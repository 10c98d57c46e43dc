"""Prompts: how a document becomes model input, and how a generated query is cleaned."""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from gdr.models import PromptConfig

__all__ = ["PromptConfig", "PromptMixin", "TokenCache", "clean_query", "saved_generator", "special_wrap",
           "GENERATOR_FILE", "PROMPT_LEAD"]

# How a causal model's prefix prompt starts (PromptMixin.prompt_lead): with the special tokens its tokenizer puts
# before a text. Keys the LM stages of a prefix prompt.
PROMPT_LEAD = "tokenizer-lead"

# Written by `gdr qg` next to a fine-tuned generator: the prompt (and document length) it was trained with.
GENERATOR_FILE = "gdr_generator.json"


_LEADING = re.compile(r"^(search query|query|q|answer|a)\s*[:\-]\s*", re.IGNORECASE)


def clean_query(text: str, max_words: int = 32) -> str:
    """Light post-processing of a generated query: first line, no quotes or ``Query:`` labels."""
    text = text.strip().split("\n", 1)[0].strip()
    for _ in range(2):
        text = _LEADING.sub("", text).strip()
        text = text.strip("\"'`*“”‘’ ").strip()
    words = text.split()
    return " ".join(words[:max_words])


def saved_generator(path: str) -> dict | None:
    """The ``gdr_generator.json`` of a local model folder written by ``gdr qg`` (None when absent)."""
    f = Path(path) / GENERATOR_FILE
    if not f.is_file():
        return None
    try:
        meta = json.loads(f.read_text())
        PromptConfig(**meta["prompt"])
    except (ValueError, KeyError, TypeError) as e:
        raise ValueError(f"{f}: not a valid gdr generator file ({e}); re-export the model with `gdr qg` "
                         "or delete the file to use the prompt of the config") from e
    return meta


def special_wrap(tokenizer) -> tuple[list[int], list[int]]:
    """The special tokens the tokenizer puts before and after a text (e.g. [CLS] ... [SEP], <s> ..., ... </s>)."""
    for probe in ("hello world", "a", "the"):
        bare = tokenizer(probe, add_special_tokens=False)["input_ids"]
        full = tokenizer(probe, add_special_tokens=True)["input_ids"]
        for i in range(len(full) - len(bare) + 1):
            if bare and full[i:i + len(bare)] == bare:
                return list(full[:i]), list(full[i + len(bare):])
    return [], []


class TokenCache:
    """Token ids already computed for one tokenizer and one tokenisation setting (prompt, document length, model
    family, end-of-sequence id): by text, as sampling asks for a document's prompt in every batch that draws it and
    scoring for every prompt and query in every shard, each tokenised once; and the ids read off the tokenizer
    itself (a prompt's lead, the stop ids), each found once. Owned by a :class:`gdr.lm.GenerativeLM`
    (``lm.tokens``); emptied when its tokenizer or setting changes."""

    def __init__(self):
        self._tokenizer = None
        self._stamp: tuple | None = None
        self._ids: dict[str, dict[str, np.ndarray]] = {"prompt": {}, "query": {}}
        self._found: dict[str, list[int]] = {}

    def table(self, kind: str, tokenizer, stamp: tuple) -> dict[str, np.ndarray]:
        """The ids by text of ``kind`` ("prompt" or "query") for ``tokenizer`` under ``stamp``."""
        self._check(tokenizer, stamp)
        return self._ids[kind]

    def found(self, name: str, tokenizer, stamp: tuple, find: Callable[[], list[int]]) -> list[int]:
        """A copy of the ids ``name`` that ``find()`` reads off ``tokenizer``, called once under ``stamp``."""
        self._check(tokenizer, stamp)
        if name not in self._found:
            self._found[name] = find()
        return list(self._found[name])

    def _check(self, tokenizer, stamp: tuple) -> None:
        if tokenizer is not self._tokenizer or stamp != self._stamp:
            self._tokenizer, self._stamp = tokenizer, stamp
            self._ids, self._found = {"prompt": {}, "query": {}}, {}


class PromptMixin:
    """Prompt building for :class:`gdr.lm.GenerativeLM` (needs ``tokenizer``, ``prompt``, ``max_doc_tokens``,
    ``eos_id``, ``is_seq2seq`` and ``tokens``, a :class:`TokenCache`)."""

    def truncate(self, docs: Sequence[str]) -> list[str]:
        """Cut every document to ``max_doc_tokens`` tokens (batched tokenisation)."""
        enc = self.tokenizer(list(docs), add_special_tokens=False, truncation=True,
                             max_length=self.max_doc_tokens)["input_ids"]
        return [self.tokenizer.decode(ids, skip_special_tokens=True) for ids in enc]

    def prompt_texts(self, docs: Sequence[str]) -> list[str]:
        docs = self.truncate(docs)
        p = self.prompt
        if p.style == "prefix":
            return [p.prefix + d for d in docs]
        if p.style != "chat":
            raise ValueError(f"unknown prompt style {p.style!r}; use 'chat' or 'prefix'")
        head = [{"role": "system", "content": p.system}] if p.system else []
        for doc, query in p.shots:
            head += [{"role": "user", "content": p.user.format(doc=doc)},
                     {"role": "assistant", "content": query}]
        return [
            self.tokenizer.apply_chat_template(
                head + [{"role": "user", "content": p.user.format(doc=d)}],
                tokenize=False, add_generation_prompt=True)
            for d in docs
        ]

    def longest_prompt_tokens(self) -> int:
        """Tokens of the prompt of a document cut at ``max_doc_tokens``: the length that compiled sampling and
        scoring pad every batch to (a longer prompt, rare, pads further), and the auto sizes plan for."""
        return len(self.prompt_ids([""])[0]) + self.max_doc_tokens

    def _token_stamp(self) -> tuple:
        return repr(self.prompt), self.max_doc_tokens, self.is_seq2seq, self.eos_id

    def prompt_lead(self) -> list[int]:
        """The ids a prompt starts with before its text: for a causal model's prefix prompt the special tokens its
        tokenizer puts before a text (Llama's <s>: a base model reads its text after them, as in pre-training; none
        for SmolLM2's or GPT-2's tokenizer), never those after it (the query follows); none for a chat template
        (it holds its own) or a seq2seq model (its tokenizer's own, T5's </s> after the input)."""
        if self.is_seq2seq or self.prompt.style != "prefix":
            return []
        return self.tokens.found("lead", self.tokenizer, self._token_stamp(), lambda: special_wrap(self.tokenizer)[0])

    def _cached_ids(self, kind: str, texts: Sequence[str], tokenize) -> list[list[int]]:
        """``tokenize(new_texts)`` for the distinct texts not seen before (one batched call), the rest from
        ``self.tokens`` (:class:`TokenCache`)."""
        cache = self.tokens.table(kind, self.tokenizer, self._token_stamp())
        new = list(dict.fromkeys(t for t in texts if t not in cache))
        if new:
            cache.update(zip(new, (np.asarray(ids, dtype=np.int32) for ids in tokenize(new))))
        return [cache[t].tolist() for t in texts]

    def prompt_ids(self, docs: Sequence[str]) -> list[list[int]]:
        """Token ids of each document's prompt (tokenised once per document text, :class:`TokenCache`)."""
        lead = self.prompt_lead()
        return self._cached_ids("prompt", docs, lambda new: [lead + ids for ids in self.tokenizer(
            self.prompt_texts(new), add_special_tokens=self.is_seq2seq)["input_ids"]])

    def query_ids(self, queries: Sequence[str], ended: Sequence[bool] | np.ndarray | None = None
                  ) -> list[list[int]]:
        """Token ids of each query, tokenised once per query text (:class:`TokenCache`), followed by the
        end-of-sequence token where the query ended (Eq. 1 scores its end too): ``ended`` (n_queries,) bool, None
        for all; False for a query cut at ``max_new_tokens`` before the model ended it (its sampled event has no
        end)."""
        ids = self._cached_ids("query", queries, lambda new: self.tokenizer(new, add_special_tokens=False)["input_ids"])
        if ended is None:
            return [q + [self.eos_id] for q in ids]
        return [q + [self.eos_id] if e else q for q, e in zip(ids, ended, strict=True)]
