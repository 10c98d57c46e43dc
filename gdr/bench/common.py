"""What several benchmarks share (a benchmark module imports no other): the models and texts of the
scoring and sampling benchmarks, random docids, the retriever presets, the time bounds (``--seconds``,
``--deadline``, partial JSON lines) and the torch.profiler tables."""
from __future__ import annotations

import json
import logging
import time
from functools import cache
from pathlib import Path
from typing import Callable

import numpy as np
import torch
import yaml
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM, T5Config, T5ForConditionalGeneration

from gdr import cost
from gdr.config import conf_dir
from gdr.data import load_corpus
from gdr.lm import GenerativeLM, PromptConfig
from gdr.models import resolve_model
from gdr.rules import number, option_type
from gdr.training.model import RetrieverConfig

__all__ = ["build_lm", "bench_texts", "check_docid_space", "random_codes", "preset_config", "T5_BASE",
           "profile_table", "profile_failed", "start_profiler", "write_table", "add_time_args", "seconds_left",
           "emit", "profile_skipped", "cpu_peaks", "roofline", "parse_bench_args", "timed_batches", "maybe_profile",
           "SavedBytes"]


T5_BASE = dict(d_model=768, d_ff=3072, d_kv=64, num_layers=12, num_decoder_layers=12, num_heads=12,
               vocab_size=32128, feed_forward_proj="relu", tie_word_embeddings=True)


# ---------------------------------------------------------------------------- memory
class SavedBytes:
    """The bytes autograd saves for the backward pass inside the ``with`` block (each storage once, the module's
    parameters left out): the activations a training step holds at its peak, countable on any device, against which
    the batch rule's estimate (:func:`gdr.cost.train_memory_per_example`) is checked. Under autocast it includes the
    low-precision copies of the weights (2 bytes a parameter a step, not per example)."""

    def __init__(self, module: torch.nn.Module):
        self._params = {p.untyped_storage().data_ptr() for p in module.parameters()}
        self._seen: dict[int, int] = {}
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t)

    def _pack(self, t: torch.Tensor) -> torch.Tensor:
        ptr = t.untyped_storage().data_ptr()
        if ptr not in self._params:  # a saved tensor stays alive until the backward: no pointer is reused
            self._seen[ptr] = t.untyped_storage().nbytes()
        return t

    def __enter__(self) -> "SavedBytes":
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._hooks.__exit__(*exc)

    @property
    def total(self) -> int:
        return sum(self._seen.values())


# ---------------------------------------------------------------------------- peaks and the roofline
@cache
def cpu_peaks(max_n: int = 1024, copy_mib: int = 64, repeats: int = 5, min_call_s: float = 0.01) -> cost.DevicePeaks:
    """This CPU's peaks, measured once per process: the best of ``repeats`` timed square matmuls in fp32 and in
    bf16 (FLOP/s, the larger of the two) and of timed copies of ``copy_mib`` MiB (read + write bytes/s).
    The best, not the median: on a machine shared with other jobs the peak is what the chip did when it could.

    Each dtype's matmul is timed at the smallest size ``n`` (128, doubled up to ``max_n``) whose call takes
    ``min_call_s``: a dtype the chip runs fast reaches ``max_n``, one it emulates stays small. bf16 without AMX or
    AVX512-BF16 runs at ~1 GFLOP/s, 2.3 s a 1,024 x 1,024 call on an AVX2 core (fp32: 29 ms), so its six calls
    at 1,024 would add ~14 s to every CPU benchmark for a figure the max drops."""
    def best(fn) -> float:
        fn()  # warm-up
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        return min(times)

    def matmul_flops(dtype: torch.dtype) -> float:
        n = 128
        while True:
            a = torch.randn(n, n).to(dtype)
            torch.mm(a, a)  # the first call of a size pays its set-up
            t0 = time.perf_counter()
            torch.mm(a, a)
            if time.perf_counter() - t0 >= min_call_s or n >= max_n:
                return 2.0 * n ** 3 / best(lambda a=a: torch.mm(a, a))
            n *= 2

    flops = max(matmul_flops(dtype) for dtype in (torch.float32, torch.bfloat16))
    src = torch.ones(copy_mib * 2 ** 18)  # fp32: 4 bytes each
    dst = torch.empty_like(src)
    return cost.DevicePeaks("cpu", flops, 2.0 * src.numel() * 4 / best(lambda: dst.copy_(src)))


