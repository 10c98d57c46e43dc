"""Check a command's composed config before any model or data is loaded.

Every command calls :func:`validate` right after composing its config, so a bad value fails in
milliseconds with one line that names the key, the value and the fix
(``sample.n_queries=-3: must be a positive integer (the number J of sampled queries)``) instead of a
traceback from numpy after the model has loaded. The rules are tables, ``key path -> check``; a rule
whose key is absent from a command's config is skipped, so one table serves every command that has
the section. ``gdr run`` checks its ``index:``, ``train:`` and ``evaluate:`` sections with the tables
of the stand-alone commands, under that prefix.

:func:`error_line` turns the errors a user can fix (this module's :class:`ConfigError`, Hydra's
composition and override-parse errors, bad data, missing files) into that one line for ``gdr``'s
``main``.
"""
from __future__ import annotations

import difflib
import numbers
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

from omegaconf import DictConfig, ListConfig, OmegaConf

__all__ = ["ConfigError", "validate", "check_settings", "check_arguments", "error_line", "exit_line"]

INDEXERS = ("gc", "hkmi", "bmi", "random", "atomic")


class ConfigError(ValueError):
    """A config value a command cannot run with; the message names the key, the value and the fix."""


# A check gets the value and the section its rule table is applied to (the whole config, or
# ``cfg.index`` for ``gdr run``'s index rules) and returns what is wrong, or None.
Check = Callable[[Any, DictConfig], "str | None"]


@dataclass(frozen=True)
class Rule:
    key: str            # dotted path inside the section; "*" matches every key of a mapping
    check: Check
    what: str = ""      # what the key means: the end of the message


# ---------------------------------------------------------------------------- checks

def _is_int(v) -> bool:
    return isinstance(v, numbers.Integral) and not isinstance(v, bool)  # numpy integers too (the Python API)


def _is_num(v) -> bool:
    return isinstance(v, numbers.Real) and not isinstance(v, bool)


def int_at_least(lo: int) -> Check:
    want = {1: "a positive integer", 0: "an integer >= 0"}.get(lo, f"an integer >= {lo}")
    return lambda v, sec: None if _is_int(v) and v >= lo else f"must be {want}"


POSITIVE = int_at_least(1)
NON_NEGATIVE = int_at_least(0)


def number(lo: float | None = None, hi: float | None = None, lo_open: bool = True, hi_open: bool = False) -> Check:
    """A number in the interval; ``None`` bounds are open-ended."""
    if hi is None:
        want = f"a number {'>' if lo_open else '>='} {lo:g}" if lo is not None else "a number"
    else:
        want = f"a number in {'(' if lo_open else '['}{lo:g}, {hi:g}{')' if hi_open else ']'}"

    def check(v, sec):
        ok = _is_num(v) and v == v  # NaN fails every comparison
        ok = ok and (lo is None or (v > lo if lo_open else v >= lo))
        ok = ok and (hi is None or (v < hi if hi_open else v <= hi))
        return None if ok else f"must be {want}"

    return check


def optional(check: Check) -> Check:
    """``null`` is fine too."""
    def inner(v, sec):
        problem = None if v is None else check(v, sec)
        return problem and problem.replace("must be", "must be null or", 1)

    return inner


def one_of(*choices: str) -> Check:
    def check(v, sec):
        if isinstance(v, str) and v in choices:
            return None
        close = difflib.get_close_matches(str(v), choices, n=1)
        return f"must be one of {' | '.join(choices)}" + (f"; did you mean {close[0]}?" if close else "")

    return check


def boolean(v, sec):
    return None if isinstance(v, bool) else "must be true or false"


def seed(v, sec):
    return None if _is_int(v) and 0 <= v < 2**32 else "must be an integer in [0, 2^32)"


def auto_or(check: Check) -> Check:
    def inner(v, sec):
        problem = None if v == "auto" else check(v, sec)
        return problem and problem.replace("must be", "must be auto or", 1)

    return inner


def device(*fixed: str | None) -> Check:
    """``fixed`` names (auto, cpu, null), ``cuda`` or ``cuda:N``; CUDA must be there when asked for."""
    def check(v, sec):
        if v is None and None in fixed or v in fixed:
            return None
        if isinstance(v, str) and re.fullmatch(r"cuda(:\d+)?", v):
            import torch

            if not torch.cuda.is_available():
                return "CUDA is not available on this machine; use cpu" + (" or auto" if "auto" in fixed else "")
            n = int(v.split(":")[1]) if ":" in v else 0
            if n >= torch.cuda.device_count():
                return f"this machine has {torch.cuda.device_count()} CUDA device(s)"
            return None
        names = ["null" if f is None else f for f in fixed] + ["cuda", "cuda:N"]
        return f"must be one of {' | '.join(names)}"

    return check


ACCELERATORS = ("auto", "cpu", "gpu", "cuda")


def accelerator(v, sec):
    """Lightning's ``accelerator``: a GPU one only where CUDA is (else Lightning fails after the model loads)."""
    if not isinstance(v, str) or v not in ACCELERATORS:
        return one_of(*ACCELERATORS)(v, sec)
    if v in ("gpu", "cuda"):
        import torch

        if not torch.cuda.is_available():
            return "CUDA is not available on this machine; use cpu or auto"
    return None


# Lightning 2's precision names (the legacy short forms too)
PRECISIONS = ("bf16-mixed", "32-true", "16-mixed", "bf16-true", "16-true", "64-true", "bf16", "16", "32", "64")


def precision(v, sec):
    """``trainer.precision``: null or auto (bf16-mixed on CUDA, 32-true on the CPU) or a Lightning name."""
    if v is None or v == "auto" or str(v) in PRECISIONS:
        return None
    return "must be null, auto or one of " + " | ".join(PRECISIONS[:6])


