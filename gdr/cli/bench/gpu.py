"""``make bench-gpu``: every GPU figure of the pipeline in one command, one JSON line last.

    python -m gdr.cli.bench.gpu              # on a CUDA machine (<= 6 minutes from a cold model cache)
    python -m gdr.cli.bench.gpu --dry-run    # anywhere: print every command, validate the `gdr run` configs
    python -m gdr.cli.bench.gpu --smoke      # on a CPU: the whole chain at tiny sizes (~3 minutes)
    python -m gdr.cli.bench.gpu --full       # also `gdr run +experiment=bbc` and `+experiment=cranfield`

Each step is a subprocess with a timeout: the sampling, scoring, training and decoding (search) benchmarks,
then ``gdr run`` on 1,000 BBC articles (J = 512; indexers gc, hkmi, random; one seed). Each benchmark's last
JSON line is parsed; a step that fails, times out or lacks a figure leaves that figure null and its error in
``errors``, and the chain goes on. Nothing here imports Hydra, OmegaConf or the LM stack, so the command
starts on a bare CUDA image (``source .device-carry/3/boot.sh`` brings the rest; see ../shared/device/).

Outputs go under ``$OUT`` when it is set (the device machine returns at most 8 files: ``bench-gpu.json`` and
``bench-gpu-logs.tar.gz``, the step logs with the runs' report.md/report.json), else under ``--out``. The
run folders themselves go to ``--work`` (default: ``<tmp>/gdr-bench-gpu`` when ``$OUT`` is set, else under ``--out``); each run's folder is
emptied first, so that no cached stage is reused.
The LAST line printed is one JSON object: ``device``, ``seconds``, every figure as a flat key (null when
missing), ``steps`` (rc, seconds, ok per step) and ``errors``.
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["Step", "plan", "main", "last_json", "extract", "RUN_1000"]

REPO = Path(__file__).resolve().parents[3]

# `gdr run` on 1,000 BBC articles, sized for the 6-minute budget on one H100/H200 (see README, Benchmarks)
RUN_1000 = ["+experiment=bbc", "data.n_docs=1000", "sample.n_queries=512", "doc_queries.per_doc=3",
            "indexers=[gc,hkmi,random]", "seeds=[0]", "cluster.enabled=false", "plot=false", "device=auto",
            "train.trainer.batch_size=auto", "evaluate.batch_size=auto"]
SMOKE_RUN = ["+experiment=bbc", "data.n_docs=40", "model.max_doc_tokens=32", "sample.n_queries=16", "sample.max_new_tokens=8",
             "doc_queries.per_doc=0", "indexers=[gc,hkmi,random]", "seeds=[0]",
             "index.n_clusters=4", "index.leaf_size=4", "queries.fractions=[0.5,0.1,0.4]",
             "cluster.enabled=false", "plot=false", "device=cpu", "score.processes=1", "score.shard_size=8",
             "train.model.size=tiny", "train.trainer.max_epochs=2", "train.trainer.batch_size=16",
             "train.trainer.enable_progress_bar=false", "train.optim.warmup_steps=2", "evaluate.k=10",
             "evaluate.beam=10", "evaluate.device=cpu"]


@dataclass
class Step:
    """One subprocess of the chain.

    figures : flat output key -> dotted path in the step's last JSON line (``mini.examples_per_s``)
    run_config : the ``gdr run`` overrides when the step is a ``gdr run`` (validated by --dry-run; its
        figures are read from ``<out>/report.json``)
    """

    name: str
    argv: list[str]
    timeout: int
    figures: dict[str, str] = field(default_factory=dict)
    run_config: list[str] | None = None
    run_out: Path | None = None


def _py() -> list[str]:
    return [sys.executable]


def _run_step(name: str, overrides: list[str], out: Path, timeout: int) -> Step:
    ov = [*overrides, f"out={out}"]
    return Step(name, [*_py(), "-m", "gdr.cli", "run", *ov], timeout, run_config=ov, run_out=out)


def plan(mode: str, work: Path, full: bool = False) -> list[Step]:
    """The chain for ``mode`` ("gpu" or "smoke"); ``work`` holds the run folders."""
    m = [*_py(), "-m"]
    if mode == "smoke":  # tiny sizes on the CPU: proves the chaining and the parsing, not the speed
        lm = str(work / "tiny-lm")  # a random-init 2-layer Llama (make_tiny_lm) instead of SmolLM2
        steps = [
            Step("sampling", [*m, "gdr.cli.bench.sampling", "--models", lm, "--docs", "16", "--doc-tokens", "32",
                              "--max-new-tokens", "8", "--queries", "16", "--hf-queries", "8", "--device", "cpu"], 90),
            Step("scoring", [*m, "gdr.cli.bench.scoring", "--model", lm, "--device", "cpu", "--queries", "8",
                             "--doc-tokens", "32", "--pairs", "32", "--naive-pairs", "4"], 120),
            Step("training", [*m, "gdr.cli.bench.training", "--presets", "mini", "--batch", "8", "--steps", "2",
                              "--warmup", "1", "--device", "cpu"], 120),
            Step("search", [*m, "gdr.cli.bench.decoding", "--model", "tiny", "--docs", "2000", "--beam", "20",
                            "--queries", "8", "--batch", "8", "--no-reference", "--device", "cpu"], 90),
            _run_step("run", [*SMOKE_RUN, f"model.name={lm}"], work / "run-smoke", 300),
        ]
    else:
        steps = [
            # SmolLM2 and a random-init T5-base, HF generate side by side; the first step also converts the
            # bundled GGUF once (cold cache) and captures the CUDA graphs.
            Step("sampling", [*m, "gdr.cli.bench.sampling", "--device", "cuda", "--doc-tokens", "128",
                              "--max-new-tokens", "32", "--queries", "8192", "--hf-queries", "512"], 100),
            Step("scoring", [*m, "gdr.cli.bench.scoring", "--device", "cuda", "--model", "smollm2-135m", "--queries",
                             "1024", "--doc-tokens", "128", "--pairs", "131072", "--naive-pairs", "64",
                             "--doc-batch-size", "auto", "--max-query-tokens", "auto"], 40),
            Step("scoring_t5", [*m, "gdr.cli.bench.scoring", "--device", "cuda", "--model", "t5-base-random",
                                "--queries", "1024", "--doc-tokens", "128", "--query-tokens", "32", "--pairs", "65536",
                                "--naive-pairs", "16", "--doc-batch-size", "auto", "--max-query-tokens", "auto"], 30),
            Step("training", [*m, "gdr.cli.bench.training", "--presets", "mini,small30m", "--steps", "50",
                              "--warmup", "10", "--device", "cuda"], 50),
            Step("search", [*m, "gdr.cli.bench.decoding", "--model", "small30m", "--docs", "100000", "--beam", "100",
                            "--queries", "4096", "--batch", "256", "--no-reference", "--device", "cuda"], 30),
            _run_step("run", RUN_1000, work / "run-bbc1000", 110),
        ]
        if full:
            steps += [_run_step("bbc", ["+experiment=bbc", "device=auto"], work / "bbc", 600),
                      _run_step("cranfield", ["+experiment=cranfield", "device=auto"], work / "cranfield", 600)]
    figs = {
        "sampling": {"sampling_queries_per_s": "queries_per_s", "sampling_hf_queries_per_s": "hf_queries_per_s",
                     "sampling_tokens_per_s": "tokens_per_s", "sampling_mfu": "mfu"},
        "scoring": {"scoring_pairs_per_s": "engine_pairs_per_s", "scoring_mfu": "mfu"},
        "scoring_t5": {"scoring_t5_pairs_per_s": "engine_pairs_per_s", "scoring_t5_mfu": "mfu"},
        "training": {f"training_{p}_{k}": f"{p}.{k}" for p in
                     (("mini",) if mode == "smoke" else ("mini", "small30m"))
                     for k in ("examples_per_s", "tokens_per_s", "mfu")},
        "search": {"search_queries_per_s": "queries_per_s"},
    }
    for s in steps:
        s.figures = figs.get(s.name, {})
    return steps


def make_tiny_lm(folder: Path) -> Path:
    """A random-init 2-layer Llama with the bundled MiniLM tokenizer, saved as an HF folder (smoke runs)."""
    if (folder / "config.json").exists():
        return folder
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from gdr.models import resolve_model

    tok = AutoTokenizer.from_pretrained(resolve_model("minilm-l6"))
    tok.eos_token = tok.sep_token
    tok.chat_template = ("{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }} [SEP] {% endfor %}"
                         "{% if add_generation_prompt %}[assistant] {% endif %}")
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
                      pad_token_id=tok.pad_token_id, eos_token_id=tok.sep_token_id)
    tmp = folder.with_name(folder.name + ".tmp")
    LlamaForCausalLM(cfg).save_pretrained(tmp)
    tok.save_pretrained(tmp)
    os.replace(tmp, folder)
    return folder


def last_json(text: str) -> dict | None:
    """The last line of ``text`` that parses as a JSON object; None when there is none."""
    for line in reversed(text.strip().splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                obj = json.loads(line)
            except ValueError:
                continue
            if isinstance(obj, dict):
                return obj
    return None


def _dig(obj: Any, path: str) -> Any:
    for part in path.split("."):
        if not isinstance(obj, dict) or part not in obj:
            return None
        obj = obj[part]
    return obj


def extract(step: Step, parsed: dict | None) -> tuple[dict[str, Any], list[str]]:
    """(flat figures, missing keys) of one step: figures it lacks are None."""
    figures, missing = {}, []
    for key, path in step.figures.items():
        v = _dig(parsed, path) if parsed is not None else None
        figures[key] = v
        if v is None and not key.endswith("mfu"):  # MFU is null by design where the peak is unknown
            missing.append(path)
    return figures, missing


def run_figures(step: Step) -> tuple[dict[str, Any], list[str]]:
    """Seconds, Recall@1 and MRR@100 (in %) per indexer and of BM25 from a ``gdr run``'s report.json."""
    name = step.name
    path = step.run_out / "report.json"
    if not path.exists():
        return {f"{name}_seconds": None}, [f"{path} not written"]
    rep = json.loads(path.read_text())
    out: dict[str, Any] = {f"{name}_seconds": rep.get("seconds"), f"{name}_n_docs": rep.get("n_docs")}
    for method, m in (rep.get("retrieval") or {}).items():
        out[f"{name}_{method}_recall_at_1"] = m.get("recall@1")
        out[f"{name}_{method}_mrr_at_100"] = m.get("mrr@100")
    bm25 = rep.get("bm25") or {}
    out[f"{name}_bm25_recall_at_1"] = bm25.get("recall@1")
    out[f"{name}_bm25_mrr_at_100"] = bm25.get("mrr@100")
    out[f"{name}_stages"] = {s["name"]: s["seconds"] for s in rep.get("stages", [])}
    return out, []


