"""Stage ``index add``: grow a GC index by the documents of a P folder scored against the same queries.

:func:`add_to_index` reads the index (its manifest's checksums, ``tree_state.npz``, ``docids.tsv``) and the P
folder, checks the P's queries against the index's by content, places the documents with the kernel
(:func:`gdr.indexing.add.place_documents`) and rewrites the index's files; :func:`next_steps` and
:func:`every_document` read the saved configs of the index and of each added run for the corpus a retriever of
every code trains on.
"""
from __future__ import annotations

import json
import logging
import os
import shlex
import shutil
from pathlib import Path

from gdr.data import Corpus, corpus_from_config
from gdr.data.beir import corpus_jsonl
from gdr.formats import STAGE_FILE
from gdr.guard import LOCK_FILE
from gdr.indexing.add import AddResult, place_documents
from gdr.indexing.docids import format_code, read_docids, write_docids
from gdr.indexing.options import GCOptions
from gdr.indexing.state import TreeState, load_tree_state, save_tree_state
from gdr.indexing.summary import summarize, write_summary
from gdr.io import (
    atomic_write_json,
    atomic_write_text,
    check_manifest_files,
    read_manifest,
    refresh_manifest_files,
    write_manifest,
)
from gdr.rerun import RerunCommand, data_overrides, saved_data
from gdr.store import load_run

__all__ = ["add_to_index", "check_same_queries", "next_steps", "every_document", "DOCUMENTS_FILE"]

log = logging.getLogger(__name__)

DOCUMENTS_FILE = "documents.jsonl"  # every document of a grown index, for training a retriever on every code


def _update_tree_json(path: Path, new_codes: list[tuple[int, ...]]) -> list[dict]:
    with open(path, encoding="utf-8") as f:
        tree = json.load(f)
    by_path = {n["path"]: n for n in tree["nodes"]}
    for code in new_codes:
        leaf = code[:-1]
        for d in range(len(leaf) + 1):
            p = format_code(leaf[:d])
            if p not in by_path:  # a leaf opened by this add
                rec = {"path": p, "depth": d, "size": 0, "children": 0, "added": True}
                tree["nodes"].append(rec)
                by_path[p] = rec
                by_path[format_code(leaf[:d - 1])]["children"] += 1
            by_path[p]["size"] += 1
    tree["n_docs"] += len(new_codes)
    tree["depth"] = max(tree["depth"], max((len(c) for c in new_codes), default=0))
    atomic_write_json(path, tree)
    return tree["nodes"]


def check_same_queries(st: TreeState, run, index_dir: Path) -> None:
    """Refuse a P whose columns are not the queries the index was built on, by content (the texts of the first J
    queries and the model that scored them), naming both sources."""
    want, have = st.meta["queries"], run.query_identity()
    fix = _RescoreAdvice(run.path, want["source"])
    if want["texts_hash"] != have["texts_hash"]:
        raise ValueError(f"{run.path / 'queries.jsonl'}: the new documents were scored against other queries "
                         f"({have['n_queries']} queries sampled in {have['source']}) than the index in "
                         f"{index_dir} was built on ({want['n_queries']} queries sampled in {want['source']}); {fix}")
    if want.get("scorer") and have.get("scorer") and want["scorer"] != have["scorer"]:
        a, b = want["scorer"], have["scorer"]
        diff = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
        raise ValueError(f"{run.path / 'P.manifest.json'}: the new documents were scored by another model "
                         f"({', '.join(f'{k}={b.get(k)!r}' for k in diff)}) than the index in {index_dir} "
                         f"({', '.join(f'{k}={a.get(k)!r}' for k in diff)}); {fix}")


class _RescoreAdvice:
    """The ``gdr score`` command that scores the new documents of ``run_dir`` (their corpus read from its saved
    config) against the queries of ``source`` into a new folder; worked out only when a refusal is formatted."""

    def __init__(self, run_dir: Path, source: str | None):
        self.run_dir, self.source = Path(run_dir), source

    def __str__(self) -> str:
        data = saved_data(self.run_dir)
        if data is None or self.source is None:
            return ("score the new documents against the index's queries with `gdr score queries_from=<the index's "
                    "run>` and their data= settings (it takes the run's model settings)")
        args = ["gdr score", f"queries_from={shlex.quote(str(self.source))}", *data_overrides("score", data),
                f"out={shlex.quote(str(self.run_dir) + '-rescored')}"]
        return f"score the new documents against the same queries: `{' '.join(args)}` (it takes the run's model " \
               "settings)"

    __format__ = lambda self, spec: format(str(self), spec)  # noqa: E731