def roofline(flops_per_unit: float, bytes_per_unit: float, measured_per_s: float | None, device) -> dict:
    """:func:`gdr.cost.roofline` of one unit of a benchmark; on a CPU against its measured peaks."""
    cpu = None
    if torch.device(device).type == "cpu":
        try:
            cpu = cpu_peaks()
        except Exception as e:  # noqa: BLE001 - the figures still come back, the limit says why it is missing
            cpu = f"{type(e).__name__}: {e}"
    return cost.roofline(flops_per_unit, bytes_per_unit, measured_per_s, device, cpu=cpu)


# ---------------------------------------------------------------------------- time bounds
# A cold GPU spends most of a benchmark's time compiling and capturing, so every benchmark bounds its own time
# and prints what it has as soon as it has it: a JSON line (``"partial": true``) after the warm-up and after
# each timed round, the full line last. ``make bench-gpu`` reads the last JSON line of a step, also of a step
# it had to stop at its limit.

def add_time_args(ap) -> None:
    """``--seconds`` (the steady-state phase stops after this many timed seconds, at least one round) and
    ``--deadline`` (a Unix time: nothing optional, such as a profile or a reference, starts that would end
    after it, and the timed phase stops early enough to print its figures; `make bench-gpu` passes its step's
    time limit less a margin)."""
    ap.add_argument("--seconds", type=option_type(number(0, lo_open=False), float), default=None,
                    help="stop the timed phase after this many seconds (at least one round; default: no limit)")
    ap.add_argument("--deadline", type=option_type(number(0), float), default=None,
                    help="Unix time by which the benchmark prints its figures (make bench-gpu sets it)")


def parse_bench_args(ap, argv: list[str] | None, profile_help: str):
    """Add ``--profile`` and the time bounds to the benchmark's parser ``ap``, parse ``argv`` and set up logging."""
    ap.add_argument("--profile", default=None, help=profile_help)
    add_time_args(ap)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    return args


def timed_batches(run, starts, args, sync: Callable[[], None] = lambda: None) -> tuple[list, float, float]:
    """The timed phase: ``run(start)`` for each of ``starts`` until ``--seconds`` have been timed or the deadline
    comes near (at least one batch); returns (outputs, timed seconds, the longest batch's seconds)."""
    outs, total, longest = [], 0.0, 0.0
    starts = list(starts)
    for i, start in enumerate(starts):
        if outs and ((args.seconds is not None and total >= args.seconds) or seconds_left(args) < 2 * longest + 5):
            print(f"timed phase stopped after {i} of {len(starts)} batches (--seconds {args.seconds}, "
                  f"{seconds_left(args):.0f} s to the deadline)")
            break
        sync()
        t0 = time.perf_counter()
        outs.append(run(start))
        sync()
        t = time.perf_counter() - t0
        total, longest = total + t, max(longest, t)
    return outs, total, longest


def maybe_profile(args, fn: Callable[[], object], units: int, unit: str, device, title: str,
                  longest: float) -> dict | None:
    """With ``--profile``: the profile table of ``fn`` (``units`` units of work) when the deadline leaves time
    for it (three times the longest timed batch and 10 s), else a note that it was skipped; None without it."""
    if not args.profile:
        return None
    need = 3 * longest + 10
    if seconds_left(args) > need:
        return profile_table(fn, units, unit, device, args.profile, title=title)
    return profile_skipped(args.profile, title, seconds_left(args), need)


def seconds_left(args) -> float:
    """Seconds until ``args.deadline`` (infinite without one)."""
    deadline = getattr(args, "deadline", None)
    return float("inf") if deadline is None else deadline - time.time()


def emit(obj: dict) -> None:
    """Print one JSON line now (flushed: a step stopped at its limit keeps it)."""
    print(json.dumps(obj), flush=True)