def validate_run_config(overrides: list[str]) -> str | None:
    """None when ``gdr run <overrides>`` composes and passes validation; else the one-line problem."""
    try:
        from gdr.pipeline import check_settings as _check
        from gdr.validate import error_line, validate
        from gdr.config import load_config

        cfg = load_config("run", overrides)
        validate("run", cfg)
        _check(cfg)
    except Exception as e:  # noqa: BLE001 - reported, not raised: the dry run lists every problem
        try:
            return error_line(e, overrides) or f"{type(e).__name__}: {e}"
        except Exception:  # noqa: BLE001
            return f"{type(e).__name__}: {e}"
    return None


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), *([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])])
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


def execute(step: Step, logs: Path) -> dict[str, Any]:
    """Run one step; returns its record: rc, seconds, figures, error."""
    log_path = logs / f"{step.name}.log"
    if step.run_out is not None and step.run_out.exists():  # a benchmark times every stage: no cached stage reused
        shutil.rmtree(step.run_out)
    t0 = time.perf_counter()
    err = None
    with open(log_path, "w", encoding="utf-8") as f:
        f.write("$ " + shlex.join(step.argv) + "\n")
        f.flush()
        try:
            p = subprocess.run(step.argv, cwd=REPO, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True, timeout=step.timeout, errors="replace")
            rc, text = p.returncode, p.stdout
        except subprocess.TimeoutExpired as e:
            rc = 124
            text = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
            err = f"timed out after {step.timeout}s"
        f.write(text)
    seconds = round(time.perf_counter() - t0, 1)
    if rc != 0 and err is None:
        tail = [ln for ln in text.strip().splitlines() if ln.strip()][-1:] or ["(no output)"]
        err = f"exit {rc}: {tail[0][:300]}"
    if step.run_out is not None:
        figures, missing = run_figures(step) if rc == 0 else ({f"{step.name}_seconds": None}, [])
        device = None
    else:
        parsed = last_json(text)
        figures, missing = extract(step, parsed)
        device = parsed.get("device") if parsed else None
        if parsed is None and err is None:
            err = "no JSON line in the output"
    if missing and err is None:
        err = "missing " + ", ".join(missing)
    return {"rc": rc, "seconds": seconds, "ok": err is None, "error": err, "figures": figures, "device": device}


