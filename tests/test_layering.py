"""gdr's core (data, lm, store, cluster, io, config, models, embed) imports no stage built on it."""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
STAGES = ("eval", "indexing", "training", "gdr.stages", "gdr.pipeline", "gdr.cli")


def _imports(path: Path) -> list[str]:
    names = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):  # lazy imports inside functions too
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.append(node.module)
    return names


def test_core_sources_import_no_stage():
    core = [p for p in (ROOT / "gdr").rglob("*.py") if not {"cli", "stages", "pipeline.py", "api.py"}
            & set(p.relative_to(ROOT / "gdr").parts)]
    assert len(core) >= 10
    bad = {str(p.relative_to(ROOT)): m for p in core for m in _imports(p)
           if any(m == s or m.startswith(s + ".") for s in STAGES)}
    assert bad == {}


def test_importing_core_loads_no_stage_module():
    code = ("import sys, gdr, gdr.data, gdr.lm, gdr.store, gdr.cluster, gdr.io, gdr.config, gdr.models, gdr.embed; "
            "print([m for m in sys.modules if m.split('.')[0] in ('eval', 'indexing', 'training') "
            "or m.startswith(('gdr.cli', 'gdr.stages', 'gdr.pipeline'))])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == "[]"