def profile_skipped(path: str | Path, title: str, left: float, need: float) -> dict:
    """Write to ``path`` that the profile did not run (too little time left); a summary without figures."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    why = f"skipped: {left:.0f} s left before the deadline, about {need:.0f} s needed"
    p.write_text(f"# {title or 'profile'}: {why}\n", encoding="utf-8")
    return {"error": why, "launches_per_unit": None, "top": []}


def build_lm(name: str, doc_tokens: int, device: str, tokenizer: str | None = None):
    if name.endswith("-random"):
        # Random-init architectures (no weights needed): tokenizer from the bundled MiniLM model.
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

    return load_corpus("r5").sample(n, seed=seed).model_inputs()


def check_docid_space(ap, args) -> None:
    """Refuse ``--docs`` at the door when ``random_codes`` cannot draw that many distinct codes: at most
    K ** depth of them."""
    if args.docs > args.K ** args.depth:
        ap.error(f"--docs {args.docs}: more than the {args.K ** args.depth:,} distinct docids of --K {args.K} "
                 f"--depth {args.depth}; lower --docs or raise --K or --depth")


def random_codes(n: int, K: int, depth: int, seed: int) -> list[tuple[int, ...]]:
    """``n`` distinct random codes of ``depth`` digits in [0, K)."""
    rng = np.random.default_rng(seed)
    flat = rng.choice(K ** depth, size=n, replace=False)
    digits = (flat[:, None] // K ** np.arange(depth - 1, -1, -1)[None, :]) % K  # (n, depth)
    return [tuple(int(x) for x in row) for row in digits]


def preset_config(name: str, K: int, depth: int):
    """``RetrieverConfig`` of a preset of ``conf/stage/train.yaml`` (read with PyYAML: no Hydra needed)."""
    presets = yaml.safe_load((conf_dir() / "stage" / "train.yaml").read_text())["model_presets"]
    if name not in presets:
        raise SystemExit(f"gdr bench training: unknown preset {name!r}; choose from {', '.join(presets)}")
    return RetrieverConfig.from_dict({**presets[name], "n_digits": K, "max_code_len": depth})


# ---------------------------------------------------------------------------- torch.profiler tables
# ``--profile PATH`` of the sampling, scoring, training and decoding benchmarks (``make bench-gpu`` puts each
# table into its logs archive). On CUDA: the top kernels by GPU time with their share of the kernels' total,
# then the top operators by the GPU time of the kernels each launched itself, as shares of the same total
# (each kernel is counted once in each table, never an operator and its kernels together), and the kernel
# launches (cudaLaunchKernel, cuLaunchKernel, cudaGraphLaunch: a replayed CUDA graph counts once) per unit of
# work (query, pair, example). User annotations (``Optimizer.step#AdamW.step``, ``ProfilerStep``) are left
# out: on the GPU they span the kernels inside them (Lightning's optimizer step spans the whole forward and
# backward). On a CPU (smoke runs): the top operators by their own CPU time, and aten operator calls per
# unit, so that the code path is the one a GPU run takes.

_LAUNCHES = ("cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx", "cudaGraphLaunch")


def _self_device_us(e) -> float:
    return float(getattr(e, "self_device_time_total", None) or getattr(e, "self_cuda_time_total", 0.0) or 0.0)


def _on_device(e) -> bool:
    """A GPU-side event (kernel, memcpy, memset, or a user annotation's span), not a CPU operator."""
    return getattr(e, "device_type", DeviceType.CPU) != DeviceType.CPU


def _rows(timed: list[tuple[str, float, int]], total: float, top: int) -> list[dict]:
    timed = sorted(timed, key=lambda r: -r[1])[:top]
    return [{"op": k, "ms": round(t / 1e3, 3), "share": round(t / total, 4), "calls": c} for k, t, c in timed]


def _lines(rows: list[dict]) -> list[str]:
    return [f"{100 * r['share']:6.1f}%  {r['ms']:10.3f}  {r['calls']:7d}  {r['op'][:100]}" for r in rows]


def profile_table(fn: Callable[[], object], units: int, unit: str, device: torch.device, path: str | Path,
                  title: str = "", top: int = 15) -> dict:
    """Run ``fn`` once under ``torch.profiler``; write the table to ``path``; return its summary.

    units : how many ``unit``\\ s (queries, pairs, examples) ``fn`` processes, for the per-unit launch count.
    A failure (e.g. a CUDA graph captured under the profiler) is written to ``path`` instead and not raised.
    """
    cuda = device.type == "cuda"
    try:
        prof = start_profiler(device)
        t0 = time.perf_counter()
        with prof:
            fn()
            if cuda:
                torch.cuda.synchronize(device)
        return write_table(prof, time.perf_counter() - t0, units, unit, device, path, title, top)
    except Exception as e:  # noqa: BLE001 - the profile is extra: the benchmark's figures still come back
        return profile_failed(e, path, title)


def profile_failed(e: BaseException, path: str | Path, title: str = "") -> dict:
    """Write why a profile failed to ``path`` (so the archive says so); returns a summary without figures."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(f"# {title or 'profile'}: FAILED: {type(e).__name__}: {e}\n", encoding="utf-8")
    return {"error": f"{type(e).__name__}: {e}", "launches_per_unit": None, "top": []}


def start_profiler(device: torch.device):
    """A ``torch.profiler.profile`` of the CPU and, on CUDA, the GPU (not entered yet)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return profile(activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else []))


