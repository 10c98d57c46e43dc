"""Scoring log p(query | doc) for every pair: the matrix P (Eq. 1).

The document's encoder pass (seq2seq) or prompt key/value cache (causal) is computed once per document;
all queries of a chunk are scored in one packed forward pass over it.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import torch
from tqdm.auto import tqdm

__all__ = ["ScoringMixin"]


class ScoringMixin:
    """P-matrix scoring for :class:`gdr.lm.GenerativeLM`."""

    @torch.inference_mode()
    def score(self, docs: Sequence[str], queries: Sequence[str], doc_batch_size: int = 4,
              max_query_tokens: int = 2048, progress: bool = True) -> np.ndarray:
        """log p(query_j | doc_i) for every pair (Eq. 1).

        Parameters
        ----------
        docs : sequence of str, length n_docs
        queries : sequence of str, length n_queries
        doc_batch_size : documents per forward pass (sorted by prompt length to limit padding).
        max_query_tokens : query tokens per packed chunk (bounds memory; the prompt is reused across chunks).

        Returns
        -------
        logp : float32 ndarray of shape (n_docs, n_queries)
        """
        p_ids = self.prompt_ids(docs)
        q_ids = self.query_ids(queries)
        order = np.argsort([len(p) for p in p_ids], kind="stable")
        out = np.empty((len(docs), len(queries)), dtype=np.float32)
        bar = tqdm(total=len(docs) * len(queries), desc="score", unit="pair", unit_scale=True,
                   disable=not progress)
        for b0 in range(0, len(docs), doc_batch_size):
            rows = order[b0:b0 + doc_batch_size]
            batch = [p_ids[i] for i in rows]
            with self._autocast():
                if self.is_seq2seq:
                    lp = self._score_seq2seq(batch, q_ids, max_query_tokens)
                else:
                    lp = self._score_causal(batch, q_ids, max_query_tokens)
            out[rows] = lp.float().cpu().numpy()
            bar.update(len(rows) * len(queries))
        bar.close()
        return out

    def _query_chunks(self, q_ids: list[list[int]], max_tokens: int) -> list[tuple[int, int]]:
        chunks, start, tokens = [], 0, 0
        for j, q in enumerate(q_ids):
            if j > start and tokens + len(q) > max_tokens:
                chunks.append((start, j))
                start, tokens = j, 0
            tokens += len(q)
        chunks.append((start, len(q_ids)))
        return chunks

    def _token_logprobs(self, hidden: torch.Tensor, targets: torch.Tensor, slice_tokens: int = 1024) -> torch.Tensor:
        """log softmax(lm_head(hidden))[targets] without materialising all logits at once.

        hidden (N, d), targets (N,) -> (N,)
        """
        head = self.model.get_output_embeddings()
        out = torch.empty(hidden.shape[0], dtype=torch.float32, device=hidden.device)
        for s in range(0, hidden.shape[0], slice_tokens):
            logits = head(hidden[s:s + slice_tokens]).float()  # (n, V)
            out[s:s + slice_tokens] = logits.gather(1, targets[s:s + slice_tokens, None])[:, 0] - logits.logsumexp(-1)
        return out

    @staticmethod
    def _cache_kw(module) -> str:
        # transformers 5.2x renamed `past_key_values` to `cache` on some models; accept both.
        import inspect

        return "cache" if "cache" in inspect.signature(module.forward).parameters else "past_key_values"

    def _score_causal(self, prompts: list[list[int]], q_ids: list[list[int]], max_query_tokens: int) -> torch.Tensor:
        dev = self.device
        B = len(prompts)
        plen = torch.tensor([len(p) for p in prompts], device=dev)  # (B,)
        enc = self._pad(prompts)
        Lp = enc["input_ids"].shape[1]
        base = self.model.get_decoder() if hasattr(self.model, "get_decoder") else self.model.model
        from transformers import DynamicCache

        cache = DynamicCache(config=self.model.config)
        ckw = self._cache_kw(base)
        h = base(**enc, **{ckw: cache}, use_cache=True).last_hidden_state  # (B, Lp, d)
        h_last = h[torch.arange(B, device=dev), plen - 1]  # (B, d): predicts each query's first token
        out = torch.empty((B, len(q_ids)), dtype=torch.float32, device=dev)
        neg = torch.finfo(h.dtype).min
        for c0, c1 in self._query_chunks(q_ids, max_query_tokens):
            chunk = q_ids[c0:c1]
            lens = torch.tensor([len(q) for q in chunk], device=dev)  # (Q,)
            Q = len(chunk)
            # Packed input: every query without its last token (the last token is only a target).
            inp = torch.tensor([t for q in chunk for t in q[:-1]], device=dev)  # (T,)
            tgt = torch.tensor([t for q in chunk for t in q], device=dev)  # (T + Q,)
            qid = torch.repeat_interleave(torch.arange(Q, device=dev), lens - 1)  # (T,) query of each token
            starts = torch.cumsum(lens - 1, 0) - (lens - 1)  # (Q,) offset of each query in the packed input
            off = torch.arange(inp.numel(), device=dev) - starts[qid]  # (T,) position inside its query
            T = inp.numel()
            # 4D additive mask (B, 1, T, Lp + T): a query token sees its document's prompt (not padding)
            # and the earlier tokens of its own query.
            see_prompt = torch.arange(Lp, device=dev)[None, :] < plen[:, None]  # (B, Lp)
            see_query = (qid[:, None] == qid[None, :]) & (off[None, :] <= off[:, None])  # (T, T)
            allowed = torch.cat([see_prompt[:, None, :].expand(B, T, Lp), see_query[None].expand(B, T, T)], -1)
            mask = torch.zeros(allowed.shape, dtype=h.dtype, device=dev).masked_fill_(~allowed, neg)[:, None]
            pos = plen[:, None] + off[None, :]  # (B, T)
            hq = base(input_ids=inp[None].expand(B, T), attention_mask=mask, position_ids=pos,
                      **{ckw: cache}, use_cache=True).last_hidden_state  # (B, T, d)
            cache.crop(-T)  # drop this chunk, keep the prompt for the next one
            # Hidden state predicting token t of query q: the prompt's last state for t = 0, else packed state t-1.
            first = torch.cumsum(lens, 0) - lens  # (Q,) index of each query's first token in tgt
            pred_src = torch.empty((B, T + Q, h.shape[-1]), dtype=h.dtype, device=dev)
            is_first = torch.zeros(T + Q, dtype=torch.bool, device=dev)
            is_first[first] = True
            pred_src[:, is_first] = h_last[:, None, :].expand(B, Q, -1)
            pred_src[:, ~is_first] = hq
            lp = self._token_logprobs(pred_src.reshape(B * (T + Q), -1), tgt.repeat(B)).view(B, T + Q)
            tok_q = torch.repeat_interleave(torch.arange(Q, device=dev), lens)  # (T + Q,)
            out[:, c0:c1] = torch.zeros((B, Q), device=dev).index_add_(1, tok_q, lp)
        return out

    def _score_seq2seq(self, prompts: list[list[int]], q_ids: list[list[int]], max_query_tokens: int) -> torch.Tensor:
        dev = self.device
        B = len(prompts)
        enc = self._pad(prompts)
        enc_h = self.model.get_encoder()(**enc).last_hidden_state  # (B, S, d): once per document
        start = self.model.config.decoder_start_token_id
        start = self.pad_id if start is None else int(start)
        out = torch.empty((B, len(q_ids)), dtype=torch.float32, device=dev)
        for c0, c1 in self._query_chunks(q_ids, max(1, max_query_tokens // B)):
            chunk = q_ids[c0:c1]
            Q = len(chunk)
            labels = self._pad(chunk)["input_ids"]  # (Q, L)
            lmask = self._pad(chunk)["attention_mask"].bool()
            dec_in = torch.cat([torch.full((Q, 1), start, device=dev), labels[:, :-1]], 1)  # shift right
            dec_mask = torch.cat([torch.ones((Q, 1), dtype=torch.long, device=dev), lmask[:, :-1].long()], 1)
            L = labels.shape[1]
            logits = self.model(
                encoder_outputs=(enc_h.repeat_interleave(Q, 0),),
                attention_mask=enc["attention_mask"].repeat_interleave(Q, 0),
                decoder_input_ids=dec_in.repeat(B, 1), decoder_attention_mask=dec_mask.repeat(B, 1),
            ).logits.float()  # (B*Q, L, V)
            lp = logits.gather(-1, labels.repeat(B, 1)[..., None])[..., 0] - logits.logsumexp(-1)  # (B*Q, L)
            lp = (lp * lmask.repeat(B, 1)).sum(-1)
            out[:, c0:c1] = lp.view(B, Q)
        return out

    @torch.inference_mode()
    def score_naive(self, docs: Sequence[str], queries: Sequence[str]) -> np.ndarray:
        """Reference: one full forward pass of prompt + query per pair, as ``model(ids, labels=...)`` would.

        Used by the benchmark and the tests; never in a hot path.
        """
        p_ids = self.prompt_ids(docs)
        q_ids = self.query_ids(queries)
        out = np.empty((len(docs), len(queries)), dtype=np.float32)
        for i, p in enumerate(p_ids):
            for j, q in enumerate(q_ids):
                with self._autocast():
                    if self.is_seq2seq:
                        r = self.model(input_ids=torch.tensor([p], device=self.device),
                                       labels=torch.tensor([q], device=self.device))
                        n = len(q)
                    else:
                        ids = torch.tensor([p + q], device=self.device)
                        labels = ids.clone()
                        labels[0, :len(p)] = -100
                        r = self.model(input_ids=ids, labels=labels)
                        n = len(q)
                # labels= gives the mean token NLL over the scored tokens.
                out[i, j] = -float(r.loss) * n
        return out
