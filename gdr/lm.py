"""The language-model layer: sample queries from documents and score log p(query | doc).

One interface, two model families (the paper's Section 2.2):

- seq2seq (T5-like, e.g. ``doc2query/all-with_prefix-t5-base-v1`` with prefix ``text2query: ``): the
  document goes through the encoder once; the decoder scores every query against the cached encoder
  states.
- causal (GPT/Llama-like, e.g. the bundled ``smollm2-135m``): the document is wrapped in a chat prompt;
  the prompt's key/value cache is computed once per document and *all* queries of a chunk are scored in
  one packed forward pass over that cache (each query attends to the prompt and to its own earlier
  tokens only, through a 4D attention mask), so the prompt is never recomputed or copied per pair.

log p(y | x) is Eq. (1): the sum of the token log-probs of the query including its end-of-sequence token,
under exactly the prompt used for sampling.
"""
from __future__ import annotations

import logging
import re
from dataclasses import asdict, dataclass, field
from typing import Sequence

import numpy as np
import torch
from tqdm.auto import tqdm

from gdr.models import resolve_model

log = logging.getLogger(__name__)

__all__ = ["PromptConfig", "GenerativeLM", "SampledQueries", "clean_query", "saved_generator", "GENERATOR_FILE"]

# Written by `gdr qg` next to a fine-tuned generator: the prompt (and document length) it was trained with.
GENERATOR_FILE = "gdr_generator.json"


@dataclass
class PromptConfig:
    """How a document becomes model input.

    ``style="prefix"``: input is ``prefix + doc`` (T5 doc2query: ``text2query: ``; also usable with a causal
    base model). ``style="chat"``: a chat-template conversation with an optional system message and
    few-shot (document, query) examples; the generation prompt opens the assistant turn.
    """

    style: str = "chat"
    prefix: str = ""
    system: str | None = "You write short search queries for documents."
    user: str = "Document: {doc}\nSearch query:"
    shots: list[list[str]] = field(default_factory=lambda: [
        ["Shares of Apple Inc rose 5 pct on Tuesday after the company reported record iPhone sales in the "
         "holiday quarter, beating analyst estimates.", "apple record iphone sales"],
        ["The central bank cut its benchmark interest rate by half a point to 4.5 pct, citing slowing "
         "growth and low inflation.", "central bank interest rate cut"],
    ])

    @classmethod
    def for_model(cls, name: str) -> "PromptConfig":
        """The default prompt for a model name: doc2query prefix for T5 models, chat otherwise."""
        if "doc2query" in name or "t5" in name.lower():
            return cls(style="prefix", prefix="text2query: ", system=None, shots=[])
        return cls()


_LEADING = re.compile(r"^(search query|query|q|answer|a)\s*[:\-]\s*", re.IGNORECASE)


def clean_query(text: str, max_words: int = 32) -> str:
    """Light post-processing of a generated query: first line, no quotes or ``Query:`` labels."""
    text = text.strip().split("\n", 1)[0].strip()
    for _ in range(2):
        text = _LEADING.sub("", text).strip()
        text = text.strip("\"'`*“”‘’ ").strip()
    words = text.split()
    return " ".join(words[:max_words])


@dataclass
class SampledQueries:
    """Queries sampled from a corpus: ``texts[j]`` was generated from document ``source_index[j]``."""

    texts: list[str]
    source_index: np.ndarray  # (n_queries,) int64, row of the source document
    n_redrawn: int = 0


def saved_generator(path: str) -> dict | None:
    """The ``gdr_generator.json`` of a local model folder written by ``gdr qg`` (None when absent)."""
    import json
    from pathlib import Path

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


