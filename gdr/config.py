"""Configuration: YAML files in ``conf/`` composed with Hydra's compose API.

Why Hydra's *compose API* and not ``@hydra.main``: we get config groups (``data=r5``,
``model=smollm2-135m``) and the override grammar the field already knows
(``cluster.alpha=1.0``, ``+experiment=reuters``), while ``gdr`` keeps a plain
sub-command CLI, its own logging and the caller's working directory. The composition itself, and the rerun
advice built on it, sit on the ground floor (:mod:`gdr.rerun`), where kernels and the store can reach them;
they are re-exported here as the commands' config API.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Sequence

from omegaconf import DictConfig, OmegaConf

from gdr.io import atomic_write_text
from gdr.rerun import (
    conf_dir,
    data_overrides,
    flat_leaves,
    load_config,
    override_value,
    rerun_command,
    saved_data,
)

__all__ = ["conf_dir", "load_config", "command_config", "save_config", "to_container", "rerun_command",
           "override_value", "flat_leaves", "saved_data", "data_overrides"]


def command_config(name: str, argv: Sequence[str]) -> DictConfig | None:
    """A command's config from its argv; with ``--cfg`` print the composed config and return None."""
    cfg = load_config(name, [a for a in argv if a != "--cfg"])
    if "--cfg" in argv:
        print(OmegaConf.to_yaml(cfg))
        return None
    return cfg


def save_config(cfg: DictConfig | dict, out_dir: str | os.PathLike, name: str = "config.yaml") -> Path:
    """Write the fully resolved config next to a run's outputs."""
    path = Path(out_dir) / name
    atomic_write_text(path, OmegaConf.to_yaml(cfg, resolve=True))
    return path


def to_container(cfg: DictConfig) -> dict:
    return OmegaConf.to_container(cfg, resolve=True)  # type: ignore[return-value]
