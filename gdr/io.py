"""Artifact helpers: atomic writes, manifests, content hashes."""
from __future__ import annotations

import errno
import hashlib
import json
import logging
import mmap
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
import zlib
from pathlib import Path
from typing import Any, Iterable

from gdr import __version__
from gdr.paths import checkout
from gdr.rerun import flat_leaves

__all__ = [
    "NoSpace",
    "no_space",
    "atomic_write_text",
    "atomic_write_json",
    "write_jsonl",
    "read_jsonl",
    "hash_strings",
    "write_manifest",
    "read_manifest",
    "recorded_identity",
    "what_differs",
    "file_digest",
    "bytes_digest",
    "record_files",
    "verify_files",
    "check_manifest_files",
    "refresh_manifest_files",
]


_UMASK = os.umask(0)
os.umask(_UMASK)


_NO_SPACE = (errno.ENOSPC, errno.EDQUOT)


class NoSpace(OSError):
    """A write that met a full disk (or a quota): the file it was writing (``filename``), the bytes the whole
    file needs (``needed``) and the bytes free on that disk when it failed (``free``; None when unknown)."""

    def __init__(self, errno_: int, path: str | os.PathLike, needed: int | None, free: int | None):
        super().__init__(errno_, os.strerror(errno_), str(path))
        self.needed, self.free = needed, free


