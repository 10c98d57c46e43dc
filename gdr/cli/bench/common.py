"""What several benchmarks share (a benchmark module imports no other): the models and texts of the
scoring and sampling benchmarks, random docids, the retriever presets."""
from __future__ import annotations

import numpy as np
import torch

__all__ = ["build_lm", "bench_texts", "random_codes", "preset_config", "T5_BASE"]


T5_BASE = dict(d_model=768, d_ff=3072, d_kv=64, num_layers=12, num_decoder_layers=12, num_heads=12,
               vocab_size=32128, feed_forward_proj="relu", tie_word_embeddings=True)


def build_lm(name: str, doc_tokens: int, device: str, tokenizer: str | None = None):
    from gdr.lm import GenerativeLM, PromptConfig

    if name.endswith("-random"):
        # Random-init architectures (no weights needed): tokenizer from the bundled MiniLM model.
        from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM, T5Config, T5ForConditionalGeneration

        from gdr.models import resolve_model

        tok = AutoTokenizer.from_pretrained(tokenizer or resolve_model("minilm-l6"))
        tok.eos_token = tok.sep_token
        torch.manual_seed(0)
        if name == "t5-base-random":
            cfg = T5Config(**{**T5_BASE, "vocab_size": len(tok)}, pad_token_id=tok.pad_token_id,
                           decoder_start_token_id=tok.pad_token_id, eos_token_id=tok.sep_token_id)
            model = T5ForConditionalGeneration(cfg)
            prompt = PromptConfig(style="prefix", prefix="text2query: ", system=None, shots=[])
        elif name == "smollm2-135m-random":
            cfg = LlamaConfig(vocab_size=len(tok), hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                              num_attention_heads=9, num_key_value_heads=3, tie_word_embeddings=True)
            model = LlamaForCausalLM(cfg)
            prompt = PromptConfig(style="prefix", prefix="Document: ", system=None, shots=[])
        else:
            raise SystemExit(f"unknown random architecture {name!r}; use t5-base-random or smollm2-135m-random")
        return GenerativeLM(model, tok, prompt=prompt, max_doc_tokens=doc_tokens, device=device)
    return GenerativeLM(name, max_doc_tokens=doc_tokens, device=device)


def bench_texts(n: int, seed: int, docs_file: str | None = None) -> list[str]:
    if docs_file:  # one document per line (for machines without ../shared/data)
        with open(docs_file, encoding="utf-8") as f:
            lines = [ln.strip() for ln in f if ln.strip()]
        return (lines * (n // max(len(lines), 1) + 1))[:n]
    from gdr.data import load_corpus

    return load_corpus("r5").sample(n, seed=seed).model_inputs()


def random_codes(n: int, K: int, depth: int, seed: int) -> list[tuple[int, ...]]:
    """``n`` distinct random codes of ``depth`` digits in [0, K)."""
    rng = np.random.default_rng(seed)
    flat = rng.choice(K ** depth, size=n, replace=False)
    digits = (flat[:, None] // K ** np.arange(depth - 1, -1, -1)[None, :]) % K  # (n, depth)
    return [tuple(int(x) for x in row) for row in digits]


def preset_config(name: str, K: int, depth: int):
    """``RetrieverConfig`` of a preset of ``conf/stage/train.yaml`` (read with PyYAML: no Hydra needed)."""
    import yaml

    from gdr.config import conf_dir
    from training.model import RetrieverConfig

    presets = yaml.safe_load((conf_dir() / "stage" / "train.yaml").read_text())["model_presets"]
    if name not in presets:
        raise SystemExit(f"gdr bench training: unknown preset {name!r}; choose from {', '.join(presets)}")
    return RetrieverConfig.from_dict({**presets[name], "n_digits": K, "max_code_len": depth})
