"""Where gdr finds the files it ships and keeps its own: one answer for a source checkout and for a wheel.

gdr reads these files of the repository at run time: ``conf/`` (the Hydra configs), ``reports/gpu-runs/`` (the
committed GPU figures ``gdr plan`` predicts from) and ``reports/plan-constants.json`` (the plan's other measured
constants). A wheel carries them inside the package, as ``gdr/_shipped/conf``, ``gdr/_shipped/gpu-runs`` and
``gdr/_shipped/plan-constants`` (``setup.py`` copies them there at build time, so the repository keeps one copy);
a checkout (``pip install -e .``, or ``PYTHONPATH``) reads them where they are. Settings override them:
``$GDR_CONF_DIR``, ``$GDR_GPU_RUNS`` and ``$GDR_PLAN_CONSTANTS`` (a folder holding ``plan-constants.json``).
What gdr keeps (converted models, compiled kernels, the plan's CPU calibration) goes under :func:`cache_dir`.
"""
from __future__ import annotations

import os
from pathlib import Path

__all__ = ["KERNELS", "SHIPPED", "checkout", "shipped_dir", "cache_dir"]

PACKAGE = Path(__file__).resolve().parent
# The kernels' folders at the repository's top (ARCHITECTURE.md): they import as gdr.<name>. A wheel installs them
# inside the gdr package (pyproject.toml's package-dir); in a checkout gdr/__init__.py finds them beside gdr/.
KERNELS = ("indexing", "training", "eval")
# The folder name inside a wheel's gdr package -> (the repository folder it is copied from, the files copied);
# setup.py reads this. The GPU figures are the folder's JSON files (plan reads those, not the run folders beside).
SHIPPED = {"conf": ("conf", "**/*.yaml"), "gpu-runs": ("reports/gpu-runs", "*.json"),
           "plan-constants": ("reports", "plan-constants.json")}
_SETTING = {"conf": "GDR_CONF_DIR", "gpu-runs": "GDR_GPU_RUNS", "plan-constants": "GDR_PLAN_CONSTANTS"}


def checkout() -> Path | None:
    """The source checkout gdr runs from (the folder holding ``pyproject.toml`` and ``conf/``), or None when gdr
    is installed from a wheel."""
    root = PACKAGE.parent
    return root if (root / "pyproject.toml").is_file() and (root / "conf").is_dir() else None


def shipped_dir(name: str) -> Path:
    """The folder of shipped files ``name`` (a key of :data:`SHIPPED`): its setting when set, else the wheel's
    copy inside the package, else the checkout's folder."""
    env = os.environ.get(_SETTING[name])
    if env:
        return Path(env).expanduser().resolve()
    inside = PACKAGE / "_shipped" / name
    if inside.is_dir():
        return inside
    root = checkout()
    if root is not None:
        return root / SHIPPED[name][0]
    raise FileNotFoundError(f"gdr ships no {name}/ folder at {inside} and runs from no checkout: reinstall gdr "
                            f"(its wheel carries {name}/), or set {_SETTING[name]} to a copy of the repository's "
                            f"{SHIPPED[name][0]}/")


def cache_dir() -> Path:
    """What gdr keeps between runs: ``$GDR_CACHE``, default ``~/.cache/gdr``."""
    return Path(os.environ.get("GDR_CACHE", Path.home() / ".cache" / "gdr"))
