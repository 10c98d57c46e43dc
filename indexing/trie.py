"""A docid trie stored as tensors, for constrained decoding.

Every document has a code ``(c_0, c_1, ..., c_{m-1})`` (``docids.tsv``: ``12-3-27``); decoding
emits the digits one position at a time and then an end-of-docid symbol (EOS). The trie holds
every code followed by EOS, flattened into node ids:

- node 0 is the root (the empty prefix); a node at depth ``p`` stands for a prefix of ``p`` symbols;
- ``child[node, s]`` is the node reached by symbol ``s`` or -1, where the *slot* ``s`` is a digit
  ``0 <= s < K`` at the node's depth (position-aware: digit ``d`` at position ``p`` is its own
  token) or ``s = K`` for EOS. The allowed next symbols of a batch of nodes are
  ``child[nodes] >= 0``, a gather, never a Python walk;
- a node reached by EOS is *terminal*; ``docs_of(node)`` lists the documents that carry that code
  (several only when codes are passed directly: ``docids.tsv`` refuses a code given to two documents).

Codes need not have equal lengths. They should form a prefix code, but a code that is a prefix
of another still decodes correctly, because EOS ends a code explicitly.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch

from gdr.indexing.docids import read_docids

__all__ = ["DocidTrie", "build_trie", "load_trie", "pad_codes"]


def pad_codes(codes: Sequence[Sequence[int]]) -> tuple[np.ndarray, np.ndarray]:
    """Codes as a padded array.

    Returns
    -------
    padded : int64 array of shape (n_docs, max_len), -1 past each code's end
    lengths : int64 array of shape (n_docs,)
    """
    lengths = np.fromiter((len(c) for c in codes), dtype=np.int64, count=len(codes))
    max_len = int(lengths.max()) if len(codes) else 0
    padded = np.full((len(codes), max_len), -1, dtype=np.int64)
    flat = np.fromiter((d for c in codes for d in c), dtype=np.int64, count=int(lengths.sum()))
    if len(flat) and flat.min() < 0:
        i = int(np.searchsorted(np.cumsum(lengths), int(np.argmax(flat < 0)), side="right"))
        raise ValueError(f"document #{i} has a negative digit in its code {tuple(codes[i])}")
    rows = np.repeat(np.arange(len(codes)), lengths)
    cols = np.arange(len(flat)) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    padded[rows, cols] = flat
    return padded, lengths


@dataclass
class DocidTrie:
    """Trie of docids as tensors (see the module docstring).

    Attributes
    ----------
    child : int32 tensor of shape (n_nodes, n_digits + 1); column ``n_digits`` is EOS, -1 = no edge
    depth : int64 tensor of shape (n_nodes,), number of symbols on the path from the root
    doc_node : int64 array of shape (n_docs,), the terminal node of each document
    node_ptr, node_docs : CSR arrays; the documents of node ``v`` are
        ``node_docs[node_ptr[v]:node_ptr[v + 1]]`` (empty for non-terminal nodes)
    codes : int64 array of shape (n_docs, max_len), the padded codes (-1 past the end)
    lengths : int64 array of shape (n_docs,)
    n_digits : K, the number of digit values per position (max digit + 1)
    max_len : L, the longest code; decoding takes at most L + 1 steps (digits + EOS)
    """

    child: torch.Tensor
    depth: torch.Tensor
    doc_node: np.ndarray
    node_ptr: np.ndarray
    node_docs: np.ndarray
    codes: np.ndarray
    lengths: np.ndarray
    n_digits: int
    max_len: int

    @property
    def n_nodes(self) -> int:
        return int(self.child.shape[0])

    @property
    def n_docs(self) -> int:
        return int(self.doc_node.shape[0])

    @property
    def eos_slot(self) -> int:
        return self.n_digits

    @property
    def n_codes(self) -> int:
        """Number of distinct docids (terminal nodes)."""
        return int(np.count_nonzero(np.diff(self.node_ptr)))

    def to(self, device: torch.device | str) -> "DocidTrie":
        """The same trie with its tensors on ``device`` (numpy parts are shared)."""
        return DocidTrie(self.child.to(device), self.depth.to(device), self.doc_node, self.node_ptr,
                         self.node_docs, self.codes, self.lengths, self.n_digits, self.max_len)

    def allowed(self, nodes: torch.Tensor) -> torch.Tensor:
        """Bool tensor of shape (*nodes.shape, K + 1): which slots may follow each node."""
        return self.child[nodes.clamp_min(0)] >= 0

    def docs_of(self, node: int) -> np.ndarray:
        """Indices of the documents whose code ends at terminal ``node``."""
        return self.node_docs[self.node_ptr[node]:self.node_ptr[node + 1]]

    def code_of(self, node: int) -> tuple[int, ...]:
        """The code of a terminal node."""
        docs = self.docs_of(node)
        if len(docs) == 0:
            raise ValueError(f"node {node} is not a terminal node of the trie")
        d = int(docs[0])
        return tuple(int(c) for c in self.codes[d, : self.lengths[d]])

    def slot_sequences(self) -> np.ndarray:
        """Every document's symbol sequence: int64 array of shape (n_docs, L + 1), EOS = K, -1 padding."""
        seq = np.full((self.n_docs, self.max_len + 1), -1, dtype=np.int64)
        seq[:, : self.max_len] = self.codes
        seq[np.arange(self.n_docs), self.lengths] = self.n_digits
        return seq

    def contains(self, code: Sequence[int]) -> bool:
        """Whether ``code`` (digits, without EOS) is a docid of the trie (a Python walk; for tests)."""
        node = 0
        child = self.child
        for d in list(code) + [self.n_digits]:
            if not 0 <= d <= self.n_digits:
                return False
            node = int(child[node, d])
            if node < 0:
                return False
        return True


