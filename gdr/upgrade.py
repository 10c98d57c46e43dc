"""``gdr upgrade``: folders of older gdr formats brought to the current one (:data:`gdr.formats.FORMAT`).

This is the one module that knows older formats; the rest of gdr reads the current one only. A ``gdr run`` folder
is upgraded when it is opened (:func:`gdr.pipeline.open_run`) or by ``gdr upgrade RUN_DIR``; a P run folder of
``gdr score`` by ``gdr upgrade SCORE_DIR``. Each format has one step to the next (:data:`STEPS`); a step rewrites
a stage's ``stage.json`` and its manifests in place (each file written to a temporary name, then renamed) and
renames the stage folder to its new key, never touching ``P.npy`` or any other result file, so an expensive P
survives. What cannot be upgraded, and a folder of a newer format, is refused in one line naming the version.

Format 0 (no ``format`` recorded) -> 1:

* the LM (and a clustering's sentence-transformers model) is keyed by the digest of its files, not by its name or
  path: ``lm.name`` becomes ``lm.weights`` in the stage's inputs and ``lm.model`` in its manifests;
* ``sample.p_per_doc`` is keyed at its then only value, ``0`` (queries drawn over the corpus);
* ``train.trainer.length_buckets``, keyed only when set before, is keyed at its then only value, ``false``; a
  training's best dev score, recorded as ``best_val_recall1`` whatever its metric, is named by its metric;
* a stage keyed by the corpus's settings and file paths (``corpus.data``) or by the queries' path, not by their
  content, is retired (``status: retired``): its key cannot be rewritten without reading files that may have
  changed since, so a run builds it again under its content key; so is every stage built on a retired one;
* a finished stage without recorded checksums (``artifacts``) has its files checked as far as they can be (they
  parse, .npy sizes match their headers, the manifests' own records hold, P has no zero or non-finite rows,
  docids.tsv reads) and then recorded; one that fails is marked unfinished, so that a run rebuilds it;
* a sampling manifest that recorded its queries by the hash of their texts records the file's checksum; one
  without the numerics its queries were decoded with (device, dtype, decode path) is refused: they cannot be
  found from the folder, and this gdr checks them before it resumes, reuses or scores those queries;
* P's shard markers that hold no checksum of their rows are dropped, named in one line: a shard's rows are its run
  of the documents in prompt-length order (the LM's tokenizer over the corpus), which a P folder does not record,
  so the checksum cannot be computed here; P is kept (a finished one is checked by its own checksum) and a later
  ``gdr score`` into the folder re-scores those shards.

What a folder alone cannot bring to format 1 and no stage of a run can hold is refused before the stage that would
use it, in one line naming format 0 and the fix: a GC index that recorded only its queries' ids, not their texts
(``gdr index add``: build it again with ``gdr index``, :func:`refuse_format_0_gc_index`), and a training without
``trained_on.json`` (``gdr train`` resuming it: ``trainer.resume=false`` or a fresh ``out_dir``,
:func:`refuse_format_0_training`; ``gdr evaluate``: train it again, :func:`refuse_format_0_retriever`); the
commands and the API call these checks at their door.
Every such stage of a run folder (and every one whose sampling lacks its numerics) was keyed by the corpus's
settings and paths, so the step above retires it and the run builds it again.
"""
from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Callable

import numpy as np

from gdr.formats import FORMAT, STAGE_FILE, FormatError, format_of, read_stage_record, stage_digest, stage_key
from gdr.indexing.docids import read_docids
from gdr.indexing.state import load_tree_state
from gdr.io import (
    atomic_write_json,
    check_manifest_files,
    file_digest,
    hash_strings,
    read_jsonl,
    record_files,
    verify_files,
)
from gdr.lm.numerics import scoring_numerics
from gdr.models import model_digest
from gdr.rerun import RerunCommand
from gdr.rules import ConfigError
from gdr.stages.train import TRAINED_ON, holds_training
from gdr.store import DOCQ_MANIFEST, P_FILE, P_MANIFEST, Q_FILE, Q_MANIFEST, SHARD_DIR, load_run