def fused(v, sec):
    """``optim.fused``: auto, true or false; true cannot be clipped under 16-mixed's gradient scaler."""
    if v != "auto" and not isinstance(v, bool):
        return "must be auto, true or false"
    scaled = str(_get(sec, "trainer.precision")) in ("16-mixed", "16")
    if v is True and scaled and _get(sec, "trainer.gradient_clip_val"):
        return ("cannot be true with trainer.precision=16-mixed and gradient clipping (a fused AdamW unscales "
                "float16 gradients itself); use false, bf16-mixed or trainer.gradient_clip_val=null")
    return None


def trainer_devices_at(trainer: str) -> Check:
    """Lightning's ``devices`` of the trainer section ``trainer``: auto, -1 (all), a positive count or a list
    of device indices; no more CUDA devices than the machine has when the accelerator is (or becomes) cuda."""
    def check(v, sec):
        if v == "auto" or v == -1:
            return None
        if isinstance(v, (list, ListConfig)) and v and all(_is_int(i) and i >= 0 for i in v):
            n = max(v) + 1
        elif _is_int(v) and v > 0:
            n = v
        else:
            return "must be auto, -1 (all), a positive integer or a list of device indices"
        acc = _get(sec, f"{trainer}.accelerator", "auto")
        if acc in ("gpu", "cuda", "auto") and n > 1 or acc in ("gpu", "cuda"):
            import torch

            have = torch.cuda.device_count() if torch.cuda.is_available() else 0
            if have and n > have:
                return f"this machine has {have} CUDA device(s)"
        return None  # no CUDA: accelerator=gpu is refused by its own rule; auto runs n CPU processes

    return check


def _path_problem(v, kind: str) -> str | None:
    if not isinstance(v, str) or not v:
        return f"must be the path of a {kind}"
    p = Path(v).expanduser()
    if not p.exists():
        return f"no such {kind}"
    if kind == "file" and p.is_dir():
        return "is a folder, not a file"
    if kind == "folder" and not p.is_dir():
        return "is a file, not a folder"
    return None


def existing(kind: str = "file or folder") -> Check:
    return lambda v, sec: _path_problem(v, kind)


def folder_with(*names: str, made_by: str) -> Check:
    """A folder holding every one of ``names`` (the outputs of ``made_by``)."""
    def check(v, sec):
        problem = _path_problem(v, "folder")
        if problem:
            return problem
        lacking = [n for n in names if not (Path(v).expanduser() / n).exists()]
        return f"has no {lacking[0]}: not the output folder of {made_by}" if lacking else None

    return check


def folder_with_queries(v, sec):
    """A ``gdr score`` folder, or a ``gdr run`` folder with one score stage (:func:`gdr.store.score_folder`)."""
    problem = _path_problem(v, "folder")
    if problem:
        return problem
    p = Path(v).expanduser()
    if (p / "queries.jsonl").is_file() or len(list(p.glob("score-*/queries.jsonl"))) == 1:
        return None
    return "has no queries.jsonl (nor one score-*/ stage): not the output folder of `gdr score` or `gdr run`"


def train_run(v, sec):
    problem = _path_problem(v, "folder")
    if problem:
        return problem
    p = Path(v).expanduser()
    if not ((p / "model" / "retriever.json").exists() or (p / "retriever.json").exists()):
        return "has no model/retriever.json: not the out_dir of a finished `gdr train`"
    return None


def corpus_name(v, sec):
    from gdr.data import CORPORA

    if not isinstance(v, str) or not v:
        return f"must be a corpus name ({', '.join(CORPORA)}), a BEIR folder or a .jsonl / .tsv file of documents"
    from gdr.data.files import DOC_FORMATS, file_format

    if v in CORPORA:
        if v == "beir" and not _get(sec, "data.path"):
            return "needs data.path=<BEIR folder> (or data.name=<BEIR folder>)"
        if v in DOC_FORMATS and not _get(sec, "data.path"):
            return f"needs data.path=<a .{v} file of documents>"
        return None
    p = Path(v).expanduser()
    if (p / "corpus.jsonl").is_file():
        return None
    if p.is_file():
        if file_format(p):
            return None
        return ("is a file, but not a .jsonl or .tsv file of documents (data=jsonl|tsv data.path=<file>); "
                "a BEIR folder is a folder")
    if p.exists():
        return "this folder has no corpus.jsonl: a BEIR folder needs corpus.jsonl, queries.jsonl and qrels/"
    close = difflib.get_close_matches(v, CORPORA, n=1)
    return (f"unknown corpus; choose one of {', '.join(CORPORA)} or give the path of a BEIR folder or of a .jsonl / "
            ".tsv file of documents"
            + (f"; did you mean {close[0]}?" if close else ""))


def field_name(v, sec):
    return None if isinstance(v, str) and v.strip() else "must be a field name (a non-empty string)"


def qrels_of_queries(v, sec):
    if v is None:
        return ("is needed with data.queries: the judgements of those queries (<split>.tsv, or a folder of them)"
                if _get(sec, "data.queries") else None)
    problem = _path_problem(v, "file or folder")
    if problem:
        return problem
    if not _get(sec, "data.queries"):
        return "needs data.queries=<file of the queries it judges>"
    return None


_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")