def build_trie(codes: Sequence[Sequence[int]], n_digits: int | None = None) -> DocidTrie:
    """Build the trie of ``codes`` (one per document, in document order).

    Parameters
    ----------
    codes : sequence of n_docs integer tuples, each of length >= 1 with digits >= 0
    n_digits : K, digits per position; default max digit + 1. Larger values leave room for
        codes added later (``gdr index add``) without changing the model's vocabulary.

    Built level by level: at each depth the distinct (parent node, symbol) pairs become the new
    nodes (``np.unique``), so construction is vectorised over documents.
    """
    if len(codes) == 0:
        raise ValueError("cannot build a docid trie from zero codes")
    padded, lengths = pad_codes(codes)
    if (lengths == 0).any():
        i = int(np.flatnonzero(lengths == 0)[0])
        raise ValueError(f"document #{i} has an empty code; every docid needs at least one digit")
    max_digit = int(padded.max())
    K = max_digit + 1 if n_digits is None else int(n_digits)
    if K <= max_digit:
        raise ValueError(f"n_digits={K} but a code has the digit {max_digit}; use n_digits >= {max_digit + 1}")
    n, L = padded.shape
    seq = np.full((n, L + 1), -1, dtype=np.int64)
    seq[:, :L] = padded
    seq[np.arange(n), lengths] = K  # EOS slot

    parent = np.zeros(n, dtype=np.int64)  # current node of each document
    n_nodes = 1
    edges_src, edges_slot, edges_dst = [], [], []
    depths = [np.zeros(1, dtype=np.int64)]
    for p in range(L + 1):  # loop over levels, vectorised over documents
        active = seq[:, p] >= 0
        if not active.any():
            break
        key = parent[active] * (K + 1) + seq[active, p]
        uniq, inv = np.unique(key, return_inverse=True)
        new_ids = n_nodes + np.arange(len(uniq))
        edges_src.append(uniq // (K + 1))
        edges_slot.append(uniq % (K + 1))
        edges_dst.append(new_ids)
        depths.append(np.full(len(uniq), p + 1, dtype=np.int64))
        parent[active] = new_ids[inv]
        n_nodes += len(uniq)
    child = np.full((n_nodes, K + 1), -1, dtype=np.int32)
    child[np.concatenate(edges_src), np.concatenate(edges_slot)] = np.concatenate(edges_dst)
    doc_node = parent  # after the EOS step every document sits on its terminal node
    order = np.argsort(doc_node, kind="stable")
    counts = np.bincount(doc_node, minlength=n_nodes)
    node_ptr = np.zeros(n_nodes + 1, dtype=np.int64)
    np.cumsum(counts, out=node_ptr[1:])
    return DocidTrie(
        child=torch.from_numpy(child),
        depth=torch.from_numpy(np.concatenate(depths)),
        doc_node=doc_node,
        node_ptr=node_ptr,
        node_docs=order.astype(np.int64),
        codes=padded,
        lengths=lengths,
        n_digits=K,
        max_len=L,
    )


def load_trie(path: str | os.PathLike, n_digits: int | None = None) -> tuple[list[str], DocidTrie]:
    """Read ``docids.tsv`` and build its trie; returns (doc_ids, trie)."""
    doc_ids, codes = read_docids(path)
    if not doc_ids:
        raise ValueError(f"{path}: no docids; build them with `gdr index`")
    return doc_ids, build_trie(codes, n_digits=n_digits)