def every_document(index_dir: str | os.PathLike) -> Path | None:
    """Write ``<index_dir>/documents.jsonl``: the documents of the index (those it was built on, then those of each
    ``gdr index add``, read from the saved configs of their runs) in ``docids.tsv`` order, the corpus a retriever
    of every code trains on; None (and nothing written) where a corpus cannot be read or the ids disagree."""
    index_dir = Path(index_dir)
    adds = sorted(index_dir.glob("manifest.add-*.json"), key=lambda p: int(p.stem.rsplit("-", 1)[1]))
    sources = [saved_data(index_dir)] + [saved_data((read_manifest(index_dir, p.name) or {}).get("run", ""))
                                         for p in adds]
    if any(d is None for d in sources):
        return None
    try:
        parts = [corpus_from_config(d) for d in sources]
        titles = [t for c in parts for t in (c.titles or [None] * len(c))]
        labels = [x for c in parts for x in (c.labels or [None] * len(c))]
        union = Corpus("documents", [d for c in parts for d in c.doc_ids], [x for c in parts for x in c.texts],
                       titles=titles if any(titles) else None, labels=labels if all(labels) else None)
    except (OSError, ValueError) as e:
        log.warning("%s: the documents of the index could not be read again (%s)", index_dir, e)
        return None
    if union.doc_ids != read_docids(index_dir / "docids.tsv")[0]:
        log.warning("%s: the documents of the saved configs are not those of docids.tsv", index_dir)
        return None
    atomic_write_text(index_dir / DOCUMENTS_FILE, corpus_jsonl(union))
    return index_dir / DOCUMENTS_FILE


def next_steps(index_dir: str | os.PathLike, run_dir: str | os.PathLike) -> str:
    """What to do after ``gdr index add`` of the run ``run_dir``: the retriever has to learn the new codes, trained
    on every document (:func:`every_document`) into ``<run_dir>-train``."""
    head = ("next: a retriever finds the new documents only once it is trained on them (the old documents keep "
            "their codes); train one on every document, old and new")
    docs = every_document(index_dir)
    docids = Path(index_dir) / "docids.tsv"
    if docs is None:
        return f"{head}, with gdr train docids={docids} and data= a corpus of them all (README: Your own corpus)"
    cmd = " ".join(["gdr train data=jsonl", f"data.path={shlex.quote(str(docs))}",
                    f"docids={shlex.quote(str(docids))}", f"out_dir={shlex.quote(str(run_dir) + '-train')}"])
    return f"{head} ({docs.name}, written by this command): `{cmd}`"


COPIED_FROM = "copied_from.json"  # written last into a copy an add grows (``out=``): the copy is whole
COPYING = ".copying_from.json"  # written first into it, removed once it is whole: a copy cut short is made again


def _copy_index(index_dir: Path, out: Path) -> Path:
    """``out``, holding a copy of the index in ``index_dir`` (its files but a ``gdr run`` stage's record and lock),
    made here unless an earlier add made it (a rerun continues in it); a folder holding anything else is refused."""
    source = str(index_dir.resolve())
    mark = read_manifest(out, COPIED_FROM) if (out / COPIED_FROM).is_file() else None
    if mark is not None and mark.get("index") == source:
        return out
    copying = read_manifest(out, COPYING) if (out / COPYING).is_file() else None
    if copying is not None and copying.get("index") == source:  # a copy of this index cut short: made again
        for f in out.iterdir():
            if f.name not in (LOCK_FILE, COPYING) and f.is_file():
                f.unlink()
    elif out.exists() and any(p.name != LOCK_FILE for p in out.iterdir()):
        raise FileExistsError(f"out={out} holds files that are not a copy of {index_dir}: pass a new folder")
    if not (index_dir / "docids.tsv").is_file():
        raise FileNotFoundError(f"index={index_dir}: no docids.tsv; point index= at a GC index folder")
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_json(out / COPYING, {"index": source})
    for f in index_dir.iterdir():
        if f.name not in (STAGE_FILE, LOCK_FILE, BACKUP_DIR) and f.is_file():
            shutil.copy2(f, out / f.name)
    atomic_write_json(out / COPIED_FROM, {"index": source})
    (out / COPYING).unlink()
    log.info("copied the index %s to %s, which grows", index_dir, out)
    return out


BACKUP_DIR = ".add-backup"  # the files an add rewrites, as they were before it, until it is whole
_REWRITTEN = ("docids.tsv", "tree_state.npz", "tree.json", "manifest.json")
_COPIED = "copied"  # written last into BACKUP_DIR: the copies are whole


def _back_up(index_dir: Path) -> None:
    """Copy the files an add rewrites into ``BACKUP_DIR``, then mark the copies whole."""
    backup = index_dir / BACKUP_DIR
    shutil.rmtree(backup, ignore_errors=True)
    backup.mkdir()
    for name in _REWRITTEN:
        if (index_dir / name).exists():
            shutil.copy2(index_dir / name, backup / name)
    atomic_write_text(backup / _COPIED, "\n".join(n for n in _REWRITTEN if (backup / n).exists()) + "\n")