def _device_name() -> str | None:
    import torch

    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="gdr bench gpu", description=__doc__.split("\n\n")[0])
    ap.add_argument("--dry-run", action="store_true", help="print the commands and validate the run configs")
    ap.add_argument("--smoke", action="store_true", help="the whole chain at tiny sizes on the CPU (~3 minutes)")
    ap.add_argument("--full", action="store_true", help="also gdr run +experiment=bbc and +experiment=cranfield")
    ap.add_argument("--out", default=None, help="where the summary and logs go (default $OUT, else runs/bench-gpu)")
    ap.add_argument("--work", default=None, help="where the run folders go (default: <tmp>/gdr-bench-gpu when $OUT "
                                                   "is used, else <out>/work)")
    ap.add_argument("--only", default=None, help="comma-separated step names to run (default all)")
    args = ap.parse_args(argv)
    mode = "smoke" if args.smoke else "gpu"
    out = Path(args.out or os.environ.get("OUT") or REPO / "runs" / "bench-gpu")
    if args.work:
        work = Path(args.work)
    elif os.environ.get("OUT") and not args.out:  # $OUT returns at most 8 files: runs live elsewhere
        work = Path(tempfile.gettempdir()) / "gdr-bench-gpu"
    else:
        work = out / "work"
    steps = plan(mode, work.resolve(), full=args.full)
    if args.only:
        keep = set(args.only.split(","))
        steps = [s for s in steps if s.name in keep]

    if mode == "smoke":
        work.mkdir(parents=True, exist_ok=True)
        make_tiny_lm(work.resolve() / "tiny-lm")
    if args.dry_run:
        problems: dict[str, str | None] = {}
        for s in steps:
            print(f"[{s.name}] timeout {s.timeout}s: {shlex.join(s.argv)}")
            if s.run_config is not None:
                problems[s.name] = validate_run_config(s.run_config)
                print(f"[{s.name}] config: {problems[s.name] or 'ok'}")
        bad = {k: v for k, v in problems.items() if v}
        print(json.dumps({"dry_run": True, "mode": mode, "commands": {s.name: shlex.join(s.argv) for s in steps},
                          "timeouts": {s.name: s.timeout for s in steps},
                          "configs_valid": {k: v is None for k, v in problems.items()}, "errors": bad}))
        return 1 if bad else 0

    if mode == "gpu":
        try:
            device = _device_name()
        except ImportError as e:
            print(f"gdr bench gpu: needs torch with CUDA ({e}); `--dry-run` prints the commands")
            return 2
        if device is None:
            print("gdr bench gpu: needs a CUDA GPU (torch.cuda.is_available() is False here); "
                  "`make bench-gpu-dry` prints the commands, `--smoke` runs them at tiny sizes on the CPU")
            return 2
    else:
        device = "cpu"

    out.mkdir(parents=True, exist_ok=True)
    logs = Path(tempfile.mkdtemp(prefix="gdr-bench-logs-"))
    t0 = time.perf_counter()
    result: dict[str, Any] = {"device": device, "mode": mode}
    records: dict[str, dict] = {}
    for s in steps:
        print(f"[{s.name}] {shlex.join(s.argv)}", file=sys.stderr, flush=True)
        rec = execute(s, logs)
        records[s.name] = rec
        result.update(rec.pop("figures"))
        print(f"[{s.name}] {'ok' if rec['ok'] else 'FAILED: ' + str(rec['error'])} ({rec['seconds']}s)",
              file=sys.stderr, flush=True)
    result["seconds"] = round(time.perf_counter() - t0, 1)
    result["devices_reported"] = {k: r.pop("device") for k, r in records.items() if r.get("device")}
    result["steps"] = {k: {"rc": r["rc"], "seconds": r["seconds"], "ok": r["ok"]} for k, r in records.items()}
    result["errors"] = {k: r["error"] for k, r in records.items() if r["error"]}
    # the logs and each run's report travel in one archive (the device machine returns at most 8 files)
    with tarfile.open(out / "bench-gpu-logs.tar.gz", "w:gz") as tar:
        tar.add(logs, arcname="logs")
        for s in steps:
            for name in ("report.md", "report.json"):
                if s.run_out is not None and (s.run_out / name).exists():
                    tar.add(s.run_out / name, arcname=f"{s.name}/{name}")
    line = json.dumps(result)
    tmp = out / ".bench-gpu.json.tmp"
    tmp.write_text(line + "\n", encoding="utf-8")
    os.replace(tmp, out / "bench-gpu.json")
    print(line)
    return 0 if not result["errors"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
