"""Constrained beam search over a docid trie, and the :class:`Retriever` that wraps it.

The trie constraint is a gather: the hypotheses sit on trie nodes ``nodes`` of shape (B, w), the
allowed next symbols are ``trie.child[nodes] >= 0`` of shape (B, w, K + 1), and the chosen
symbols move every hypothesis to ``trie.child[nodes, slot]`` at once. The only Python loop is over
decoding steps (at most L + 1). The decoder runs incrementally with a KV cache.

Scoring: a hypothesis scores the sum of its symbols' log-probabilities (the model's per-position
softmax over the K digits of that position and EOS; the trie mask is applied after the softmax,
without renormalising, as HF's ``prefix_allowed_tokens_fn`` does). Hypotheses are ranked by
``score / length**length_penalty`` (length counts the EOS), which only matters when codes have
different lengths. A hypothesis that has emitted EOS keeps its beam slot with a frozen score and
competes with the unfinished ones at every later step; the final list is the best ``k`` finished
hypotheses. With ``beam`` at least the number of docids the search is exhaustive and returns exactly
the top ``k`` docids by score; a narrower beam can drop one that belongs there (finished hypotheses
keep their slots, so even a beam as wide as the trie at every depth is not enough).
"""
from __future__ import annotations

import logging
import os
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
import torch
from tqdm.auto import tqdm
from transformers import AutoTokenizer

from gdr import cost
from gdr.indexing.trie import DocidTrie, load_trie
from gdr.io import check_manifest_files
from gdr.lm.hostsync import upload
from gdr.options import RankingOptions
from gdr.rerun import RerunCommand
from gdr.signals import check as check_stop
from gdr.training.model import PAD, GenerativeRetriever, RetrieverConfig, decoder_dims, encoder_dims, load_tokenizer

log = logging.getLogger(__name__)

__all__ = ["BeamOutput", "constrained_beam_search", "Retriever", "expand_nodes", "search_batch_for_memory",
           "search_memory_per_query"]


@dataclass
class BeamOutput:
    """Top-k docids per query.

    nodes : int64 tensor of shape (B, k), terminal trie nodes best first; -1 where the trie has fewer
        than k docids
    scores : float tensor of shape (B, k), length-normalised log-probabilities (-inf where nodes = -1)
    """

    nodes: torch.Tensor
    scores: torch.Tensor


@torch.no_grad()
def constrained_beam_search(
    model: GenerativeRetriever,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    trie: DocidTrie,
    beam: int = 10,
    k: int | None = None,
    length_penalty: float = RankingOptions.length_penalty,
) -> BeamOutput:
    """Batched beam search that can only produce docids of ``trie``.

    Parameters
    ----------
    input_ids, attention_mask : tokenised queries of shape (B, S)
    trie : docid trie with its tensors on the model's device (``trie.to(device)``)
    beam : beam width (hypotheses kept per query)
    k : number of docids returned per query (<= beam; default beam)
    length_penalty : ranking exponent on the length; 0 ranks by the plain sum of log-probs
    """
    k = beam if k is None else k
    if not 1 <= k <= beam:
        raise ValueError(f"need 1 <= k <= beam, got k={k}, beam={beam}")
    if trie.n_digits != model.config.n_digits or trie.max_len > model.config.max_code_len:
        raise ValueError(
            f"trie has K={trie.n_digits}, L={trie.max_len} but the model was built for "
            f"K={model.config.n_digits}, L<={model.config.max_code_len}"
        )
    return _beam_kernel(model, input_ids, attention_mask, trie, beam, k, length_penalty)