def model_name(v, sec):
    from gdr.models import BUNDLED

    if isinstance(v, str) and (v in BUNDLED or Path(v).expanduser().exists()):
        return None
    if isinstance(v, str) and v.startswith(("/", ".", "~")):
        return "no such folder"
    if isinstance(v, str) and _HUB_ID.fullmatch(v):
        return None  # a hub id: resolved when the model loads (needs the hub or its cache)
    close = difflib.get_close_matches(str(v), BUNDLED, n=1)
    return (f"unknown model; use a bundled one ({', '.join(BUNDLED)}), a local folder or a hub id org/name"
            + (f"; did you mean {close[0]}?" if close else ""))


def preset(v, sec):
    presets = _get(sec, "model_presets")
    names = list(presets) if isinstance(presets, DictConfig) else []
    return None if isinstance(v, str) and v in names else f"must be a preset: one of {' | '.join(names)}"


def leaf_size(v, sec):
    """indexing.tree.build_tree: 1 <= c <= K, since a leaf's documents take positions 0..c-1 < K."""
    k = _get(sec, "n_clusters")
    if not _is_int(v) or v < 1:
        return "must be a positive integer"
    if _is_int(k) and v > k:
        return f"must be <= n_clusters={k}: a leaf's documents take positions 0..c-1, which must be < K"
    return None


def k_within_beam(v, sec):
    beam = _get(sec, "beam")
    if not _is_int(v) or v < 1:
        return "must be a positive integer"
    return f"must be <= beam={beam}: beam search returns at most beam docids" if _is_int(beam) and v > beam else None


def index_inputs(v, sec):
    """What each ``gdr index`` method needs besides its settings (checked in index_main too, but after imports)."""
    problem = one_of(*INDEXERS)(v, sec)
    if problem:
        return problem
    km = _get(sec, "kmeans") or {}
    if v == "gc" and not sec.get("run"):
        return "needs run=<P-matrix run folder of `gdr score`>"
    if v == "bmi" and not km.get("doc_queries"):
        return "needs kmeans.doc_queries=<jsonl of {doc_id, queries} from `gdr sample sample.per_doc=N`>"
    if v == "hkmi" and not (sec.get("data") or km.get("docs")):
        return "needs the document texts: data=<corpus> or kmeans.docs=<jsonl>"
    if v in ("random", "atomic") and not (sec.get("run") or sec.get("data") or km.get("docs")
                                          or km.get("doc_queries")):
        return "needs the doc ids: run=<P-matrix run>, data=<corpus>, kmeans.docs=... or kmeans.doc_queries=..."
    return None


def indexers(v, sec):
    if not isinstance(v, (list, ListConfig)) or not v:
        return f"must be a non-empty list of indexers, e.g. [{', '.join(INDEXERS)}]"
    for name in v:
        if name not in INDEXERS:
            return f"unknown indexer {name!r}; choose from {' | '.join(INDEXERS)}"
    dup = next((n for i, n in enumerate(v) if n in list(v)[:i]), None)
    return f"{dup!r} is listed twice" if dup is not None else None


def seeds(v, sec):
    ok = isinstance(v, (list, ListConfig)) and len(v) > 0 and all(seed(s, sec) is None for s in v)
    if ok and len(set(v)) < len(v):
        return "lists a seed twice"
    return None if ok else "must be a non-empty list of integers in [0, 2^32), e.g. [0, 1, 2]"


def per_doc_for_bmi(v, sec):
    if not _is_int(v) or v < 0:
        return "must be an integer >= 0"
    if v == 0 and "bmi" in list(_get(sec, "indexers") or []):
        return "the bmi indexer needs generated queries: set doc_queries.per_doc >= 1 or drop bmi from indexers"
    return None


def min_steps(v, sec):
    """``trainer.min_steps``: no more than ``trainer.max_steps`` (Lightning would stop at max_steps, silently)."""
    problem = NON_NEGATIVE(v, sec)
    most = _get(sec, "trainer.max_steps")
    if problem is None and _is_int(most) and most > 0 and v > most:
        return f"must be <= trainer.max_steps={most}: training stops there; lower it or raise trainer.max_steps"
    return problem


def other_than(key: str) -> Check:
    def check(v, sec):
        if not isinstance(v, str) or not v:
            return "must be a split name"
        return f"must differ from {key}={_get(sec, key)} (never test on what was trained on)" \
            if v == _get(sec, key) else None

    return check


def string_list(*choices: str) -> Check:
    def check(v, sec):
        want = f"must be a list drawn from {', '.join(choices)}"
        if not isinstance(v, (list, ListConfig)):
            return want
        bad = [x for x in v if x not in choices]
        return f"{want} ({bad[0]!r} is not)" if bad else None

    return check


def fractions(v, sec):
    """Train/dev/test shares of a query split (titles): three numbers >= 0 that sum to 1."""
    vals = list(v) if isinstance(v, (list, ListConfig)) else None
    if vals is None or len(vals) != 3 or not all(_is_num(x) and x >= 0 for x in vals):
        return "must be three numbers >= 0 for train/dev/test, e.g. [0.8, 0.1, 0.1]"
    total = float(sum(vals))
    if abs(total - 1.0) > 1e-6:
        return f"must sum to 1 (these sum to {total:g}), e.g. [0.8, 0.1, 0.1]"
    return None


def non_empty_list(v, sec):
    return None if isinstance(v, (list, ListConfig)) and len(v) > 0 else "must be a non-empty list"


# ---------------------------------------------------------------------------- tables

OPT_POSITIVE = optional(POSITIVE)
FILE = optional(existing("file"))