def write_table(prof, seconds: float, units: int, unit: str, device: torch.device, path: str | Path,
                title: str = "", top: int = 15) -> dict:
    """The table of a finished profile (see :func:`profile_table`), written to ``path``; returns its summary:
    ``top`` (kernels on CUDA, operators on a CPU), ``top_ops`` (CUDA: operators by the time of their own
    kernels), ``total_ms`` (the kernels' GPU time, or the operators' CPU time), launches per unit."""
    cuda = device.type == "cuda"
    # user annotations: on the GPU a span over other kernels (double counting); on a CPU their self time is
    # the Python around the operators, counted once
    events = [e for e in prof.key_averages() if not (cuda and getattr(e, "is_user_annotation", False))]
    ops: list[dict] = []
    header = f"{'share':>7}  {'ms':>10}  {'calls':>7}  "
    if cuda:
        kernels = [(e.key, _self_device_us(e), e.count) for e in events if _on_device(e) and _self_device_us(e) > 0]
        total = sum(t for _, t, _ in kernels) or 1.0
        rows = _rows(kernels, total, top)
        ops = _rows([(e.key, _self_device_us(e), e.count) for e in events
                     if not _on_device(e) and _self_device_us(e) > 0], total, top)
        launches = sum(e.count for e in events if e.key in _LAUNCHES)
        what, per = "GPU time", "kernel launches"
    else:
        timed = [(e.key, float(e.self_cpu_time_total), e.count) for e in events if e.self_cpu_time_total > 0]
        total = sum(t for _, t, _ in timed) or 1.0
        rows = _rows(timed, total, top)
        launches = sum(e.count for e in events if e.key.startswith("aten::"))
        what, per = "self CPU time", "aten op calls"
    summary = {"device": str(device), "seconds": round(seconds, 3), "units": units, "unit": unit,
               "total_ms": round(total / 1e3, 3), "launches": launches, "launch_kind": per,
               "launches_per_unit": round(launches / max(units, 1), 2), "top": rows, "top_ops": ops}
    lines = [f"# {title or 'profile'}: {units} {unit}s in {seconds:.3f} s under torch.profiler ({device})",
             f"# {per}: {launches} = {summary['launches_per_unit']} per {unit}; top {len(rows)} "
             f"{'kernels' if cuda else 'operators'} by {what} (shares of the {total / 1e3:.1f} ms of "
             f"{'every kernel; user annotations left out' if cuda else 'every operator'})",
             header + ("kernel" if cuda else "op"), *_lines(rows)]
    if cuda:
        lines += [f"# top {len(ops)} operators by the GPU time of the kernels each launched itself (shares of "
                  f"the same {total / 1e3:.1f} ms)", header + "op", *_lines(ops)]
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return summary