log = logging.getLogger(__name__)

__all__ = ["STEPS", "upgrade", "upgrade_run", "upgrade_manifests", "refuse_format_0_training",
           "refuse_format_0_retriever", "refuse_format_0_gc_index"]

# The order stages are upgraded in: each after the stages it reads, so their new keys are known.
_ORDER = ("score", "doc-queries", "cluster", "index", "bm25", "train", "eval")
# The inputs of a stage that hold the key of a stage it reads.
_REFERENCES = ("score", "doc_queries", "index", "upstream", "train")
_MANIFESTS = (P_MANIFEST, Q_MANIFEST, DOCQ_MANIFEST)
# The files of each kind of format-0 stage that the stages after it read (its content for them).
_OUTPUTS = {"score": ("P.npy", "queries.jsonl", "doc_ids.json"), "doc-queries": ("doc_queries.jsonl",),
            "index": ("docids.tsv",), "train": ("model/*", "docids.tsv")}


def upgrade(path: str | os.PathLike) -> list[str]:
    """Bring the ``gdr run`` folder or P run folder ``path`` to the current format; one line per change made."""
    path = Path(path)
    if not path.is_dir():
        raise FileNotFoundError(f"{path}: no such folder; pass a `gdr run` or `gdr score` output folder")
    if _stage_folders(path):
        return upgrade_run(path)
    if any((path / name).is_file() for name in _MANIFESTS):
        return upgrade_manifests(path, device=None)
    raise ValueError(f"{path}: holds no stage folder (<stage>-<key>/stage.json) and no P run manifest "
                     f"({', '.join(_MANIFESTS)}): not a folder of `gdr run` or `gdr score`, nothing to upgrade")


def upgrade_run(root: str | os.PathLike) -> list[str]:
    """Upgrade every stage folder of the run folder ``root`` (see the module's docstring); one line per stage
    changed. A stage of a newer or unknown format is refused (:class:`gdr.formats.FormatError`) before any
    stage is changed."""
    root = Path(root)
    folders = _stage_folders(root)
    records = {f: read_stage_record(f) for f in folders}
    versions = {f: format_of(r, f / STAGE_FILE) for f, r in records.items() if r is not None}
    keys: dict[str, str | None] = {}  # old key -> new key (None: retired)
    names: dict[str, str] = {}  # old folder name -> new one
    upgraded: dict[str, tuple[str, dict]] = {}  # new key -> (folder name, stage.json)
    done = []
    for folder in folders:
        rec, version = records[folder], versions.get(folder)
        if rec is None or version is None:
            continue  # an unreadable stage.json: the run re-runs that stage, saying why
        old_key = rec.get("key")
        while version < FORMAT:
            rec = STEPS[version](folder, rec, keys)
            version += 1
        if rec is not records[folder]:  # upgraded now: name its upstream stages by their new folders
            rec["upstream"] = {names.get(k, k): v for k, v in rec["upstream"].items()} if "upstream" in rec \
                else _upstream(rec, upgraded)
        target = folder.with_name(f"{rec.get('stage', folder.name.rsplit('-', 1)[0])}-{rec.get('key')}")
        if rec.get("status") == "retired":
            target = folder
        elif target != folder and target.exists():  # that stage was built anew meanwhile: it is the one used
            rec, target = {**rec, "status": "retired", "retired": f"{target.name} exists already"}, folder
        if rec is not records[folder]:
            atomic_write_json(folder / STAGE_FILE, rec)
        retired = rec.get("status") == "retired"
        keys[old_key] = None if retired else rec.get("key")
        upgraded[rec.get("key")] = (target.name, rec)
        if target != folder:
            os.replace(folder, target)  # stage.json already names the new key: a rename cut short is redone here
        names[folder.name] = target.name
        if versions[folder] != FORMAT:
            what = f"retired ({rec.get('retired')})" if retired else f"now {target.name}"
            done.append(f"{folder.name}: format {versions[folder]} -> {FORMAT}, {what}")
    for line in done:
        log.info("upgraded %s/%s", root, line)
    return done