DATA = (
    Rule("data.name", corpus_name, "the corpus"),
    Rule("data.path", optional(existing()), "the corpus's data folder; null = the default location"),
    Rule("data.docs_tsv", FILE, "the document TSV of msmarco-lite / nq320k"),
    Rule("data.n_docs", OPT_POSITIVE, "documents kept; null = all"),
    Rule("data.seed", seed),
    Rule("data.on_empty", optional(one_of("error", "drop", "keep", "title")), "what an empty document does"),
    Rule("data.drop_title", boolean),
    Rule("data.id_field", field_name, "the id field of a file of documents; auto = _id, id or doc_id"),
    Rule("data.text_field", field_name, "the text field of a file of documents"),
    Rule("data.title_field", optional(field_name), "the title field of a file of documents"),
    Rule("data.label_field", optional(field_name), "the label field of a file of documents"),
    Rule("data.queries", optional(existing("file")), "a file of queries (.jsonl or .tsv) for data=jsonl|tsv"),
    Rule("data.qrels", qrels_of_queries, "judgements (<split>.tsv, or a folder of them) for data.queries"),
)
LM = (
    Rule("model.name", model_name, "the query generator"),
    Rule("model.max_doc_tokens", POSITIVE, "document tokens in the prompt"),
    Rule("device", device("auto", "cpu")),
    Rule("threads", OPT_POSITIVE, "torch CPU threads; null = torch's default"),
    Rule("progress", boolean),
)
SAMPLE = (
    Rule("sample.n_queries", POSITIVE, "the number J of sampled queries"),
    Rule("sample.per_doc", NON_NEGATIVE, "queries generated for every document; 0 = off"),
    Rule("sample.seed", seed),
    Rule("sample.batch_size", auto_or(POSITIVE),
         "queries per decode batch (changes speed, not the queries); auto = fits the GPU / fastest on a CPU"),
    Rule("sample.max_new_tokens", POSITIVE, "tokens per sampled query"),
    Rule("sample.compile", auto_or(boolean), "compile the decode step; auto = on CUDA for large work"),
    Rule("sample.compile_min_queries", auto_or(POSITIVE), "sample.compile=auto compiles from this many queries"),
    Rule("sample.top_k", NON_NEGATIVE, "top-k sampling; 0 = off"),
    Rule("sample.top_p", number(0, 1), "nucleus sampling mass; 1 = off"),
    Rule("sample.temperature", number(0), "sampling temperature"),
)
SCORE = (
    Rule("score.dtype", one_of("float32", "float16"), "storage of P.npy"),
    Rule("score.compute_dtype", one_of("auto", "bfloat16", "float32"),
         "the dtype scoring runs in; auto = bf16 on CUDA, the model's fp32 on a CPU"),
    Rule("score.shard_size", POSITIVE, "documents per resumable shard"),
    Rule("score.doc_batch_size", auto_or(POSITIVE), "documents per forward pass"),
    Rule("score.max_query_tokens", auto_or(POSITIVE), "query tokens per packed chunk"),
    Rule("score.processes", POSITIVE, "scoring processes on this machine"),
)
SCORE_COMMAND = (
    Rule("queries_from", optional(folder_with_queries),
         "a run whose queries are scored instead of sampled; null = sample"),
)
GC_VARIANT = (  # cluster.gc and every cluster.variants.<name> (keys set on top of cluster.gc)
    Rule("alpha", auto_or(number(0)), "GC's regularisation; the paper uses 0.25; auto = by effective sample size"),
    Rule("ess_target", number(0, 1, hi_open=True), "alpha=auto's mean ESS as a fraction of J"),
    Rule("clip_sigma", optional(number(0)), "clipping at mu + n sigma; null = none"),
    Rule("phi", one_of("power", "naive"), "the proposal phi"),
)
CLUSTER = (
    Rule("cluster.n_clusters", optional(int_at_least(2)), "the number K of clusters; null = the corpus's labels"),
    Rule("cluster.seed", seed),
    Rule("cluster.n_init", POSITIVE, "runs per fit"),
    Rule("cluster.repeats", NON_NEGATIVE, "repeats of best-of-n_init"),
    Rule("cluster.init", one_of("greedy-k-means++", "random", "k-means++")),
    Rule("cluster.max_iter", POSITIVE),
    Rule("cluster.tol", number(0, lo_open=False)),
    Rule("cluster.restrict_labels", optional(non_empty_list), "the labels evaluated; null = all"),
    *(Rule(f"cluster.{sec}.{r.key}", r.check, r.what) for sec in ("gc", "variants.*") for r in GC_VARIANT),
    Rule("cluster.baselines", string_list("tfidf", "embedding", "logp"), "k-means baselines"),
    Rule("cluster.describe_top", NON_NEGATIVE),
)
def qg_pairs(v, sec):
    if v in ("titles", "queries"):
        return None
    if isinstance(v, str) and v.endswith(".jsonl"):
        return _path_problem(v, "file")
    return "must be titles | queries | the path of a .jsonl of {doc or doc_id, query} pairs"


def corpus_list(v, sec):
    from gdr.data import CORPORA

    vals = list(v) if isinstance(v, (list, ListConfig)) else None
    if vals is None or any(x not in CORPORA for x in vals):
        return f"must be a list of corpus names ({', '.join(CORPORA)}), e.g. [r5]"
    return None