def _autodevice(device: str | None) -> torch.device:
    if device in (None, "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


class GenerativeLM:
    """A generative LM that samples queries and scores log p(query | doc).

    Parameters
    ----------
    model : str or PreTrainedModel
        Hub id, local path, or bundled short name (``smollm2-135m``); or an already built model (tests).
    tokenizer : optional, required when ``model`` is a model object.
    prompt : PromptConfig or dict, optional. Defaults to :meth:`PromptConfig.for_model`.
    max_doc_tokens : int
        Documents are truncated to this many tokens (of the document text itself) before prompting.
    device : ``"auto"``, ``"cpu"``, ``"cuda"``...
    """

    def __init__(self, model, tokenizer=None, prompt: PromptConfig | dict | None = None,
                 max_doc_tokens: int = 128, device: str | None = "auto"):
        from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForSeq2SeqLM, AutoTokenizer

        self.device = _autodevice(device)
        saved = None
        if isinstance(model, str):
            self.name = model
            path = resolve_model(model)
            saved = saved_generator(path)
            cfg = AutoConfig.from_pretrained(path)
            cls = AutoModelForSeq2SeqLM if cfg.is_encoder_decoder else AutoModelForCausalLM
            self.model = cls.from_pretrained(path)
            self.tokenizer = AutoTokenizer.from_pretrained(path)
        else:
            if tokenizer is None:
                raise ValueError("pass tokenizer= together with a model object")
            self.model, self.tokenizer = model, tokenizer
            self.name = getattr(model.config, "_name_or_path", "") or type(model).__name__
        self.model.eval().to(self.device)
        self.is_seq2seq = bool(self.model.config.is_encoder_decoder)
        if isinstance(prompt, dict):
            prompt = PromptConfig(**prompt)
        if saved is not None:  # a `gdr qg` model: always the prompt it was fine-tuned with
            if prompt is not None and prompt != PromptConfig(**saved["prompt"]):
                log.info("%s was fine-tuned with its own prompt (%s); using that, not the configured one",
                         self.name, GENERATOR_FILE)
            prompt = PromptConfig(**saved["prompt"])
        if prompt is None:
            prompt = PromptConfig.for_model(self.name if isinstance(model, str) else "")
            if self.is_seq2seq and prompt.style == "chat":
                prompt = PromptConfig(style="prefix", prefix="", system=None, shots=[])
        if prompt.style == "chat" and getattr(self.tokenizer, "chat_template", None) is None:
            raise ValueError(
                f"model {self.name!r} has no chat template; use prompt style 'prefix' "
                "(e.g. prompt.style=prefix prompt.prefix='text2query: ')"
            )
        self.prompt = prompt
        self.max_doc_tokens = int(max_doc_tokens)
        eos = self.tokenizer.eos_token_id
        if eos is None:
            raise ValueError(f"tokenizer of {self.name!r} has no eos token; cannot score queries with Eq. (1)")
        self.eos_id = int(eos)
        self.pad_id = int(self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else eos)

    # ------------------------------------------------------------------ prompts
    def describe(self) -> dict:
        """What identifies this scorer in a manifest."""
        return {"model": self.name, "family": "seq2seq" if self.is_seq2seq else "causal",
                "prompt": asdict(self.prompt), "max_doc_tokens": self.max_doc_tokens}

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

    def prompt_ids(self, docs: Sequence[str]) -> list[list[int]]:
        texts = self.prompt_texts(docs)
        # Chat templates already hold their special tokens; T5 wants its </s> after the input.
        return self.tokenizer(texts, add_special_tokens=self.is_seq2seq)["input_ids"]

    def query_ids(self, queries: Sequence[str]) -> list[list[int]]:
        """Token ids of each query, ending with the end-of-sequence token (Eq. 1 scores it too)."""
        ids = self.tokenizer(list(queries), add_special_tokens=False)["input_ids"]
        return [list(q) + [self.eos_id] for q in ids]

    # ------------------------------------------------------------------ sampling
    def _stop_ids(self) -> list[int]:
        stop = {self.eos_id}
        if not self.is_seq2seq:
            # A query is one line: stop at the first newline the model writes.
            for tok_id in self.tokenizer("\n", add_special_tokens=False)["input_ids"]:
                stop.add(int(tok_id))
        return sorted(stop)

    @torch.inference_mode()
    def generate(self, docs: Sequence[str], seed: int, max_new_tokens: int = 32, top_k: int = 50,
                 top_p: float = 0.99, temperature: float = 1.0, num_return_sequences: int = 1) -> list[str]:
        """One batched ``generate`` call; returns ``len(docs) * num_return_sequences`` cleaned queries."""
        ids = self.prompt_ids(docs)
        batch = self._pad(ids, left=not self.is_seq2seq)
        torch.manual_seed(seed)
        out = self.model.generate(
            **batch, do_sample=True, top_k=top_k, top_p=top_p, temperature=temperature,
            max_new_tokens=max_new_tokens, num_return_sequences=num_return_sequences,
            eos_token_id=self._stop_ids(), pad_token_id=self.pad_id,
        )
        if not self.is_seq2seq:
            out = out[:, batch["input_ids"].shape[1]:]
        return [clean_query(t) for t in self.tokenizer.batch_decode(out, skip_special_tokens=True)]

    def sample_queries(self, docs: Sequence[str], n: int, seed: int = 0, batch_size: int = 16,
                       max_new_tokens: int = 32, top_k: int = 50, top_p: float = 0.99,
                       temperature: float = 1.0, max_redraws: int = 10, progress: bool = True,
                       start: "SampledQueries | None" = None, on_batch=None) -> SampledQueries:
        """Algorithm 1 line 1 / Section 4.3: draw ``n`` documents uniformly (with replacement, i.i.d. from
        the prior) and generate one query from each. Empty generations are re-drawn from the same document
        with a new seed. ``start`` resumes from already finished batches; ``on_batch(partial)`` is called
        after every batch (used to checkpoint)."""
        rng = np.random.default_rng(seed)
        source = rng.integers(0, len(docs), size=n)
        texts = list(start.texts) if start is not None else []
        redrawn = start.n_redrawn if start is not None else 0
        done = len(texts)
        if done % batch_size and done != n:
            raise ValueError(f"resume point {done} is not a multiple of batch_size={batch_size}")
        bar = tqdm(total=n, initial=done, desc="sample queries", unit="q", disable=not progress)
        for b0 in range(done, n, batch_size):
            idx = source[b0:b0 + batch_size]
            gen = self.generate([docs[i] for i in idx], seed=seed * 1_000_003 + b0, max_new_tokens=max_new_tokens,
                                top_k=top_k, top_p=top_p, temperature=temperature)
            for attempt in range(1, max_redraws + 1):
                empty = [k for k, g in enumerate(gen) if not g]
                if not empty:
                    break
                redrawn += len(empty)
                again = self.generate([docs[idx[k]] for k in empty], seed=seed * 1_000_003 + b0 + 7919 * attempt,
                                      max_new_tokens=max_new_tokens, top_k=top_k, top_p=top_p,
                                      temperature=temperature)
                for k, g in zip(empty, again):
                    gen[k] = g
            else:
                empty = [int(idx[k]) for k, g in enumerate(gen) if not g]
                if empty:
                    raise RuntimeError(f"documents {empty} gave empty queries {max_redraws} times; check the prompt")
            texts.extend(gen)
            bar.update(len(idx))
            if on_batch is not None:
                on_batch(SampledQueries(texts, source[:len(texts)], redrawn))
        bar.close()
        if redrawn:
            log.info("re-drew %d empty generations", redrawn)
        return SampledQueries(texts, source.astype(np.int64), redrawn)

    # ------------------------------------------------------------------ scoring
    def _pad(self, seqs: Sequence[Sequence[int]], left: bool = False) -> dict[str, torch.Tensor]:
        L = max(len(s) for s in seqs)
        ids = torch.full((len(seqs), L), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(seqs), L), dtype=torch.long)
        for r, s in enumerate(seqs):  # building the padded batch; the compute is batched
            if left:
                ids[r, L - len(s):] = torch.tensor(s)
                mask[r, L - len(s):] = 1
            else:
                ids[r, :len(s)] = torch.tensor(s)
                mask[r, :len(s)] = 1
        return {"input_ids": ids.to(self.device), "attention_mask": mask.to(self.device)}

    def _autocast(self):
        if self.device.type == "cuda":
            return torch.autocast("cuda", dtype=torch.bfloat16)
        return torch.autocast("cpu", enabled=False)

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

