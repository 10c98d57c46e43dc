"""A ``gdr run`` folder carried to another machine: ``gdr prune``, ``gdr pack``, ``gdr unpack``.

A lease ends and the next starts bare, so an experiment that carries on takes its results along without its models:

* :func:`prune_run` drops the model weights and optimiser states (``model/*.pt``, ``checkpoints/*``) of every
  *evaluated* retriever: a ``train-*`` stage whose ``eval-*`` stage is complete and recorded the digest of exactly
  these weights. Everything else stays: evaluations, per-query values, TREC runs, training curves, the report, P,
  the generated queries, the indexes. The pruned ``stage.json`` keeps its key, status and info, moves the dropped
  files' records from ``artifacts`` to ``pruned.files`` and keeps in ``pruned.digest`` the digest later stages
  recorded of it, so :mod:`gdr.pipeline` reuses its evaluation without the weights, and retrains it under the same
  key (one log line) only when the evaluation must run again.
  A run's fine-tuned query generator (``qg-*``, ``qg.enabled``) is pruned the same way once every stage that
  read it (score, doc-queries: keyed by its key, not its weights) is complete.
* :func:`pack_run` writes a pruned run as a gzip'd tar cut into pieces of at most ``piece_mib`` MiB (at most
  ``max_pieces``), each with its SHA-256 in a small manifest (:data:`MANIFEST`); a run that does not fit is refused
  with its size, and an unpruned one is refused (or pruned first, ``prune=True``).
* :func:`unpack_run` checks every piece against the manifest and rebuilds the folder anywhere: stage keys and
  digests hold no path, so ``gdr run`` on it reuses every stage and trains only what is new.
"""
from __future__ import annotations

import gzip
import hashlib
import json
import logging
import math
import os
import shutil
import tarfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from gdr.formats import FORMAT, STAGE_FILE, matches, require_format, stage_digest
from gdr.guard import holding
from gdr.io import atomic_write_json, verify_files

log = logging.getLogger(__name__)

__all__ = ["WEIGHTS", "MANIFEST", "PIECE_MIB", "MAX_PIECES", "prune_run", "prunable", "pack_run", "unpack_run",
           "was_pruned"]

# A retriever's weights and optimiser states: what pruning drops (the tokenizer and retriever.json are small and stay)
WEIGHTS = ("model/*.pt", "model/*.safetensors", "model/*.bin", "checkpoints/*")
MANIFEST = "gdr-pack.json"  # the pack's manifest in OUTDIR; its pieces are gdr-pack.00, gdr-pack.01 ...
PIECE_PREFIX = "gdr-pack."
PIECE_MIB = 16  # what one device call brings back per file
MAX_PIECES = 8  # ... and files per call
_MIB = 1 << 20


@dataclass
class _Train:
    """A ``train-*`` stage folder of a run, its ``stage.json`` and the weight files on disk."""

    folder: Path
    record: dict
    weights: list[Path]

    @property
    def bytes(self) -> int:
        return sum(p.stat().st_size for p in self.weights)