QG = (
    Rule("seed", seed),
    Rule("qg.pairs", qg_pairs, "where the training pairs come from"),
    Rule("qg.exclude", corpus_list, "corpora never trained on"),
    Rule("qg.max_pairs", OPT_POSITIVE, "pairs kept; null = all"),
    Rule("qg.dev_fraction", number(0, 1, lo_open=False, hi_open=True), "documents held out for the dev loss"),
    Rule("qg.dev_max", OPT_POSITIVE, "dev pairs at most"),
    Rule("qg.shots", NON_NEGATIVE, "prompt examples kept"),
    Rule("qg.lowercase", boolean),
    Rule("qg.train.train_layers", OPT_POSITIVE, "blocks trained; null = all"),
    Rule("qg.train.lr", number(0), "AdamW learning rate"),
    Rule("qg.train.weight_decay", number(0, lo_open=False)),
    Rule("qg.train.warmup_steps", NON_NEGATIVE),
    Rule("qg.train.batch_size", POSITIVE, "pairs per step"),
    Rule("qg.train.eval_batch_size", POSITIVE),
    Rule("qg.train.max_epochs", POSITIVE),
    Rule("qg.train.max_steps", int_at_least(-1), "-1 = by max_epochs"),
    Rule("qg.train.patience", NON_NEGATIVE),
    Rule("qg.train.resume", boolean),
    Rule("qg.train.accelerator", accelerator, "Lightning's accelerator; auto = cuda when available"),
    Rule("qg.train.devices", trainer_devices_at("qg.train"), "Lightning's devices"),
    Rule("queries.split", one_of("train"), "gdr qg trains on the train split only"),
)
# Indexer settings: `gdr index` at the root, `gdr run` under `index.` (conf/stage/index.yaml).
INDEX_STAGE = (
    Rule("seed", seed),
    Rule("n_clusters", int_at_least(2), "K, children per node"),
    Rule("leaf_size", leaf_size, "c, the most documents in a leaf"),
    Rule("workers", POSITIVE, "threads over the nodes of a level"),
    Rule("progress", boolean),
    Rule("plot", boolean),
    Rule("gc.n_queries", OPT_POSITIVE, "the first J columns of P; null = all"),
    Rule("gc.alpha", auto_or(number(0)), "GC's regularisation; the paper uses 0.25; auto = by effective sample size"),
    Rule("gc.ess_target", number(0, 1, hi_open=True), "alpha=auto's mean ESS as a fraction of J"),
    Rule("gc.clip_sigma", optional(number(0)), "clipping at mu + n sigma; null = none"),
    Rule("gc.proposal", one_of("power", "naive")),
    Rule("gc.localized", boolean),
    Rule("gc.bootstrap", boolean),
    Rule("gc.bootstrap_root", boolean),
    Rule("gc.init", one_of("greedy-k-means++", "random", "k-means++")),
    Rule("gc.split_merge", optional(boolean), "split/merge moves after each node's fit; null = on for greedy-k-means++"),
    Rule("gc.n_init", POSITIVE, "fits at the root"),
    Rule("gc.n_init_inner", POSITIVE, "fits at every other node"),
    Rule("gc.max_iter", POSITIVE),
    Rule("gc.tol", number(0, lo_open=False)),
    Rule("gc.dedupe", boolean),
    Rule("gc.device", device("cpu")),
    Rule("gc.memory_mb", number(0), "working-set budget of one node"),
    Rule("gc.chunk_rows", POSITIVE),
    Rule("gc.refine_max_iter", NON_NEGATIVE),
    Rule("gc.torch_threads", OPT_POSITIVE),
    Rule("gc.top_queries", NON_NEGATIVE),
    Rule("gc.centroid_json_depth", int_at_least(-1), "-1 = no centroids in tree.json"),
    Rule("kmeans.docs", FILE, "jsonl of {doc_id, text}"),
    Rule("kmeans.doc_queries", FILE, "jsonl of {doc_id, queries} from `gdr sample sample.per_doc=N`"),
    Rule("kmeans.batch_size", POSITIVE),
    Rule("kmeans.n_init", POSITIVE),
    Rule("kmeans.max_iter", POSITIVE),
    Rule("kmeans.spherical", boolean),
    Rule("atomic.warn_above", NON_NEGATIVE),
)
INDEX_COMMAND = (
    Rule("method", index_inputs, "the indexer"),
    Rule("run", optional(folder_with("P.npy", made_by="`gdr score`")), "the P-matrix run folder"),
    Rule("index", optional(folder_with("tree_state.npz", "docids.tsv", made_by="`gdr index method=gc`")),
         "the GC index to grow"),
)
# Retriever settings: `gdr train` at the root, `gdr run` under `train.` (conf/stage/train.yaml).
TRAIN_STAGE = (
    Rule("examples.use_real", boolean),
    Rule("examples.use_generated", boolean),
    Rule("examples.doc_first", boolean),
    Rule("examples.doc_windows", NON_NEGATIVE, "random windows per document"),
    Rule("examples.window", POSITIVE, "tokens per document window"),
    Rule("examples.max_doc_tokens", POSITIVE),
    Rule("examples.dev_fraction", number(0, 1, lo_open=False, hi_open=True), "queries held out for validation"),
    Rule("examples.dev_max", NON_NEGATIVE),
    Rule("examples.dev_min", NON_NEGATIVE, "dev queries filled up with held-out generated queries"),
    Rule("examples.dev_max_share", number(0, 1, lo_open=False), "the most generated queries held out for dev"),
    Rule("examples.generated_per_doc", OPT_POSITIVE, "generated queries used per document; null = all"),
    Rule("model.size", preset, "the retriever preset"),
    *(Rule(f"model.{k}", OPT_POSITIVE) for k in ("n_digits", "max_code_len", "d_model", "num_layers", "num_heads",
                                                 "d_ff", "d_kv", "pawa_rank", "max_query_len", "encoder_layers")),
    Rule("model.dropout", optional(number(0, 1, lo_open=False, hi_open=True))),
    Rule("model.pawa", optional(boolean)),
    Rule("optim.lr_encoder", number(0, lo_open=False), "0 freezes the encoder"),
    Rule("optim.lr_decoder", number(0)),
    Rule("optim.weight_decay", number(0, lo_open=False)),
    Rule("optim.warmup_steps", NON_NEGATIVE),
    Rule("optim.consistency_weight", number(0, lo_open=False), "0 = off"),
    Rule("optim.base_batch_size", POSITIVE, "the batch size the learning rates are stated at"),
    Rule("optim.lr_scaling", one_of("sqrt", "linear", "none"), "how learning rates follow the batch size"),
    Rule("optim.fused", fused, "fused AdamW; auto = on CUDA"),
    Rule("trainer.precision", precision, "Lightning's precision; null/auto = bf16-mixed on CUDA, 32-true on the CPU"),
    Rule("trainer.max_epochs", POSITIVE),
    Rule("trainer.max_steps", lambda v, sec: None if v == -1 or (_is_int(v) and v > 0)
         else "must be -1 (no limit) or a positive integer"),
    Rule("trainer.batch_size", auto_or(POSITIVE), "auto = what fits on CUDA (<= 4096), 64 on the CPU"),
    Rule("trainer.eval_batch_size", POSITIVE),
    Rule("trainer.gradient_clip_val", optional(number(0, lo_open=False))),
    Rule("trainer.check_val_every_n_epoch", OPT_POSITIVE),
    Rule("trainer.val_check_interval", optional(number(0))),
    Rule("trainer.limit_val_batches", number(0)),
    Rule("trainer.patience", NON_NEGATIVE, "validations without improvement before stopping"),
    Rule("trainer.patience_steps", OPT_POSITIVE, "steps without improvement before stopping; null = `patience`"),
    Rule("trainer.min_steps", min_steps, "steps before any early stop"),
    Rule("trainer.monitor", one_of("val/recall@1", "val/mrr"), "the dev metric that picks the checkpoint"),
    Rule("trainer.val_beam", POSITIVE),
    Rule("trainer.length_penalty", number(), "the dev beam search's length penalty"),
    Rule("trainer.num_workers", NON_NEGATIVE),
    Rule("trainer.log_every_n_steps", POSITIVE),
    Rule("trainer.checkpoint_every_n_steps", OPT_POSITIVE),
    Rule("trainer.checkpoint_every_n_epochs", POSITIVE, "epochs between resume points"),
    Rule("trainer.num_sanity_val_steps", int_at_least(-1)),
    Rule("trainer.tensorboard", boolean),
    Rule("trainer.resume", boolean),
    Rule("trainer.resume_damaged", one_of("best", "fresh"), "a damaged last.ckpt: start from the best weights or over"),
    Rule("trainer.enable_progress_bar", boolean),
    Rule("trainer.accelerator", accelerator, "Lightning's accelerator; auto = cuda when available"),
    Rule("trainer.devices", trainer_devices_at("trainer"), "Lightning's devices"),
    Rule("trainer.compile", boolean),
    Rule("trainer.length_buckets", boolean, "batches grouped by input length"),
    Rule("concurrent", auto_or(POSITIVE), "retrievers trained at once on one device; auto = what fits, 1 on the CPU"),
)
TRAIN_COMMAND = (
    Rule("docids", existing("file"), "docids.tsv from `gdr index`"),
    Rule("queries.fractions", fractions, "titles only: the train/dev/test shares of the documents"),
    Rule("generated", FILE, "jsonl of {doc_id, queries} from `gdr sample`"),
    Rule("queries.path", optional(existing())),
    Rule("seed", seed),
)
# Search settings: `gdr evaluate`/`gdr search` at the root, `gdr run` under `evaluate.` (conf/stage/evaluate.yaml).
EVALUATE_STAGE = (
    Rule("beam", POSITIVE, "beam width"),
    Rule("k", k_within_beam, "results per query"),
    Rule("batch_size", auto_or(POSITIVE), "queries per beam search; auto = what fits on CUDA (<= 1024), 32 on the CPU"),
    Rule("length_penalty", number()),
    Rule("device", device(None, "cpu"), "null = cuda when available"),
    Rule("bm25", boolean),
)
EVALUATE_COMMAND = (
    Rule("run_dir", train_run),
    Rule("queries.fractions", fractions, "titles only: the train/dev/test shares of the documents"),
    Rule("queries.path", optional(existing())),
)
RUN = (
    Rule("indexers", indexers, "one docid index per name"),
    Rule("seeds", seeds, "one retriever per (indexer, seed)"),
    Rule("queries.path", optional(existing())),
    Rule("queries.train_split", lambda v, sec: None if isinstance(v, str) and v else "must be a split name"),
    Rule("queries.test_split", other_than("queries.train_split")),
    Rule("queries.fractions", fractions, "titles only: the train/dev/test shares of the documents"),
    Rule("doc_queries.per_doc", per_doc_for_bmi, "generated training queries per document"),
    Rule("doc_queries.seed", seed),
    Rule("doc_queries.batch_size", auto_or(POSITIVE), "queries per decode batch; auto = as sample.batch_size"),
    Rule("doc_queries.max_new_tokens", POSITIVE),
    Rule("doc_queries.top_k", NON_NEGATIVE, "top-k sampling of the training queries; 0 = off"),
    Rule("doc_queries.top_p", number(0, 1), "nucleus mass of the training queries; 1 = off"),
    Rule("doc_queries.temperature", number(0), "sampling temperature of the training queries"),
    Rule("cluster.enabled", boolean),
    Rule("bm25", boolean),
    Rule("plot", boolean),
)

