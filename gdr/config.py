"""Configuration: YAML files in ``conf/`` composed with Hydra's compose API.

Why Hydra's *compose API* and not ``@hydra.main``: we get config groups (``data=r5``,
``model=smollm2-135m``) and the override grammar the field already knows
(``cluster.alpha=1.0``, ``+experiment=reuters``), while ``gdr`` keeps a plain
sub-command CLI, its own logging and the caller's working directory.
"""
from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Sequence

from omegaconf import DictConfig, OmegaConf

from gdr.io import atomic_write_text

__all__ = ["conf_dir", "load_config", "command_config", "save_config", "to_container"]

log = logging.getLogger(__name__)


def conf_dir() -> Path:
    """The ``conf/`` folder: ``$GDR_CONF_DIR`` or the repository's ``conf/``."""
    env = os.environ.get("GDR_CONF_DIR")
    if env:
        return Path(env).resolve()
    here = Path(__file__).resolve().parent.parent / "conf"
    if here.is_dir():
        return here
    raise FileNotFoundError(
        f"no conf/ folder next to {Path(__file__).resolve().parent}; install gdr from its "
        "repository with `pip install -e .` or set GDR_CONF_DIR to a copy of conf/"
    )


def load_config(name: str, overrides: Sequence[str] = ()) -> DictConfig:
    """Compose ``conf/<name>.yaml`` with command-line ``overrides`` (Hydra grammar)."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    cdir = conf_dir()
    if not (cdir / f"{name}.yaml").exists():
        raise FileNotFoundError(f"no config {cdir / (name + '.yaml')}")
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(cdir), version_base=None):
        cfg = compose(config_name=name, overrides=list(overrides))
    OmegaConf.resolve(cfg)
    return cfg


def command_config(name: str, argv: Sequence[str]) -> DictConfig | None:
    """A command's config from its argv; with ``--cfg`` print the composed config and return None."""
    cfg = load_config(name, [a for a in argv if a != "--cfg"])
    if "--cfg" in argv:
        print(OmegaConf.to_yaml(cfg))
        return None
    return cfg


def save_config(cfg: DictConfig, out_dir: str | os.PathLike, name: str = "config.yaml") -> Path:
    """Write the fully resolved config next to a run's outputs."""
    path = Path(out_dir) / name
    atomic_write_text(path, OmegaConf.to_yaml(cfg, resolve=True))
    return path


def to_container(cfg: DictConfig) -> dict:
    return OmegaConf.to_container(cfg, resolve=True)  # type: ignore[return-value]