def _undo_interrupted_add(index_dir: Path) -> None:
    """Put back the files of an add cut short (``BACKUP_DIR`` marked whole), so the index is as it was before it;
    copies not marked whole are dropped: the add stopped before it rewrote anything."""
    backup = index_dir / BACKUP_DIR
    if not backup.is_dir():
        return
    if (backup / _COPIED).is_file():
        names = (backup / _COPIED).read_text().split()
        missing = [n for n in names if not (backup / n).is_file()]
        if missing:
            raise FileNotFoundError(f"{index_dir}: the copy of {missing[0]} that would undo a gdr index add cut short "
                                    f"is gone from {backup}; rebuild the index with gdr index into a new folder")
        for name in names:  # copied back, each in one replace: the copies stay until every file is back
            tmp = index_dir / f".{name}.restoring"
            shutil.copy2(backup / name, tmp)
            os.replace(tmp, index_dir / name)
        n_docs = len(read_docids(index_dir / "docids.tsv")[0])
        for record in index_dir.glob("manifest.add-*.json"):  # the cut add's own, if it got that far: the one record
            if read_manifest(index_dir, record.name).get("n_total", 0) > n_docs:  # of more documents than are back
                record.unlink()
        log.warning("%s: a gdr index add was cut short; its files are put back as they were before it", index_dir)
    _drop_backup(index_dir)


def _drop_backup(index_dir: Path) -> None:
    """Remove ``BACKUP_DIR``: its mark first, so that a kill midway leaves copies no later add puts back."""
    (index_dir / BACKUP_DIR / _COPIED).unlink(missing_ok=True)
    shutil.rmtree(index_dir / BACKUP_DIR)


def add_to_index(index_dir: str | os.PathLike, run_dir: str | os.PathLike, *, chunk_rows: int = GCOptions.chunk_rows,
                 plot: bool = True, out: str | os.PathLike | None = None) -> AddResult:
    """Add the documents of P-matrix run ``run_dir`` to the GC index in ``index_dir``.

    Rewrites ``docids.tsv`` (old lines, then the new ones), ``tree_state.npz``, ``tree.json`` and the
    summary, each atomically, and writes ``manifest.add-<n>.json``. Those files are copied first
    (:data:`BACKUP_DIR`): an add cut short (a kill) is undone by the next one, which then runs whole.

    ``out``: grow a copy of the index there instead (:func:`_copy_index`), as a ``gdr run`` stage folder must be
    grown: ``gdr run`` rebuilds a stage whose files changed, which would drop the added documents.
    """
    index_dir = Path(index_dir)
    if out is not None and Path(out).resolve() != index_dir.resolve():
        index_dir = _copy_index(index_dir, Path(out))
    if (index_dir / STAGE_FILE).exists():
        raise ValueError(f"{index_dir} is a stage of `gdr run`, which rebuilds it (dropping added documents) once its "
                         f"files change: grow a copy of it, `gdr index add ... index={index_dir} out=<new folder>`")
    _undo_interrupted_add(index_dir)
    check_manifest_files(index_dir, fix=RerunCommand("index", index_dir, "rebuild the index with `{}`"))
    st = load_tree_state(index_dir / "tree_state.npz")  # of the current format (gdr.upgrade.refuse_format_0_gc_index)
    run = load_run(run_dir, require_manifest=False)
    if run.pmatrix.n_cols < st.n_queries:
        raise ValueError(f"{run.path}: P has {run.pmatrix.n_cols} query columns, but the index in {index_dir} was "
                         f"built on J={st.n_queries} queries; {_RescoreAdvice(run.path, st.meta['queries']['source'])}")
    run = run.first_queries(st.n_queries)
    check_same_queries(st, run, index_dir)
    old_ids, old_codes = read_docids(index_dir / "docids.tsv")
    known = set(old_ids)
    dup = next((d for d in run.doc_ids if d in known), None)
    if dup is not None:
        raise ValueError(f"doc id {dup!r} of {run.path / 'doc_ids.json'} is already in {index_dir / 'docids.tsv'}; "
                         "drop already indexed documents from the new run")
    codes, stats = place_documents(st, run.pmatrix, chunk_rows=chunk_rows)
    _back_up(index_dir)
    save_tree_state(index_dir / "tree_state.npz", st)
    write_docids(index_dir / "docids.tsv", old_ids + run.doc_ids, old_codes + codes)
    nodes = _update_tree_json(index_dir / "tree.json", codes)
    summary = summarize(old_codes + codes, nodes, st.n_clusters, st.leaf_size, method="gc")
    write_summary(index_dir, summary, plot=plot)
    refresh_manifest_files(index_dir)  # the files changed on purpose: record their new sizes and checksums
    n_prev = len(list(index_dir.glob("manifest.add-*.json")))
    write_manifest(index_dir, name=f"manifest.add-{n_prev + 1}.json", command="index add", run=str(run.path),
                   n_added=len(codes), n_total=len(old_codes) + len(codes), **stats)
    _drop_backup(index_dir)  # the add is whole: nothing to undo
    log.info("added %d documents to %s (%d redirected from a full leaf, %d new leaves)", len(codes), index_dir,
             stats["n_redirected"], stats["n_new_leaves"])
    return AddResult(doc_ids=list(run.doc_ids), codes=codes, **stats)