def _record(folder: Path) -> dict | None:
    try:
        return json.loads((folder / STAGE_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def was_pruned(folder: str | os.PathLike) -> bool:
    """Whether the stage folder ``folder`` had files dropped by :func:`prune_run` (its ``stage.json`` says so)."""
    return bool((_record(Path(folder)) or {}).get("pruned"))


def _digest(record: dict) -> str:
    """The digest later stages recorded of a finished stage (a pruned one keeps it in ``pruned.digest``)."""
    pruned = record.get("pruned") or {}
    return pruned.get("digest") or stage_digest(record.get("artifacts") or {}, record.get("outputs") or ("*",))


def _weight_files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.is_file() and matches(p.relative_to(folder).as_posix(), WEIGHTS))


def _run_root(run: str | os.PathLike) -> Path:
    root = Path(run).expanduser()
    if not root.is_dir() or not any(root.glob(f"*/{STAGE_FILE}")):
        raise FileNotFoundError(f"{run}: not a `gdr run` folder (no <stage>-<key>/{STAGE_FILE} in it); pass the "
                                "out= folder of a `gdr run`")
    return root


def _generators_done(root: Path) -> set[str]:
    """The keys of the fine-tuned query generators (``qg-*`` stages) of ``root`` that every stage reading them (the
    LM stages keyed by ``{"qg": key}``: score, doc-queries) finished with; a generator one of them still needs (a
    stage running or stopped) is not among them."""
    status: dict[str, set[str]] = {}
    for marker in root.glob(f"*/{STAGE_FILE}"):
        rec = _record(marker.parent)
        lm = ((rec or {}).get("inputs") or {}).get("lm")
        if isinstance(lm, dict) and isinstance(lm.get("qg"), str):
            status.setdefault(lm["qg"], set()).add(str(rec.get("status")))
    return {key for key, seen in status.items() if seen == {"complete"}}


def prunable(run: str | os.PathLike) -> list[_Train]:
    """The evaluated retrievers of ``run`` that still hold weight files: each ``train-*`` stage that is complete and
    whose weights an ``eval-*`` stage of the folder finished with (it recorded this stage's key and digest); and
    each fine-tuned query generator (``qg-*``) whose every reader finished (:func:`_generators_done`)."""
    root = _run_root(run)
    evaluated: set[tuple[str, str]] = set()  # (train folder, its digest) as complete evaluations recorded them
    for marker in root.glob(f"eval-*/{STAGE_FILE}"):
        rec = _record(marker.parent)
        if rec and rec.get("status") == "complete":
            evaluated |= {(name, d) for name, d in (rec.get("upstream") or {}).items() if name.startswith("train-")}
    out = []
    done = _generators_done(root)
    for marker in sorted([*root.glob(f"train-*/{STAGE_FILE}"), *root.glob(f"qg-*/{STAGE_FILE}")]):
        folder, rec = marker.parent, _record(marker.parent)
        if not rec or rec.get("status") != "complete":
            continue
        if (folder.name, _digest(rec)) not in evaluated and rec.get("key") not in done:
            continue
        require_format(rec, marker, root)
        weights = _weight_files(folder)
        if weights:
            out.append(_Train(folder, rec, weights))
    return out


def prune_run(run: str | os.PathLike) -> dict:
    """Drop the weights and optimiser states of every evaluated retriever of ``run`` (:func:`prunable`); returns
    ``{"pruned": [stage folders], "bytes": freed}``. Safe to repeat: a stage pruned before keeps its record, and
    weight files left by a prune cut short are removed."""
    root = _run_root(run)
    pruned, freed = [], 0
    with holding(root, "RUN"):  # one writer: a `gdr run` of this folder meanwhile is refused
        for t in prunable(root):
            rels = [p.relative_to(t.folder).as_posix() for p in t.weights]
            artifacts = dict(t.record.get("artifacts") or {})
            done = dict((t.record.get("pruned") or {}).get("files") or {})
            files = {**done, **{r: artifacts.pop(r) for r in rels if r in artifacts}}
            size = t.bytes
            # the record first: weight files on disk but not in artifacts are left over, never missing
            atomic_write_json(t.folder / STAGE_FILE, {
                **t.record, "artifacts": artifacts,
                "pruned": {"by": "gdr prune", "when": time.strftime("%Y-%m-%dT%H:%M:%S"), "digest": _digest(t.record),
                           "files": files, "bytes": sum(int(v["size"]) for v in files.values())}})
            for p in t.weights:
                p.unlink()
            for d in sorted({p.parent for p in t.weights}, key=lambda d: len(d.parts), reverse=True):
                if d != t.folder and not any(d.iterdir()):
                    d.rmdir()
            pruned.append(t.folder.name)
            freed += size
            log.info("gdr prune: %s: dropped %d weight and optimiser files (%.1f MiB); its evaluation stays",
                     t.folder.name, len(t.weights), size / _MIB)
    return {"pruned": pruned, "bytes": freed}


def _pack_files(root: Path) -> list[Path]:
    """Every file of the run folder but hidden ones (locks, temporary files), in a stable order. A symbolic link
    is refused by name: the pack carries the run's own files, and unpacking writes regular files only."""
    found = [p for p in root.rglob("*") if not any(x.startswith(".") for x in p.relative_to(root).parts)]
    link = next((p for p in found if p.is_symlink()), None)
    if link is not None:
        raise ValueError(f"{link}: a symbolic link in the run folder; a pack carries the run's own files only: "
                         "replace it by the file it points to, or move it out of the run folder")
    return sorted(p for p in found if p.is_file())


class _PackTooLarge(Exception):
    pass


class _Pieces:
    """A write-only stream cut into files ``gdr-pack.NN`` of at most ``piece`` bytes, at most ``n_max`` of them,
    each hashed as it is written."""

    def __init__(self, outdir: Path, piece: int, n_max: int):
        self.outdir, self.piece, self.n_max = outdir, piece, n_max
        self.pieces: list[dict] = []
        self._f = None
        self._h = None
        self._n = 0

    def _next(self) -> None:
        self._close()
        if len(self.pieces) >= self.n_max:
            raise _PackTooLarge
        name = f"{PIECE_PREFIX}{len(self.pieces):02d}"
        self._f, self._h, self._n = open(self.outdir / name, "wb"), hashlib.sha256(), 0
        self.pieces.append({"file": name})

    def _close(self) -> None:
        if self._f is not None:
            self._f.close()
            self.pieces[-1].update(bytes=self._n, sha256=self._h.hexdigest())
            self._f = None

    def write(self, data: bytes) -> int:
        view = memoryview(data)
        while len(view):
            if self._f is None or self._n == self.piece:
                self._next()
            part = view[: self.piece - self._n]
            self._f.write(part)
            self._h.update(part)
            self._n += len(part)
            view = view[len(part):]
        return len(data)

    def flush(self) -> None:
        if self._f is not None:
            self._f.flush()

    def close(self) -> list[dict]:
        self._close()
        return self.pieces


NEW_PACK = ".gdr-pack.new"  # a pack being written, inside OUTDIR until it is whole


def _refuse_another_runs_pack(out: Path, root: Path) -> None:
    """Refuse ``out`` when it holds the pack of a run of another name: a new pack replaces only its own run's."""
    try:
        old = json.loads((out / MANIFEST).read_text())
    except (OSError, ValueError):  # none (or damaged: one of this run's, cut short, is replaced)
        return
    if isinstance(old, dict) and old.get("run") not in (None, root.name):
        raise ValueError(f"{out}: holds the pack of run {old['run']!r}, not of {root.name!r}; pass another OUTDIR, "
                         f"or delete its {MANIFEST} and {PIECE_PREFIX}* files first")


def _clear_pack(outdir: Path) -> None:
    """Remove an earlier pack's manifest and pieces from ``outdir`` (nothing else)."""
    (outdir / MANIFEST).unlink(missing_ok=True)
    for p in outdir.glob(f"{PIECE_PREFIX}[0-9]*"):
        p.unlink()


def pack_run(run: str | os.PathLike, outdir: str | os.PathLike, *, prune: bool = False, piece_mib: float = PIECE_MIB,
             max_pieces: int = MAX_PIECES) -> dict:
    """Write the pruned run folder ``run`` into ``outdir`` as pieces ``gdr-pack.NN`` of at most ``piece_mib`` MiB
    (at most ``max_pieces``) and the manifest ``gdr-pack.json`` (each piece's size and SHA-256); returns the
    manifest. An unpruned run (an evaluated retriever still holding its weights) is refused, or pruned first with
    ``prune=True``; a run whose pack would not fit is refused with its size, and leaves no pieces."""
    root = _run_root(run)
    out = Path(outdir).expanduser()
    if out.resolve() == root.resolve() or root.resolve() in out.resolve().parents:
        raise ValueError(f"{outdir}: the pack goes outside the run folder {run}; pass another OUTDIR")
    if not (math.isfinite(piece_mib) and piece_mib * _MIB >= 1 and int(max_pieces) > 0):
        raise ValueError(f"piece_mib={piece_mib} (--piece-mib), max_pieces={max_pieces} (--max-pieces): both must be "
                         "positive (a piece of at least a byte)")
    if out.exists() and not out.is_dir():
        raise ValueError(f"{outdir}: exists and is not a folder; pass a new or existing folder as OUTDIR")
    piece, n_max = int(piece_mib * _MIB), int(max_pieces)
    with holding(root, "RUN"):
        _refuse_another_runs_pack(out, root)  # every refusal that needs no packing comes before --prune drops files
        files = _pack_files(root)
        left = prunable(root)
        if left and not prune:
            size = sum(t.bytes for t in left)
            raise ValueError(f"{run} is not pruned: {len(left)} evaluated retrievers still hold their weights "
                             f"({size / _MIB:.1f} MiB: {', '.join(t.folder.name for t in left[:3])}"
                             f"{' ...' if len(left) > 3 else ''}); run `gdr prune {run}` first, or pack with --prune "
                             "(prune=True) to prune it as part of packing")
        pruned = prune_run(root)["pruned"] if left else []
        if pruned:
            log.info("gdr pack: pruned %d evaluated retrievers first (--prune)", len(pruned))
        files = [p for p in files if p.exists()]  # less the weight files pruning dropped
        total = sum(p.stat().st_size for p in files)
        new = out / NEW_PACK  # the pack is written here, and replaces an earlier one only once it is whole
        shutil.rmtree(new, ignore_errors=True)
        new.mkdir(parents=True)
        stream = _Pieces(new, piece, n_max)
        try:
            with gzip.GzipFile(fileobj=stream, mode="wb", compresslevel=6, mtime=0) as gz, \
                    tarfile.open(fileobj=gz, mode="w|", format=tarfile.PAX_FORMAT) as tar:
                for p in files:
                    tar.add(p, arcname=p.relative_to(root).as_posix(), recursive=False)
            pieces = stream.close()
        except BaseException as e:  # too large, or stopped: no partial pack is left behind
            stream.close()
            shutil.rmtree(new, ignore_errors=True)
            if not isinstance(e, _PackTooLarge):
                raise
            raise ValueError(f"{run}: its pack does not fit in {n_max} pieces of {piece_mib:g} MiB "
                             f"({n_max * piece / _MIB:.0f} MiB): the run's files hold {total / _MIB:.1f} MiB "
                             f"({_largest(root, files)}){_pruned_note(pruned)}; {_too_large_advice(root)}, or "
                             f"allow more (--piece-mib, --max-pieces)") from None
        manifest = {"format": FORMAT, "kind": "gdr pack", "run": root.name, "files": len(files), "bytes": total,
                    "piece_bytes": piece, "pieces": pieces, "pruned_first": pruned,
                    "created": time.strftime("%Y-%m-%dT%H:%M:%S")}
        _clear_pack(out)
        for p in sorted(new.iterdir()):
            os.replace(p, out / p.name)
        new.rmdir()
        atomic_write_json(out / MANIFEST, manifest)  # last: the pack is whole
    packed = sum(p["bytes"] for p in pieces)
    log.info("gdr pack: %s: %d files, %.1f MiB, in %d pieces (%.1f MiB) and %s in %s", run, len(files), total / _MIB,
             len(pieces), packed / _MIB, MANIFEST, out)
    return manifest


def _pruned_note(pruned: Sequence[str]) -> str:
    return f" after pruning {len(pruned)} evaluated retrievers (--prune)" if pruned else ""


def _too_large_advice(root: Path) -> str:
    """What would make the pack of ``root`` smaller: the stages :func:`prune_run` keeps with their weights (a
    training stopped midway or not evaluated, a generator a stage still needs), which a rerun makes again, else
    pruning and fewer stages."""
    held = {d: w for d in sorted([*root.glob("train-*/"), *root.glob("qg-*/")]) if (w := _weight_files(d))}
    if held:
        size = sum(p.stat().st_size for w in held.values() for p in w)
        names = ", ".join(d.name for d in list(held)[:3]) + (" ..." if len(held) > 3 else "")
        return (f"stages that no finished evaluation stands on hold {size / _MIB:.1f} MiB of weights ({names}), "
                "which `gdr prune` keeps: delete their folders (a rerun trains them again under their keys)")
    return "prune it (`gdr prune`), pack a run of fewer stages"


def _largest(root: Path, files: Sequence[Path], n: int = 3) -> str:
    """The ``n`` largest top-level entries of the run among ``files``, with their MiB, for a refusal."""
    sizes: dict[str, int] = {}
    for p in files:
        top = p.relative_to(root).parts[0]
        sizes[top] = sizes.get(top, 0) + p.stat().st_size
    big = sorted(sizes.items(), key=lambda kv: -kv[1])[:n]
    return "largest: " + ", ".join(f"{k} {v / _MIB:.1f} MiB" for k, v in big)


class _Joined:
    """The pieces of a pack read as one stream, in order."""

    def __init__(self, paths: Sequence[Path]):
        self._paths, self._f = list(paths), None

    def read(self, size: int = -1) -> bytes:
        chunks, want = [], size
        while want != 0:
            if self._f is None:
                if not self._paths:
                    break
                self._f = open(self._paths.pop(0), "rb")
            data = self._f.read(want if want > 0 else -1)
            if not data or want < 0:
                chunks.append(data)
                self._f.close()
                self._f = None
                continue
            chunks.append(data)
            want -= len(data)
        return b"".join(chunks)

    def close(self) -> None:
        if self._f is not None:
            self._f.close()


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(_MIB), b""):
            h.update(block)
    return h.hexdigest()