def _beam_kernel(model, input_ids, attention_mask, trie, beam, k, length_penalty) -> BeamOutput:
    device = input_ids.device
    K1 = trie.n_digits + 1
    eos = trie.n_digits
    child = trie.child
    enc = model.encode(input_ids, attention_mask)  # (B, S, d)
    B = enc.shape[0]
    state = model.start(enc, attention_mask)
    neg_inf = float("-inf")
    nodes = torch.zeros(B, 1, dtype=torch.long, device=device)  # all start at the root
    scores = torch.zeros(B, 1, device=device)
    length = torch.zeros(B, 1, device=device)
    done = torch.zeros(B, 1, dtype=torch.bool, device=device)
    # a finished hypothesis has one way forward: slot 0 with log-prob 0 (it stays where it is)
    keep_row = torch.full((K1,), float("-inf"), device=device)
    keep_row[0] = 0.0
    tokens = torch.full((B,), PAD, dtype=torch.long, device=device)
    w = 1
    for t in range(trie.max_len + 1):  # loop over decoding steps only
        logp = model.step(state, tokens).view(B, w, K1)  # (B, w, K+1)
        nxt = child[nodes]  # (B, w, K+1) next node per slot, -1 = not in the trie
        cand = torch.where(nxt >= 0, scores[..., None] + logp, neg_inf)
        cand = torch.where(done[..., None], scores[..., None] + keep_row, cand)
        if length_penalty:
            cand_len = torch.where(done, length, torch.full_like(length, t + 1))
            rank = cand / cand_len[..., None] ** length_penalty
        else:
            rank = cand
        w_new = min(beam, w * K1)
        top, idx = rank.view(B, w * K1).topk(w_new, dim=1)  # (B, w')
        src, slot = idx // K1, idx % K1  # source hypothesis and chosen slot
        was_done = done.gather(1, src)
        scores = cand.view(B, -1).gather(1, idx)
        nodes = torch.where(was_done, nodes.gather(1, src), nxt.view(B, -1).gather(1, idx).long())
        nodes = nodes.clamp_min(0)  # hypotheses with -inf scores are dead; keep their index valid
        length = torch.where(was_done, length.gather(1, src), torch.full_like(length.gather(1, src), t + 1))
        done = was_done | (slot == eos)
        if t == trie.max_len:  # no early exit on `done.all()`: reading it would sync the host every step
            break
        step_tok = model.slot_tokens[t][slot]  # (B, w') token ids of the chosen slots at position t
        tokens = torch.where(done, torch.full_like(step_tok, PAD), step_tok).view(-1)
        flat = (torch.arange(B, device=device)[:, None] * w + src).view(-1)  # (B*w',) rows to keep
        model.reorder(state, flat)
        w = w_new
    final = scores / length.clamp_min(1) ** length_penalty if length_penalty else scores
    final = torch.where(done & torch.isfinite(scores), final, neg_inf)
    kk = min(k, final.shape[1])
    best, order = final.topk(kk, dim=1)
    out_nodes = torch.where(torch.isfinite(best), nodes.gather(1, order), torch.full_like(order, -1))
    if kk < k:  # fewer hypotheses than k (tiny trie): pad
        pad = k - kk
        out_nodes = torch.cat([out_nodes, out_nodes.new_full((B, pad), -1)], 1)
        best = torch.cat([best, best.new_full((B, pad), float("-inf"))], 1)
    return BeamOutput(out_nodes, best)


def expand_nodes(trie: DocidTrie, nodes: np.ndarray,
                 scores: np.ndarray) -> tuple[list[np.ndarray], list[np.ndarray], list[np.ndarray]]:
    """Expand terminal nodes (n_q, k) to documents; a docid shared by several documents yields all.

    Returns per query: document indices, scores and docid ranks (1-based; documents sharing a docid
    share its rank). Vectorised with the trie's CSR arrays; only the final split is per query.
    """
    n_q, k = nodes.shape
    if n_q == 0:
        return [], [], []
    valid = nodes >= 0
    safe = np.where(valid, nodes, 0)
    counts = np.where(valid, trie.node_ptr[safe + 1] - trie.node_ptr[safe], 0)  # (n_q, k)
    flat_counts = counts.ravel()
    starts = np.repeat(trie.node_ptr[safe].ravel(), flat_counts)
    offs = np.arange(flat_counts.sum()) - np.repeat(np.cumsum(flat_counts) - flat_counts, flat_counts)
    docs = trie.node_docs[starts + offs]
    sc = np.repeat(scores.ravel(), flat_counts)
    rk = np.repeat(np.tile(np.arange(1, k + 1), n_q), flat_counts)
    per_q = counts.sum(1)
    cuts = np.cumsum(per_q)[:-1]
    return np.split(docs, cuts), np.split(sc, cuts), np.split(rk, cuts)


