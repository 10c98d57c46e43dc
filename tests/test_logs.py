"""The quiet log (gdr.logs): other libraries' chatter below WARNING is dropped unless --verbose."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

NOISE = """
import logging, sys
from gdr.logs import setup_logging, warn_once
setup_logging(verbose={verbose})
logging.getLogger("faiss.loader").info("Loading faiss with AVX2 support.")
logging.getLogger("pytorch_lightning.utilities.rank_zero").info("Tip: try litlogger")
logging.getLogger("bm25s").debug("Building index from IDs objects")
logging.getLogger("transformers.modeling_utils").warning("BertModel LOAD REPORT from: x")
logging.getLogger("some.lib").warning("a real warning")
logging.getLogger("gdr.stages.score").info("gdr line")
import warnings
warnings.warn_explicit("batches smaller than the logging interval", UserWarning, "fit_loop.py", 321,
                       module="pytorch_lightning.loops.fit_loop")
for _ in range(3):
    warn_once(logging.getLogger("gdr.data.bbc"), "%s: not UTF-8, decoded as %s", "199.txt", "latin-1")
"""


def _stderr(verbose: bool) -> str:
    return subprocess.run([sys.executable, "-c", NOISE.format(verbose=verbose)], capture_output=True, text=True,
                          check=True, cwd=ROOT, env={"PATH": "/usr/bin:/bin"}).stderr


def test_quiet_log_keeps_gdr_lines_and_warnings_only():
    err = _stderr(False)
    for gone in ("faiss", "Tip:", "bm25s", "LOAD REPORT", "logging interval"):
        assert gone not in err, err
    assert "a real warning" in err and "gdr line" in err
    assert err.count("decoded as latin-1") == 1
    assert len(err.splitlines()) == 3 and all(line.split(" ")[2].rstrip(":") in ("gdr.stages.score", "gdr.data.bbc",
                                                                             "some.lib") for line in err.splitlines()), err


def test_verbose_log_shows_everything():
    err = _stderr(True)
    for shown in ("faiss", "Tip:", "LOAD REPORT", "a real warning", "gdr line", "logging interval"):
        assert shown in err, err
