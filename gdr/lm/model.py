"""The generative LM: one interface over two model families, built from the prompt, sampling and scoring
mixins.

The language-model layer: sample queries from documents and score log p(query | doc).

One interface, two model families (the paper's Section 2.2):

- seq2seq (T5-like, e.g. ``doc2query/all-with_prefix-t5-base-v1`` with prefix ``text2query: ``): the
  document goes through the encoder once; the decoder scores every query against the cached encoder
  states.
- causal (GPT/Llama-like, e.g. the bundled ``smollm2-135m``): the document is wrapped in a chat prompt;
  the prompt's key/value cache is computed once per document and *all* queries of a chunk are scored in
  one packed forward pass over that cache (each query attends to the prompt and to its own earlier
  tokens only, through a 4D attention mask), so the prompt is never recomputed or copied per pair.

log p(y | x) is Eq. (1): the sum of the token log-probs of the query and of its end as the sampler ends a
query (any stop id; none for a query cut at ``max_new_tokens``: :data:`gdr.lm.scoring.QUERY_END`), under exactly
the prompt used for sampling.
"""
from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import asdict
from typing import Sequence

import torch
from transformers import AutoModelForCausalLM, AutoModelForSeq2SeqLM, AutoTokenizer

from gdr.device import cpu_threads
from gdr.lm.hostsync import upload
from gdr.lm.numerics import resolve_device
from gdr.lm.prompts import GENERATOR_FILE, PromptConfig, PromptMixin, TokenCache, saved_generator
from gdr.lm.sampling import SamplingMixin
from gdr.lm.scoring import ScoringKernels, ScoringMixin
from gdr.logs import quiet_loading
from gdr.models import MAX_DOC_TOKENS_RULE, THREADS_RULE, ModelOptions, model_digest, pretrained_config, resolve_model
from gdr.rules import check_values

log = logging.getLogger(__name__)

__all__ = ["GenerativeLM"]


def object_digest(model: torch.nn.Module, tokenizer) -> str:
    """``sha256:<hex>`` over a model object's state (each tensor's name, dtype, shape and bytes) and its tokenizer's
    vocabulary: what identifies a generator handed in as objects, which no files name (two random-init models of
    one class, or a model changed in memory before it is wrapped, must not share a folder's queries and P)."""
    h = hashlib.sha256()
    for name, t in sorted(model.state_dict().items()):
        t = t.detach().to("cpu").contiguous().reshape(-1)
        h.update(f"{name}:{t.dtype}:{t.numel()};".encode())
        h.update(t.view(torch.uint8).numpy().tobytes())
    h.update(json.dumps(sorted(tokenizer.get_vocab().items())).encode())
    return "sha256:" + h.hexdigest()


class GenerativeLM(PromptMixin, SamplingMixin, ScoringMixin):
    """A generative LM that samples queries and scores log p(query | doc).

    Parameters
    ----------
    model : str or PreTrainedModel
        Hub id, local path, or bundled short name (``smollm2-135m``); or an already built model (tests).
    tokenizer : optional, required when ``model`` is a model object.
    prompt : PromptConfig or dict, optional. Defaults to :meth:`PromptConfig.for_model`.
    max_doc_tokens : int
        Documents are truncated to this many tokens (of the document text itself) before prompting.
    device : None or ``"auto"`` (CUDA when there is one, else the CPU), ``"cpu"``, ``"cuda"``...
    """

    def __init__(self, model, tokenizer=None, prompt: PromptConfig | dict | None = None,
                 max_doc_tokens: int = ModelOptions.max_doc_tokens, device: str | None = None,
                 threads: int | None = None):
        check_values({"max_doc_tokens": max_doc_tokens, "threads": threads}, (MAX_DOC_TOKENS_RULE, THREADS_RULE),
                     {"max_doc_tokens": "model.max_doc_tokens"})  # before the model loads
        self.device = resolve_device(device)
        self.threads = threads  # torch threads P is scored with on a CPU (scoring_threads); None: one per core
        saved = None
        if isinstance(model, str):
            self.name = model
            path = resolve_model(model)
            self.weights = model_digest(model)  # its identity: the digest of its files
            saved = saved_generator(path)
            cfg = pretrained_config(path, model)
            cls = AutoModelForSeq2SeqLM if cfg.is_encoder_decoder else AutoModelForCausalLM
            with quiet_loading():
                self.model = cls.from_pretrained(path)
            self.tokenizer = AutoTokenizer.from_pretrained(path)
        else:
            if tokenizer is None:
                raise ValueError("pass tokenizer= together with a model object")
            self.model, self.tokenizer = model, tokenizer
            self.name = getattr(model.config, "_name_or_path", "") or type(model).__name__
            self.weights = object_digest(model, tokenizer)  # its identity: the digest of its tensors
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
        self.tokens = TokenCache()  # token ids by text, and the stop ids and prompt lead, for this tokenizer and prompt
        self.kernels = ScoringKernels()  # compiled or eager scoring kernels, and which compiled ones failed here
        self.score_copy = None  # the weights cast to the scoring dtype (ScoringMixin._scoring_model)
        self._decoder = None  # the decode loop, built on first use (SamplingMixin.decoder)

    def scoring_threads(self) -> int | None:
        """The torch threads P is scored with: on a CPU ``threads``, else one per core (:func:`gdr.device.cpu_threads`,
        whatever an earlier stage of the process set: they decide a CPU P's last bits); None on a GPU."""
        return (int(self.threads) if self.threads else cpu_threads()) if self.device.type == "cpu" else None

    def describe(self) -> dict:
        """What identifies this scorer in a manifest: a model loaded by name by the digest of its files, never its
        path; a model object by the digest of its weights and vocabulary (:func:`object_digest`); the ids a prompt
        starts with where it has any (:meth:`prompt_lead`)."""
        lead = self.prompt_lead()
        return {"weights": self.weights, "family": "seq2seq" if self.is_seq2seq else "causal",
                "prompt": asdict(self.prompt), "max_doc_tokens": self.max_doc_tokens,
                **({"lead": lead} if lead else {})}

    def _pad(self, seqs: Sequence[Sequence[int]], left: bool = False, length: int | None = None
             ) -> dict[str, torch.Tensor]:
        """(B, L) ids and attention mask of ``seqs`` padded to the longest, or to ``length`` when longer."""
        L = max(max(len(s) for s in seqs), length or 0)
        ids = torch.full((len(seqs), L), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(seqs), L), dtype=torch.long)
        for r, s in enumerate(seqs):  # building the padded batch; the compute is batched
            if left:
                ids[r, L - len(s):] = torch.tensor(s)
                mask[r, L - len(s):] = 1
            else:
                ids[r, :len(s)] = torch.tensor(s)
                mask[r, :len(s)] = 1
        return {"input_ids": upload(ids, self.device), "attention_mask": upload(mask, self.device)}  # no host sync