def no_space(exc: BaseException, path: str | os.PathLike, needed: int | None) -> NoSpace | None:
    """A :class:`NoSpace` for ``path`` when ``exc`` or an exception it was raised from (torch's writer raises a
    RuntimeError while handling the OSError of a full disk) is ENOSPC or EDQUOT; else None."""
    seen = exc
    while seen is not None and not (isinstance(seen, OSError) and seen.errno in _NO_SPACE):
        seen = seen.__cause__ or seen.__context__
    if seen is None:
        return None
    try:
        free = shutil.disk_usage(Path(path).parent).free
    except OSError:
        free = None
    return NoSpace(seen.errno, path, needed, free)


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    """Write ``text`` to ``path`` so that a reader never sees a half-written file (a full disk raises
    :class:`NoSpace` and leaves the previous file as it was)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    data = text.encode("utf-8")
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.chmod(tmp, 0o666 & ~_UMASK)  # mkstemp makes 0600; artifacts get the usual permissions
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as e:
        if os.path.exists(tmp):
            os.unlink(tmp)
        full = no_space(e, path, len(data))
        if full is not None:
            raise full from e
        raise


def atomic_write_json(path: str | os.PathLike, obj: Any) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, ensure_ascii=False, default=str) + "\n")


def write_jsonl(path: str | os.PathLike, rows: Iterable[dict]) -> None:
    """Atomically write one JSON object per line."""
    atomic_write_text(path, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))


def read_jsonl(path: str | os.PathLike, drop_torn_tail: bool = False) -> list[dict]:
    """Read a JSON-lines file; a bad line raises an error naming the file and line.

    ``drop_torn_tail``: for append-only files of resumable jobs, an unparsable *last* line (a write cut
    short by a kill) is dropped with a warning instead; a bad line anywhere else is still an error.
    """
    with open(path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    last = max((i for i, ln in enumerate(lines) if ln.strip()), default=-1)
    rows = []
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as e:
            if drop_torn_tail and i == last:
                logging.getLogger(__name__).warning("%s:%d: dropping a torn last line left by an interrupted run",
                                                    path, i + 1)
                break
            raise ValueError(f"{path}:{i + 1}: not valid JSON ({e.msg}); fix or delete that line") from e
    return rows


def hash_strings(items: Iterable[str]) -> str:
    """Order-sensitive SHA-256 (first 16 hex digits) of a sequence of strings."""
    h = hashlib.sha256()
    for s in items:
        b = s.encode("utf-8")
        h.update(len(b).to_bytes(8, "little"))
        h.update(b)
    return h.hexdigest()[:16]


def _git_commit() -> str | None:
    """The commit of the checkout gdr runs from; None when installed (its site-packages may sit in another
    project's repository, whose commit is not gdr's)."""
    root = checkout()
    if root is None:
        return None
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=5)
        return out.stdout.strip() or None
    except Exception:
        return None


def write_manifest(out_dir: str | os.PathLike, name: str = "manifest.json", files: Iterable[str] = (),
                   **fields: Any) -> dict:
    """Write ``fields`` plus provenance (time, versions, git commit, argv) to ``out_dir/name``.

    ``files``: paths relative to ``out_dir`` (or glob patterns) whose size and checksum are recorded under
    ``"files"``, for :func:`check_manifest_files` to verify before they are used."""
    import numpy  # lazy: `gdr --help`, `import gdr` stay light
    import torch  # lazy: `gdr --help`, `import gdr` stay light

    manifest = dict(fields)
    if files:
        out = Path(out_dir)
        names = sorted({p.relative_to(out).as_posix() for pat in files for p in out.glob(pat) if p.is_file()})
        manifest["files"] = {n: file_digest(out / n) for n in names}
    manifest["provenance"] = {
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "gdr": __version__,
        "git_commit": _git_commit(),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "torch": torch.__version__,
        "numpy": numpy.__version__,
        "argv": sys.argv,
    }
    atomic_write_json(Path(out_dir) / name, manifest)
    return manifest


_INPUT_WORDS = {"doc_ids_hash": "the documents (their ids)", "texts_hash": "the documents' texts",
                "queries_hash": "the queries' texts", "doc_texts_hash": "the documents' texts"}


def what_differs(old: dict, new: dict, keys=None, inputs: dict | None = None) -> str:
    """The entries of ``keys`` (default: all of both) in which manifest ``old`` and identity ``new`` differ, as a
    reader names them: an input hash by what it hashes (``the documents' texts``; ``inputs`` maps a key to those
    words, else the manifests' hash keys are named), a setting with both values (``n_queries (8 -> 12)``), a nested
    section by the full dotted name of each leaf that differs (``lm.prompt.prefix ('a' -> 'b')``)."""
    def short(v) -> str:
        text = repr(v)
        return text if len(text) <= 40 else text[:37] + "..."

    def leaves(k: str, v, other) -> dict:  # a section flattened where both sides have one
        return flat_leaves(v, f"{k}.") if isinstance(v, dict) and isinstance(other, dict) else {k: v}

    words = _INPUT_WORDS if inputs is None else inputs
    keys = sorted(set(old) | set(new)) if keys is None else list(keys)
    new = json.loads(json.dumps({k: new.get(k) for k in keys}, default=str))
    out = []
    for k in keys:
        a, b = old.get(k), new[k]
        if a == b:
            continue
        if k in words:
            out.append(words[k])
            continue
        la, lb = leaves(k, a, b), leaves(k, b, a)
        out += [f"{x} ({short(la.get(x))} -> {short(lb.get(x))})" for x in sorted(set(la) | set(lb))
                if la.get(x) != lb.get(x)]
    return ", ".join(out)


def recorded_identity(out: Path, command: str, option: str = "out") -> dict | None:
    """The ``identity`` (what its outputs are a function of) that ``out``'s manifest records of an earlier
    ``gdr <command>`` there; None where there is no manifest or it records none (an earlier gdr's). A manifest of
    another command is refused, naming it."""
    old = read_manifest(out)
    if old is None:
        return None
    if old.get("command") != command:
        raise FileExistsError(f"{option}={out} holds the output of `gdr {old.get('command')}`, not of `gdr {command}`: "
                              f"pass another {option}")
    return old.get("identity")


def read_manifest(out_dir: str | os.PathLike, name: str = "manifest.json") -> dict | None:
    p = Path(out_dir) / name
    if not p.exists():
        return None
    with open(p, encoding="utf-8") as f:
        return json.load(f)


# ------------------------------------------------------------------------------------- content integrity
# Every artifact gets its size and a CRC-32 recorded when it is finished, and both are checked before it is
# reused. The threat is accidental damage (a cut-short write, a flipped bit, an edited or duplicated line),
# which size + CRC-32 catch, as in zip, gzip and PNG; CRC-32 (zlib) runs at 2.4 GiB/s on one core of the
# 2-core dev box, 5x BLAKE2b (0.45 GiB/s) and 3x SHA-256 (0.86 GiB/s, SHA-NI): hashing the two exported
# retrievers of the demo with BLAKE2b alone added ~8% to re-entering the finished run (the budget is 5%).
# A file is checksummed through a read-only mmap, so nothing is copied.
def bytes_digest(data) -> str:
    """CRC-32 (8 hex digits) of a bytes-like object (bytes, memoryview, C-contiguous numpy array)."""
    return f"{zlib.crc32(memoryview(data).cast('B')):08x}"


def file_digest(path: str | os.PathLike) -> dict:
    """``{"size": bytes, "crc32": 8 hex digits}`` of a file, read through a read-only mmap."""
    size = os.path.getsize(path)
    crc = 0
    if size:
        with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
            crc = zlib.crc32(m)
    return {"size": size, "crc32": f"{crc:08x}"}


def _artifact_files(folder: Path, exclude: Iterable[str]) -> list[Path]:
    """Regular files under ``folder`` (recursively), minus hidden names (temp files, locks) and ``exclude``."""
    skip = set(exclude)
    out = []
    for p in sorted(folder.rglob("*")):
        rel = p.relative_to(folder)
        if any(part.startswith(".") for part in rel.parts) or rel.as_posix() in skip or not p.is_file():
            continue
        out.append(p)
    return out


def record_files(folder: str | os.PathLike, exclude: Iterable[str] = ()) -> dict[str, dict]:
    """Size and checksum of every file under ``folder``: ``{relative path: file_digest}``."""
    folder = Path(folder)
    return {p.relative_to(folder).as_posix(): file_digest(p) for p in _artifact_files(folder, exclude)}


def verify_files(folder: str | os.PathLike, record: dict[str, dict],
                 checksum: bool | Iterable[str] = True) -> tuple[str, str] | None:
    """Check the files of ``record`` (from :func:`record_files`) under ``folder``.

    Sizes are always compared; checksums of all files (``True``), of none (``False``) or of the relative
    paths given. Returns ``None`` when all match, else ``(relative path, what is wrong)`` for the first
    damaged file.
    """
    folder = Path(folder)
    for rel, want in record.items():
        p = folder / rel
        if not p.is_file():
            return rel, "missing"
        size = os.path.getsize(p)
        if size != want["size"]:
            return rel, f"size {size:,} bytes, {want['size']:,} recorded"
    if checksum is not False:
        for rel, want in record.items():
            if checksum is not True and rel not in checksum:
                continue
            if file_digest(folder / rel)["crc32"] != want["crc32"]:
                return rel, "checksum differs from the one recorded (content changed)"
    return None


def check_manifest_files(folder: str | os.PathLike, only: Iterable[str] | None = None, name: str = "manifest.json",
                         fix: object = "") -> None:
    """Verify the files recorded in ``folder/name`` (by ``write_manifest(files=...)``), or those of ``only``
    among them; a damaged one raises an error naming it, what is wrong and ``fix`` (a string, or an object
    whose ``str`` is worked out only then, such as :class:`gdr.rerun.RerunCommand`). Folders without such a
    record (other tools, older versions) pass."""
    try:
        man = read_manifest(folder, name)
    except (ValueError, OSError):
        man = None
    rec = (man or {}).get("files") or {}
    if only is not None:
        keep = set(only)
        rec = {k: v for k, v in rec.items() if k in keep}
    bad = verify_files(folder, rec)
    if bad is not None:
        raise ValueError(f"{Path(folder) / bad[0]}: {bad[1]} (recorded in {name}: the file changed after it was "
                         f"written){f'; {fix}' if fix else ''}")


def refresh_manifest_files(folder: str | os.PathLike, name: str = "manifest.json") -> None:
    """Re-record the sizes and checksums of the files listed in ``folder/name`` (after a deliberate update)."""
    folder = Path(folder)
    man = read_manifest(folder, name)
    if man and man.get("files"):
        man["files"] = {n: file_digest(folder / n) for n in man["files"] if (folder / n).is_file()}
        atomic_write_json(folder / name, man)