SEARCH_BATCH_CAP, CPU_SEARCH_BATCH = 1024, 32


def search_memory_per_query(config: RetrieverConfig, beam: int) -> int:
    """Device memory one query of a beam search at ``beam`` takes at most (:func:`gdr.cost.search_memory_per_query`)."""
    return cost.search_memory_per_query(encoder_dims(config), decoder_dims(config), config.max_query_len,
                                        config.max_code_len, config.n_digits, beam)


def search_batch_for_memory(config: RetrieverConfig, free_bytes: float, beam: int, cap: int = SEARCH_BATCH_CAP) -> int:
    """``evaluate.batch_size: auto`` on CUDA: the most queries per beam search whose memory
    (:func:`search_memory_per_query`) fits in half of ``free_bytes``, at most ``cap``."""
    return cost.batch_for_memory(free_bytes, search_memory_per_query(config, beam), share=0.5, cap=cap)


def _default_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


class Retriever:
    """A trained retriever with its docids, ready to search.

    ``Retriever.load(run_dir).search(["what is ..."], k=10)`` returns, per query, a list of
    ``(doc_id, score)`` best first (documents sharing a docid all appear, with the same score).
    """

    def __init__(self, model: GenerativeRetriever, tokenizer, trie: DocidTrie, doc_ids: Sequence[str],
                 device: str | torch.device | None = None, beam: int = RankingOptions.beam,
                 length_penalty: float = RankingOptions.length_penalty, batch_size: int | str = 32):
        if trie.n_docs != len(doc_ids):
            raise ValueError(f"trie has {trie.n_docs} documents but {len(doc_ids)} doc ids were given")
        self.device = torch.device(device) if device is not None else _default_device()
        self.model = model.to(self.device).eval()
        self.tokenizer = tokenizer
        self.trie = trie.to(self.device)
        self.doc_ids = np.asarray(list(doc_ids), dtype=object)
        self.beam = beam
        self.length_penalty = length_penalty
        self.batch_size = batch_size if batch_size == "auto" else int(batch_size)  # see batch_for

    @classmethod
    def load(cls, path: str | os.PathLike, device: str | torch.device | None = None, **kw) -> "Retriever":
        """Load from a ``gdr train`` run folder (or its ``model/`` folder): ``model/`` + ``docids.tsv``."""
        path = Path(path)
        if not path.is_dir():
            raise FileNotFoundError(f"{path}: no such folder; pass the out_dir of `gdr train` (gdr.train_retriever)")
        model_dir = path / "model" if (path / "model" / "retriever.json").exists() else path
        if not (model_dir / "retriever.json").exists():
            raise FileNotFoundError(f"{path} has no model/retriever.json: not the out_dir of a finished `gdr train` "
                                    "(gdr.train_retriever)")
        docids = next((p for p in (path / "docids.tsv", model_dir / "docids.tsv", model_dir.parent / "docids.tsv")
                       if p.exists()), None)
        if docids is None:
            raise FileNotFoundError(f"no docids.tsv in {path} or {model_dir}; a `gdr train` run folder has one")

        check_manifest_files(model_dir.parent, fix=RerunCommand("train", model_dir.parent, "retrain with `{}`"))
        model = GenerativeRetriever.load(model_dir)
        tok_src = str(model_dir) if (model_dir / "tokenizer_config.json").exists() else model.config.tokenizer_name

        tokenizer = AutoTokenizer.from_pretrained(tok_src) if tok_src == str(model_dir) else load_tokenizer(tok_src)
        doc_ids, trie = load_trie(docids, n_digits=model.config.n_digits)
        return cls(model, tokenizer, trie, doc_ids, device=device, **kw)

    def batch_for(self, beam: int) -> int:
        """Queries per beam search: an int as given; ``auto`` = on CUDA as many as fit half the free memory at
        this beam (:func:`search_batch_for_memory`, at most 1,024), 32 on the CPU."""
        if self.batch_size != "auto":
            return self.batch_size
        if self.device.type != "cuda":
            return CPU_SEARCH_BATCH
        free, _ = torch.cuda.mem_get_info(self.device)
        return search_batch_for_memory(self.model.config, free, beam)

    def tokenize(self, queries: Sequence[str]) -> dict[str, torch.Tensor]:
        """``input_ids`` and ``attention_mask`` (B, S) on the device, padded on the right as training pads."""
        return self._batch(self._token_ids(queries))

    def _token_ids(self, queries: Sequence[str]) -> list[list[int]]:
        """Token ids of every query (cut at ``max_query_len``), in one tokenizer call."""
        return self.tokenizer(list(queries), truncation=True, max_length=self.model.config.max_query_len)["input_ids"]

    def _batch(self, ids: Sequence[Sequence[int]]) -> dict[str, torch.Tensor]:
        """A batch of token ids padded on the right to its longest, as training pads its queries
        (:func:`gdr.training.data.pad_batch`) whatever the tokenizer's ``padding_side``: an encoder that takes
        positions from token order (BERT's absolute ones) reads a query as training showed it, whatever else shares
        its batch. Uploaded without a host sync."""
        lens = np.array([len(q) for q in ids])
        width = int(lens.max(initial=0))
        real = np.arange(width)[None, :] < lens[:, None]
        tok = np.full((len(ids), width), self.tokenizer.pad_token_id, dtype=np.int64)
        tok[real] = np.concatenate([np.asarray(q, dtype=np.int64) for q in ids]) if len(ids) else []
        return {"input_ids": upload(tok, self.device), "attention_mask": upload(real.astype(np.int64), self.device)}

    @torch.no_grad()
    def search_nodes(self, queries: Sequence[str], k: int = RankingOptions.k, beam: int | None = None,
                     progress: bool = False) -> tuple[np.ndarray, np.ndarray]:
        """Terminal nodes (n_q, k) and scores (n_q, k) for ``queries``, in batches."""
        beam = max(self.beam if beam is None else beam, k)
        nodes, scores = [], []
        bs = self.batch_for(beam)
        starts = range(0, len(queries), bs)
        amp = torch.autocast("cuda", dtype=torch.bfloat16) if self.device.type == "cuda" else nullcontext()
        # every query tokenised once, not per batch: no tokenizer work between GPU batches
        ids = self._token_ids(queries) if len(queries) else []
        empty = [i for i, q in enumerate(ids) if not len(q)]
        if empty:
            raise ValueError(f"query {empty[0]} ({queries[empty[0]]!r}) has no token for this retriever's tokenizer "
                             f"({len(empty)} such queries): give it words, or leave it out")
        for s in tqdm(starts, desc="search", unit="batch", disable=not progress):
            check_stop()  # a stop whose raise was lost (gdr.signals): the next batch does not start
            batch = self._batch(ids[s:s + bs])
            with amp:
                out = constrained_beam_search(self.model, batch["input_ids"], batch["attention_mask"], self.trie,
                                              beam=beam, k=k, length_penalty=self.length_penalty)
            nodes.append(out.nodes.cpu().numpy())
            scores.append(out.scores.float().cpu().numpy())
        if not nodes:
            return np.zeros((0, k), dtype=np.int64), np.zeros((0, k), dtype=np.float32)
        return np.concatenate(nodes), np.concatenate(scores)

    def search_ranked(self, queries: Sequence[str], k: int = RankingOptions.k, beam: int | None = None,
                      progress: bool = False):
        """Per query: (doc indices, scores, docid ranks) arrays; see :func:`expand_nodes`."""
        nodes, scores = self.search_nodes(queries, k=k, beam=beam, progress=progress)
        return expand_nodes(self.trie, nodes, scores)

    def search(self, queries: Sequence[str], k: int = 10, beam: int | None = None) -> list[list[tuple[str, float]]]:
        """Top-k docids per query as ``(doc_id, score)`` lists, best first."""
        if isinstance(queries, str):
            raise TypeError("search takes a list of queries; wrap a single query in a list")
        docs, scores, _ = self.search_ranked(queries, k=k, beam=beam)
        return [list(zip(self.doc_ids[d].tolist(), s.astype(float).tolist())) for d, s in zip(docs, scores)]