def _upstream(rec: dict, upgraded: dict[str, tuple[str, dict]]) -> dict:
    """``upstream`` of a stage that recorded none: the content (:func:`gdr.formats.stage_digest`) of each stage its
    inputs name, as it is now; one without checksums (it failed its checks: rebuilt) is left out, so the run
    rebuilds this stage after it."""
    out = {}
    for ref in _REFERENCES:
        name, up = upgraded.get(rec["inputs"].get(ref) if isinstance(rec["inputs"].get(ref), str) else "", ("", {}))
        if "artifacts" in up:
            out[name] = stage_digest(up["artifacts"], up.get("outputs") or ("*",))
    return out


def _stage_folders(root: Path) -> list[Path]:
    """The stage folders of a run folder, each after the stages it reads."""
    found = [d for d in root.iterdir() if d.is_dir() and (d / STAGE_FILE).is_file()]

    def rank(d: Path) -> tuple[int, str]:
        kind = next((i for i, k in enumerate(_ORDER) if d.name.startswith(k + "-")), len(_ORDER))
        return kind, d.name

    return sorted(found, key=rank)


# ---------------------------------------------------------------------------------------------- format 0 -> 1
def _v0_to_v1(folder: Path, rec: dict, keys: dict[str, str | None]) -> dict:
    """A stage folder of format 0 brought to format 1 (see the module's docstring); ``keys``: old -> new key of
    the stages upgraded before it (None: retired). Returns its new ``stage.json``."""
    inputs = dict(rec.get("inputs") or {})
    why = _unkeyable(inputs, keys)
    if why is not None:
        return {**rec, "format": 1, "status": "retired", "retired": why}
    before = verify_files(folder, rec["artifacts"]) if "artifacts" in rec else ("", "")
    where = folder / STAGE_FILE
    if isinstance(inputs.get("lm"), dict) and "name" in inputs["lm"]:
        inputs["lm"] = _lm_by_digest(inputs["lm"], where)
    if "cluster" in inputs:
        inputs["cluster"] = _embed_by_digest(inputs["cluster"], where)
    if isinstance(inputs.get("index"), dict):
        inputs["index"] = {k: _embed_by_digest(v, where) for k, v in inputs["index"].items()}
    if isinstance(inputs.get("sample"), dict):
        inputs["sample"] = {**inputs["sample"], "p_per_doc": 0}
    trainer = inputs["train"].get("trainer") if isinstance(inputs.get("train"), dict) else None  # else a key
    if isinstance(trainer, dict):
        trainer.setdefault("length_buckets", False)
        rec = {**rec, "info": _best_score(rec.get("info") or {}, trainer)}
    for ref in _REFERENCES:
        if isinstance(inputs.get(ref), str) and inputs[ref] in keys:
            inputs[ref] = keys[inputs[ref]]
    upgrade_manifests(folder, device=inputs.get("device"), lm=inputs.get("lm"))
    out = {**rec, "format": 1, "inputs": inputs, "key": stage_key(inputs)}
    if before is None:  # its files were whole: what the upgrade rewrote is recorded anew
        out["artifacts"] = record_files(folder, exclude=(STAGE_FILE,))
    elif "artifacts" not in rec and rec.get("status") == "complete":
        out.update(_first_checksums(folder, rec.get("stage", folder.name)))
    return out


def _best_score(info: dict, trainer: dict) -> dict:
    """A training stage's ``info`` with its best dev score under its metric's name: format 0 held it as
    ``best_val_recall1`` alone, whatever metric ``trainer.monitor`` chose the checkpoint by."""
    if "best_val_score" in info or "best_val_recall1" not in info:
        return info
    monitor = trainer.get("monitor") or "val/recall@1"
    return {**info, "best_val_metric": monitor, "best_val_score": info["best_val_recall1"]}


