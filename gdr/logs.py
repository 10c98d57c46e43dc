"""Logging for gdr: its own lines readable, other libraries' chatter kept out.

:func:`setup_logging` (called by every ``gdr`` command, by the processes it starts, and available to
scripts) prints gdr's records (``gdr.*``, ``eval.*``, ``indexing.*``, ``training.*``) at INFO and the
records of every other library only from WARNING up: faiss's loader lines, Lightning's "GPU available"
lines and tips (and its ``warnings.warn`` advice), bm25s's DEBUG line, sentence-transformers' "Load
pretrained ..." go. transformers' LOAD
REPORT table (a WARNING printed for every checkpoint loaded into another architecture on purpose, such as
the retriever's first MiniLM layers) and its "Loading weights" bar go too (``HF_HUB_DISABLE_PROGRESS_BARS=0``
keeps the bar). ``verbose=True`` (``gdr ... --verbose``) shows all of it.

:func:`on_terminal`: whether a progress bar drawn on a stream is seen on a terminal rather than written, one
redraw a line, into a log file (``gdr run ... > run.log 2>&1``).

:func:`warn_once`: a warning about the data (a file decoded as latin-1, empty documents) is logged once
per process, however often the corpus is loaded.
"""
from __future__ import annotations

import contextlib
import logging
import os
import sys
import warnings
from typing import Iterator

__all__ = ["setup_logging", "quiet_loading", "warn_once", "log_once", "OWN_LOGGERS", "on_terminal"]

OWN_LOGGERS = ("gdr", "__main__")
# Libraries that attach their own handler or level (records do not reach the root filter): their level is set.
_LOUD = ("pytorch_lightning", "lightning", "lightning.pytorch", "lightning_fabric", "lightning.fabric", "bm25s",
         "faiss", "faiss.loader", "sentence_transformers", "jax", "torch.distributed")
# jax (imported by some transformers paths) probes for a TPU on every GPU machine and warns that there is none.
_ERRORS_ONLY = ("jax._src.xla_bridge",)
_warned: set[tuple[str, str]] = set()


def _own(name: str) -> bool:
    return any(name == n or name.startswith(n + ".") for n in OWN_LOGGERS)


class _Quiet(logging.Filter):
    """On the root handler: other libraries' records below WARNING are dropped."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= logging.WARNING or _own(record.name)


class _NoLoadReport(logging.Filter):
    """transformers' LOAD REPORT table (on ``transformers.modeling_utils``)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "LOAD REPORT" not in str(record.msg)


_FILTERS: dict[str, logging.Filter] = {}


def setup_logging(level: str = "INFO", verbose: bool | None = None) -> None:
    """gdr's log format on the root logger; other libraries at WARNING unless ``verbose``.

    ``verbose=None``: as ``$GDR_VERBOSE`` says (set by a verbose call, so the processes a command starts
    inherit it). Idempotent: a second call changes only the verbosity."""
    if verbose is None:
        verbose = os.environ.get("GDR_VERBOSE", "") not in ("", "0")
    elif verbose:
        os.environ["GDR_VERBOSE"] = "1"
    logging.basicConfig(
        level=getattr(logging, level.upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
    )
    root = logging.getLogger()
    quiet = _FILTERS.setdefault("quiet", _Quiet())
    for h in root.handlers:
        (h.removeFilter if verbose else h.addFilter)(quiet)
    for name in _LOUD:
        logging.getLogger(name).setLevel(logging.NOTSET if verbose else logging.WARNING)
    for name in _ERRORS_ONLY:
        logging.getLogger(name).setLevel(logging.NOTSET if verbose else logging.ERROR)
    tf = logging.getLogger("transformers.modeling_utils")
    report = _FILTERS.setdefault("report", _NoLoadReport())
    (tf.removeFilter if verbose else tf.addFilter)(report)
    if not verbose:  # Lightning's advice by warnings.warn (logging interval, deprecations inside Lightning itself)
        warnings.filterwarnings("ignore", module=r"(pytorch_)?lightning(_fabric)?(\.|$)")
    if not verbose:  # transformers' "Loading weights" bar for every checkpoint (read at import; set both ways)
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
        if "transformers.utils.logging" in sys.modules and os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] == "1":
            sys.modules["transformers.utils.logging"].disable_progress_bar()
    if verbose:  # transformers keeps a handler of its own at WARNING; --verbose shows its INFO lines too
        try:
            from transformers.utils import logging as tf_logging  # lazy: `gdr --help`, `import gdr` stay light

            tf_logging.set_verbosity_info()
        except ImportError:
            pass


@contextlib.contextmanager
def quiet_loading() -> Iterator[None]:
    """transformers' "Loading weights" bar off while a checkpoint loads, restored after: the Python API as quiet
    as the commands (:func:`setup_logging`) without touching the caller's logging. ``GDR_VERBOSE`` or
    ``HF_HUB_DISABLE_PROGRESS_BARS=0`` keeps the bar."""
    from transformers.utils import logging as tf_logging  # lazy: `gdr --help`, `import gdr` stay light

    keep = os.environ.get("HF_HUB_DISABLE_PROGRESS_BARS") == "0" or os.environ.get("GDR_VERBOSE", "") not in ("", "0")
    if keep or not tf_logging.is_progress_bar_enabled():
        yield
        return
    tf_logging.disable_progress_bar()
    try:
        yield
    finally:
        tf_logging.enable_progress_bar()


def warn_once(logger: logging.Logger, msg: str, *args) -> None:
    """``logger.warning(msg, *args)`` unless this process logged the same line already."""
    log_once(logger, logging.WARNING, msg, *args)


def log_once(logger: logging.Logger, level: int, msg: str, *args) -> None:
    """``logger.log(level, msg, *args)`` unless this process logged the same line already (a corpus loaded
    by several stages of one run says what it found once)."""
    key = (logger.name, msg % args if args else msg)
    if key in _warned:
        return
    _warned.add(key)
    logger.log(level, msg, *args)


def on_terminal(stream=None) -> bool:
    """Whether ``stream`` (default ``sys.stderr``) is a terminal: a bar that redraws itself in place is shown
    there, while in a file or a pipe each redraw would stay as a line of the log."""
    stream = sys.stderr if stream is None else stream
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False