# command -> [(section prefix, rules)]
TABLES: dict[str, list[tuple[str, tuple[Rule, ...]]]] = {
    "sample": [("", DATA + LM + SAMPLE)],
    "score": [("", DATA + LM + SAMPLE + SCORE + SCORE_COMMAND)],
    "cluster": [("", DATA + LM + SAMPLE + SCORE + SCORE_COMMAND + CLUSTER)],
    "index": [("", INDEX_COMMAND + INDEX_STAGE + DATA)],
    "train": [("", DATA + TRAIN_COMMAND + TRAIN_STAGE)],
    "evaluate": [("", DATA + EVALUATE_COMMAND + EVALUATE_STAGE)],
    # `gdr search` returns k=10 unless k= is given, so the config's k need not fit a smaller beam=
    "search": [("", EVALUATE_COMMAND + tuple(r for r in EVALUATE_STAGE if r.key != "k") + (Rule("k", POSITIVE),))],
    "qg": [("", DATA + LM + QG)],
    "run": [("", DATA + LM + SAMPLE + SCORE + CLUSTER + RUN), ("index", INDEX_STAGE), ("train", TRAIN_STAGE),
            ("evaluate", EVALUATE_STAGE)],
}
# ---------------------------------------------------------------------------- the Python API
# The settings dataclasses (gdr.stages.settings) and the keyword arguments of the gdr.* functions are checked
# with the rules above: each field or argument is the key of a rule there, so every entry point shares one table.
SETTINGS: dict[str, tuple[str, tuple[Rule, ...], dict[str, str]]] = {
    # class: (the config section holding its fields, the rules, fields kept at another key of the config)
    "LMSettings": ("", LM, {"name": "model.name", "max_doc_tokens": "model.max_doc_tokens", "prompt": "model.prompt"}),
    "SampleSettings": ("sample", SAMPLE, {}),
    "ScoreSettings": ("score", SCORE, {}),
    "ClusterSettings": ("cluster", CLUSTER, {}),
    "IndexSettings": ("", INDEX_STAGE + (Rule("method", one_of(*INDEXERS), "the indexer"),), {}),
    "TrainSettings": ("", TRAIN_STAGE + (Rule("seed", seed),), {}),
    "EvaluateSettings": ("", EVALUATE_STAGE, {}),
}
# gdr.* functions' own arguments (those not in a settings class): (the rules, argument -> the key of its rule)
ARGUMENTS: dict[str, tuple[tuple[Rule, ...], dict[str, str]]] = {
    "load_corpus": (DATA, {"n_docs": "data.n_docs", "seed": "data.seed"}),
    "load_title_queries": (TRAIN_COMMAND, {"seed": "seed", "fractions": "queries.fractions"}),
    "split_queries": (TRAIN_COMMAND, {"seed": "seed", "fractions": "queries.fractions"}),
    "bm25": (TABLES["search"][0][1], {"k": "k"}),
    "evaluate_clusters": (LM, {"device": "device"}),
    "GenerativeLM": (LM, {"max_doc_tokens": "model.max_doc_tokens"}),
}