def _unkeyable(inputs: dict, keys: dict[str, str | None]) -> str | None:
    """Why a format-0 stage cannot be keyed by content (it is retired), or None."""
    if isinstance(inputs.get("corpus"), dict) and "data" in inputs["corpus"]:
        return "keyed by the corpus's settings and paths, not its content"
    if isinstance(inputs.get("queries"), dict) and "path" in inputs["queries"]:
        return "keyed by the queries' path, not their content"
    gone = [inputs[r] for r in _REFERENCES if isinstance(inputs.get(r), str) and keys.get(inputs[r], "") is None]
    return f"built on the retired stage {gone[0]}" if gone else None


def _lm_by_digest(lm: dict, where: Path) -> dict:
    """A format-0 LM section (``name``: a hub id or a path) keyed by the digest of the model's files."""
    return {**{k: v for k, v in lm.items() if k != "name"}, "weights": _digest(lm["name"], where)}


def _embed_by_digest(settings, where: Path):
    """A settings dict whose ``embed_model`` is a name or path, with it replaced by the digest of its files."""
    if isinstance(settings, dict) and isinstance(settings.get("embed_model"), str) \
            and not settings["embed_model"].startswith(("sha256:", "id:")):
        return {**settings, "embed_model": _digest(settings["embed_model"], where)}
    return settings


def _digest(name: str, where: Path) -> str:
    """:func:`gdr.models.model_digest` of a model a format-0 folder names; refused when the model is not here."""
    digest = model_digest(name)
    if digest.startswith("id:") and (Path(name).is_absolute() or name.startswith((".", "~"))):
        raise FormatError(f"{where}: format 0 names its model by the path {name}, which is not there, so the "
                          f"stage cannot be keyed by the model's files; put the model back at {name} and run again, "
                          f"or move this stage folder away to build it anew")
    return digest


def upgrade_manifests(folder: str | os.PathLike, device: dict | None, lm: dict | None = None) -> list[str]:
    """The P run manifests of ``folder`` brought to the current format: the scorer by its files' digest
    (``lm``: the stage's upgraded LM section, else from the manifest's ``lm.model``), the device and compute
    dtype where absent (``device``: the stage's ``{"kind", "compute_dtype"}``, else what ``auto`` resolves to),
    the queries file's checksum, P's shard markers without a checksum dropped; one line per change. A sampling
    manifest without its numerics is refused before any file changes."""
    folder, done = Path(folder), []
    old = {}
    for name in _MANIFESTS:
        path = folder / name
        if path.is_file():
            man = json.loads(path.read_text(encoding="utf-8"))
            if format_of(man, path) != FORMAT:
                old[name] = man
    for name, man in old.items():
        if name != P_MANIFEST and "numerics" not in man:
            raise FormatError(
                f"{folder / name}: format 0 from before gdr recorded the numerics its queries were decoded with "
                f"(device, dtype, decode path), which this gdr checks before it resumes, reuses or scores them; "
                f"sample them again into another out= folder")
    for name, man in old.items():
        atomic_write_json(folder / name, _manifest_v0_to_v1(folder, name, man, device, lm))
        done.append(f"{folder / name}: format {format_of(man, folder / name)} -> {FORMAT}")
        if name == P_MANIFEST:
            done += _drop_unchecked_markers(folder)
    return done


def _drop_unchecked_markers(folder: Path) -> list[str]:
    """P's shard markers that hold no checksum of their rows (format 0 before markers carried one) removed; one
    line saying so, or none. The checksum cannot be computed here: a shard's rows are its run of the documents in
    prompt-length order (the LM's tokenizer over the corpus), which a P folder does not record. P itself is kept: a
    finished one is checked by its own checksum; a later ``gdr score`` into the folder re-scores those shards."""
    bare = []
    for marker in sorted((folder / SHARD_DIR).glob("*.done")):
        try:
            rec = json.loads(marker.read_text(encoding="utf-8") or "{}")
        except ValueError:
            rec = None
        if not (isinstance(rec, dict) and "rows_crc32" in rec):
            bare.append(marker)
    if not bare:
        return []
    for marker in bare:
        marker.unlink()
    line = (f"{folder / SHARD_DIR}: {len(bare)} shard marker(s) of format 0 hold no checksum of their rows, which "
            f"need the documents' prompt-length order (not recorded in the folder): dropped, those shards are "
            f"re-scored when P is scored again")
    log.warning("%s", line)
    return [line]


