"""Jobs for the tests of :func:`gdr.training.concurrent.run_concurrently`, in a module of their own: a spawned slot
imports the module of each job it unpickles, and this one imports the standard library only."""
from __future__ import annotations

import logging
import os
import signal
import time


def square_and_pid(x: int) -> tuple[int, int]:
    """``x`` squared and the process that computed it."""
    return x * x, os.getpid()


def fail(x: int) -> int:
    raise ValueError(f"job {x}: bad input")


def killed(x: int) -> int:
    """kill -9 of the slot that runs it."""
    os.kill(os.getpid(), signal.SIGKILL)
    return x


def nap(x: int, seconds: float) -> int:
    """``x``, after ``seconds`` asleep."""
    time.sleep(seconds)
    return x


def log_as_libraries(x: int) -> int:
    """``x``, after logging as gdr and as the libraries a training loads (transformers' LOAD REPORT table,
    Lightning's device lines) do."""
    logging.getLogger("gdr.training.train").info("gdr line %d", x)
    logging.getLogger("transformers.modeling_utils").warning("BertModel LOAD REPORT from: somewhere")
    logging.getLogger("pytorch_lightning.utilities.rank_zero").info("GPU available: False, used: False")
    return x