def check_settings(settings: Any, shown: str = "") -> None:
    """Raise :class:`ConfigError` for the first field of a settings dataclass (``SampleSettings`` ...) that its
    command would refuse, naming the field (``temperature=-1.0: must be a number > 0 (sampling temperature)``);
    ``shown`` is put before the name (``sampling.``)."""
    from dataclasses import fields

    nest, rules, keys = SETTINGS[type(settings).__name__]
    _check_values({f.name: getattr(settings, f.name) for f in fields(settings)}, rules, keys, nest, shown)


def check_arguments(function: str, **values: Any) -> None:
    """Raise :class:`ConfigError` for the first keyword argument of ``gdr.<function>`` out of its range."""
    rules, keys = ARGUMENTS[function]
    _check_values(values, rules, keys)


def _check_values(values: dict[str, Any], rules: Sequence[Rule], keys: dict[str, str], nest: str = "",
                  shown: str = "") -> None:
    tree: dict = {}
    names: dict[str, str] = {}  # config key -> the argument's name
    for name, value in values.items():
        key = keys.get(name) or (f"{nest}.{name}" if nest else name)
        names[key] = name
        *parents, leaf = key.split(".")
        node = tree
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    cfg = OmegaConf.create(tree, flags={"allow_objects": True})
    for rule in rules:
        for key, value in _matches(cfg, rule.key.split(".")):
            problem = rule.check(value, cfg)
            if problem:
                top = max((k for k in names if key == k or key.startswith(k + ".")), key=len)
                name = names[top] + key[len(top):]
                raise ConfigError(f"{shown}{name}={_show(value)}: {problem}" + (f" ({rule.what})" if rule.what else ""))


HINTS = {  # what to set for a mandatory (???) key
    "docids": "docids.tsv from `gdr index`",
    "run_dir": "the out_dir of `gdr train`",
    "data.path": "the corpus: a BEIR folder (corpus.jsonl, queries.jsonl, qrels/) or a .jsonl / .tsv file of documents",
}


# ---------------------------------------------------------------------------- driver


def _get(node, path: str, default=None):
    """``node.a.b`` for ``path="a.b"``; ``default`` when a key on the way is absent or not a section."""
    for part in path.split("."):
        if not isinstance(node, DictConfig) or part not in node:
            return default
        node = node[part]
    return node


def _show(v) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return str(v).lower()
    if isinstance(v, (DictConfig, ListConfig)):
        v = OmegaConf.to_container(v)
    if isinstance(v, (list, dict)):
        return str(v).replace("'", "")
    return str(v) if str(v) else "''"