def _manifest_v0_to_v1(folder: Path, name: str, man: dict, device: dict | None, lm: dict | None) -> dict:
    path = folder / name
    scorer = man.get("lm")
    if isinstance(scorer, dict) and "model" in scorer:
        # in a run, the LM its stage now names; else the model's files where it names some (a model handed over
        # as an object, or a hub id not cached here, stays named as it is, as the current format names them)
        weights = lm["weights"] if lm and "weights" in lm else _digest(scorer["model"], path)
        if not weights.startswith("id:"):
            man["lm"] = {"weights": weights, **{k: v for k, v in scorer.items() if k != "model"}}
    if name == P_MANIFEST and not ("device" in man and "compute_dtype" in man):
        # format 0 before these were recorded scored with `auto` alone: its run's stage.json says what that was,
        # else what it resolves to on the device recorded, or on this machine's (what re-entering it assumed)
        was = {"device": device.get("kind"), "compute_dtype": device.get("compute_dtype")} if device \
            else scoring_numerics(man.get("device"), "auto")
        man = {**was, **man}
    if name == Q_MANIFEST and "file" not in man and (folder / Q_FILE).is_file() and man.get("status") == "complete":
        rows = read_jsonl(folder / Q_FILE)
        if len(rows) == man.get("n_queries") and hash_strings(r.get("text", "") for r in rows) == man.get(
                "queries_hash"):
            man["file"] = file_digest(folder / Q_FILE)
        # else: left without; the run finds the queries changed against their hash and re-samples
    return {**man, "format": 1}


# ------------------------------------------------------------------------- format-0 stages without checksums
def _first_checksums(folder: Path, stage: str) -> dict:
    """``stage.json`` fields of a finished format-0 stage without recorded checksums: ``artifacts`` when its
    files pass what can be checked, else ``status: running`` (the run rebuilds it, saying what was wrong)."""
    files = [p.relative_to(folder).as_posix() for p in sorted(folder.rglob("*"))
             if p.is_file() and p.name != STAGE_FILE and not p.name.startswith(".")]
    bad = _readable(folder, files)
    for manifest in sorted(folder.glob("*manifest.json")) if bad is None else ():
        bad = _fails(lambda m=manifest: check_manifest_files(folder, name=m.name))
        if bad is not None:
            break
    if bad is None:
        bad = _CHECKS.get(stage.split("-")[0], lambda f: None)(folder)
    if bad is not None:
        log.warning("%s; the stage is built again", bad)
        return {"status": "running"}
    kind = next((k for k in _OUTPUTS if stage == k or stage.startswith(k + "-")), "")
    return {"artifacts": record_files(folder, exclude=(STAGE_FILE,)), "outputs": list(_OUTPUTS.get(kind, ("*",)))}


def _readable(folder: Path, files: list[str]) -> str | None:
    """What can be checked of files without a recorded checksum: JSON and JSON lines parse, a .npy's size
    matches its header, no file is empty; the first problem, or None."""
    for rel in files:
        p = folder / rel
        try:
            if p.stat().st_size == 0 and p.suffix not in (".done", ".txt", ".trec", ".tsv"):
                return f"{p}: empty"
            if p.suffix == ".json":
                json.loads(p.read_text(encoding="utf-8"))
            elif p.suffix == ".jsonl":
                read_jsonl(p)
            elif p.suffix == ".npy":
                np.load(p, mmap_mode="r")
        except (ValueError, OSError, EOFError) as e:  # JSONDecodeError is a ValueError
            return f"{p}: unreadable ({str(e).splitlines()[0][:120]})"
    return None