def unpack_run(outdir: str | os.PathLike, dest: str | os.PathLike) -> dict:
    """Rebuild the run folder packed in ``outdir`` (:func:`pack_run`) at ``dest`` (a new or empty folder), after
    checking every piece's size and SHA-256 against ``gdr-pack.json``; returns the manifest. A missing or damaged
    piece is refused by name, before anything is written."""
    src = Path(outdir).expanduser()
    try:
        manifest = json.loads((src / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise FileNotFoundError(f"{src / MANIFEST}: {e.__class__.__name__}: {e}; pass the OUTDIR a `gdr pack` "
                                "wrote (its manifest and pieces gdr-pack.NN)") from None
    if manifest.get("kind") != "gdr pack" or not isinstance(manifest.get("pieces"), list):
        raise ValueError(f"{src / MANIFEST}: not a gdr pack manifest; pass the OUTDIR a `gdr pack` wrote")
    require_format(manifest, src / MANIFEST, src)
    paths = []
    for piece in manifest["pieces"]:
        p = src / piece["file"]
        if not p.is_file():
            raise FileNotFoundError(f"{p}: missing, one of the {len(manifest['pieces'])} pieces {MANIFEST} lists; "
                                    "copy every piece gdr-pack.NN beside it")
        if p.stat().st_size != piece["bytes"] or _sha256(p) != piece["sha256"]:
            raise ValueError(f"{p}: its size or SHA-256 differs from {MANIFEST}'s (damaged or cut short in "
                             f"transit, or of another pack than this one of run {manifest.get('run')!r}); copy it "
                             "again from where this manifest was packed")
        paths.append(p)
    target = Path(dest).expanduser().absolute()  # "." too: its name is the folder's
    if target.exists() and (not target.is_dir() or any(target.iterdir())):
        raise FileExistsError(f"{dest}: exists and is not an empty folder; unpack into a new or empty folder")
    tmp = target.with_name(f".{target.name}.unpacking-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    stream = _Joined(paths)
    try:
        with gzip.GzipFile(fileobj=stream, mode="rb") as gz, tarfile.open(fileobj=gz, mode="r|") as tar:
            tar.extractall(tmp, filter="data")  # relative regular files only: nothing lands outside ``dest``
        if target.exists():  # an empty folder stays (a shell may stand in it): the run's entries move into it
            for p in sorted(tmp.iterdir()):
                os.replace(p, target / p.name)
            tmp.rmdir()
        else:
            os.replace(tmp, target)
    except tarfile.TarError as e:  # a member unpacking refuses (a link, a path outside), or a cut-short stream
        shutil.rmtree(tmp, ignore_errors=True)
        raise ValueError(f"{src}: the pack cannot be unpacked ({e.__class__.__name__}: {e}); pack the run again "
                         "with this gdr") from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    finally:
        stream.close()
    n = sum(1 for p in target.rglob("*") if p.is_file())
    bad = _unlike_records(target)
    if n != manifest.get("files") or bad:
        raise ValueError(f"{dest}: {n} files unpacked of {manifest.get('files')} packed"
                         f"{f', {bad}' if bad else ''}; the pack is damaged: pack the run again")
    log.info("gdr unpack: %s -> %s: %d files checked against %s", src, target, n, MANIFEST)
    return manifest


def _unlike_records(folder: Path) -> str | None:
    """The first file of a finished stage of ``folder`` missing or of another size than its ``stage.json`` records
    (``path: what``), or None."""
    for marker in sorted(folder.glob(f"*/{STAGE_FILE}")):
        rec = _record(marker.parent)
        if rec and rec.get("status") == "complete":
            bad = verify_files(marker.parent, rec.get("artifacts") or {}, checksum=False)
            if bad is not None:
                return f"{marker.parent.name}/{bad[0]}: {bad[1]}"
    return None