def _matches(node, parts: list[str], done: tuple[str, ...] = ()) -> Iterator[tuple[str, Any]]:
    """(dotted key, value) for every key of ``node`` matching ``parts``; absent keys match nothing."""
    if not parts:
        yield ".".join(done), node
        return
    if node is None:  # an unused optional section, e.g. `data: null` of `gdr index`
        return
    if not isinstance(node, DictConfig):
        where = ".".join(done)
        raise ConfigError(f"{where}={_show(node)}: must be a section of keys, such as {where}.{parts[0]}")
    keys = [str(k) for k in node.keys()] if parts[0] == "*" else [parts[0]] if parts[0] in node else []
    for key in keys:
        yield from _matches(node[key], parts[1:], done + (key,))


def _missing(node, done: str = "") -> Iterator[str]:
    """Dotted keys whose value is Hydra's mandatory ``???``, depth first."""
    if isinstance(node, DictConfig):
        items = [(k, f"{done}{k}") for k in node.keys()]
    else:
        items = [(i, f"{done.rstrip('.')}[{i}]") for i in range(len(node))]
    for key, path in items:
        if OmegaConf.is_missing(node, key):
            yield path
        elif not OmegaConf.is_interpolation(node, key):
            child = node[key]
            if isinstance(child, (DictConfig, ListConfig)):
                yield from _missing(child, f"{path}.")


def validate(command: str, cfg: DictConfig) -> None:
    """Raise :class:`ConfigError` for the first value of ``cfg`` that ``gdr <command>`` cannot run with.

    Cheap: reads the config and stats a few paths; imports torch only when a CUDA device is asked for.
    """
    if command not in TABLES:
        raise KeyError(f"no validation rules for command {command!r}; known: {', '.join(TABLES)}")
    if not isinstance(cfg, DictConfig):
        cfg = OmegaConf.create(cfg)
    for key in _missing(cfg):
        what = HINTS.get(key)
        raise ConfigError(f"{key}=???: missing mandatory value; set {key}=<value>" + (f" ({what})" if what else ""))
    for prefix, rules in TABLES[command]:
        sec = _get(cfg, prefix) if prefix else cfg
        if not isinstance(sec, DictConfig):
            if prefix in cfg:
                raise ConfigError(f"{prefix}={_show(sec)}: must be a section of keys")
            continue
        for rule in rules:
            for key, value in _matches(sec, rule.key.split(".")):
                problem = rule.check(value, sec)
                if problem:
                    full = f"{prefix}.{key}" if prefix else key
                    raise ConfigError(f"{full}={_show(value)}: {problem}" + (f" ({rule.what})" if rule.what else ""))


# ---------------------------------------------------------------------------- one-line errors

def _first_line(text: str) -> str:
    return next((line.strip() for line in text.splitlines() if line.strip()), "")


def _hydra_line(exc: BaseException) -> str:
    """Hydra's multi-line composition / override-parse messages, condensed to one line."""
    from omegaconf.errors import ConfigKeyError

    text, cause = str(exc), exc.__cause__
    m = re.match(r"Could not override '([^']+)'", text)
    if m and isinstance(cause, (ConfigKeyError, AttributeError)) and "not in struct" in str(cause):
        unknown = getattr(cause, "full_key", None) or m.group(1)  # `sampl` of sampl.n_queries=3
        msg = f"unknown key {unknown}" + (f" in {m.group(1)}" if unknown != m.group(1) else "")
        parent, leaf = getattr(cause, "parent_node", None), unknown.rpartition(".")
        if isinstance(parent, DictConfig):
            close = difflib.get_close_matches(leaf[2], [str(k) for k in parent.keys() if k != "hydra"], n=1)
            if close:
                msg += f"; did you mean {leaf[0] + '.' if leaf[0] else ''}{close[0]}?"
        plus = re.search(r"use (\+\S+)", text)
        return msg + (f" (a new key needs a leading +: {plus.group(1)})" if plus else "")
    parts: list[str] = []
    listing = False  # inside "Available options in 'data':" and its one-per-line names
    for raw in text.splitlines():
        line = raw.strip()
        if line.startswith(("Config search path", "See https://")):
            break
        if not line:
            listing = False
        elif listing:
            parts[-1] += (" " if parts[-1].endswith(":") else ", ") + line
        else:
            parts.append(line.rstrip("."))
            listing = line.endswith(":")
    return "; ".join(parts[:3])


def _with_override(line: str, argv: Sequence[str]) -> str:
    """Name the command-line argument a message quotes (`'[1'`, `'nope'`) when the message does not."""
    for quoted in re.findall(r"'([^']+)'", line):
        arg = next((a for a in argv if quoted in a), None)
        if arg is not None:
            return line if arg in line else f"{arg}: {line}"
    return line


def error_line(exc: BaseException, argv: Sequence[str] = ()) -> str | None:
    """The one-line message for an error the user can fix on the command line ``argv``, else None."""
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from gdr.data import DataError
    from gdr.guard import OutputError

    if isinstance(exc, HydraException):
        return _with_override(_hydra_line(exc) or type(exc).__name__, argv)
    if isinstance(exc, OmegaConfBaseException):
        line, key = _first_line(str(exc)) or type(exc).__name__, getattr(exc, "full_key", None)
        return f"{line} (key {key})" if key and key not in line else _with_override(line, argv)
    if isinstance(exc, (ConfigError, DataError, OutputError)):
        return _first_line(str(exc)) or type(exc).__name__
    if isinstance(exc, (ValueError, FileNotFoundError, FileExistsError)):
        line = _first_line(str(exc)) or type(exc).__name__
        return f"{line} (--debug shows the traceback)"
    return None


def exit_line(code: object, command: str) -> str:
    """A ``SystemExit("...")`` message without a repeated ``gdr <command>:`` prefix."""
    line = _first_line(str(code))
    for prefix in (f"gdr {command}: error: ", f"gdr {command}: ", "gdr: "):
        if line.startswith(prefix):
            return line[len(prefix):]
    return line