def _fails(read: Callable[[], object]) -> str | None:
    try:
        read()
    except (ValueError, RuntimeError, OSError) as e:
        return str(e)
    return None


def _check_score(folder: Path) -> str | None:
    """P, doc ids and queries agree with their manifests; P has no zero or non-finite rows (what re-entering a
    truncated P left before shards carried checksums)."""
    box = {}
    bad = _fails(lambda: box.setdefault("run", load_run(folder)))
    if bad is None:
        P = np.asarray(box["run"].logp)
        if not (np.isfinite(P).all() and (P != 0).all()):
            bad = f"{folder / P_FILE}: holds zeros or non-finite values"
    return bad


def _check_index(folder: Path) -> str | None:
    return _fails(lambda: read_docids(folder / "docids.tsv"))


_CHECKS: dict[str, Callable[[Path], str | None]] = {"score": _check_score, "index": _check_index}

# format -> the step that brings a stage folder of that format to the next: (folder, stage.json, keys) -> stage.json
STEPS: dict[int, Callable[[Path, dict, dict], dict]] = {0: _v0_to_v1}


# ------------------------------------------------------------------------------------- refused at the door
def refuse_format_0_training(out: str | os.PathLike, resume: bool) -> None:
    """Refuse, in one line, to resume a training of format 0 in ``out`` (a checkpoint or a model without
    ``trained_on.json``): it does not record what it was trained on. ``gdr train`` and ``gdr.train_retriever`` call
    it before the stage; with ``resume=False`` the stage starts over in the folder."""
    out = Path(out)
    if resume and holds_training(out) and not (out / TRAINED_ON).exists():
        raise ConfigError(f"out_dir={out}: holds a training of format 0 (an older gdr's, without {TRAINED_ON}), "
                          "which does not record what it was trained on, so it cannot be resumed. To start over "
                          "in this folder set trainer.resume=false, or choose a fresh out_dir")


def refuse_format_0_retriever(run_dir: str | os.PathLike) -> None:
    """Refuse, in one line, a retriever of format 0 in ``run_dir`` (no ``trained_on.json``, or one without the
    query splits it was trained on): a score on any split may measure memory. ``gdr evaluate`` and
    ``gdr.evaluate`` call it before the stage (an unreadable record is the stage's to name)."""
    run_dir, record = Path(run_dir), Path(run_dir) / TRAINED_ON
    if not holds_training(run_dir):
        return
    try:
        queries = (json.loads(record.read_text(encoding="utf-8")).get("inputs") or {}).get("queries") \
            if record.exists() else {}
    except (OSError, ValueError, AttributeError):
        return
    if queries is not None and not isinstance(queries.get("splits"), list):
        raise ConfigError(f"{run_dir}: a retriever of format 0, from before gdr recorded the query splits it was "
                          f"trained on (in {TRAINED_ON}), so a score on any split may measure memory; train it again "
                          f"with this gdr (`gdr train out_dir=<new folder>`)")


def refuse_format_0_gc_index(index_dir: str | os.PathLike) -> None:
    """Refuse, in one line, a GC index of format 0 from before its queries were recorded by content (only their
    ids, ``q0 .. q{J-1}`` in every run): new documents' P cannot be checked against them. ``gdr index add`` calls
    it before the stage."""
    index_dir = Path(index_dir)
    try:
        state = load_tree_state(index_dir / "tree_state.npz")
    except Exception:  # a damaged or missing state: the stage's check of the index's files names it
        return
    if not state.meta.get("queries"):
        raise FormatError(f"{index_dir / 'tree_state.npz'}: a GC index of format 0, from before gdr recorded the "
                          f"texts of the queries it was built on, so new documents' P cannot be checked against "
                          f"them; build the index again with `{RerunCommand('index', index_dir)}`")
