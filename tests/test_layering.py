"""gdr's layers: the core (rules, data, lm, store, cluster, io, config, models, embed, cost) imports no stage built on
it, gdr.rules and gdr.lm import nothing above them, and no module of gdr, training, indexing or eval imports in a
loop."""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

from gdr.paths import KERNELS

ROOT = Path(__file__).resolve().parent.parent
STAGES = ("gdr.eval", "gdr.indexing", "gdr.training", "gdr.stages", "gdr.validate", "gdr.pipeline", "gdr.cli",
          "gdr.bench")


def _imports(path: Path) -> list[str]:
    names = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):  # lazy imports inside functions too
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.append(node.module)
    return names


def test_core_sources_import_no_stage():
    core = [p for p in (ROOT / "gdr").rglob("*.py")
            if not {"cli", "bench", "stages", "validate.py", "pipeline.py", "plan.py", "calibrate.py", "api.py",
                    "pyterrier.py", "upgrade.py"}
            & set(p.relative_to(ROOT / "gdr").parts)]
    assert len(core) >= 10
    bad = {str(p.relative_to(ROOT)): m for p in core for m in _imports(p)
           if any(m == s or m.startswith(s + ".") for s in STAGES)}
    assert bad == {}


def test_importing_core_loads_no_stage_module():
    code = ("import sys, gdr, gdr.data, gdr.lm, gdr.store, gdr.cluster, gdr.io, gdr.config, gdr.models, gdr.embed, "
            "gdr.cost; "
            "print([m for m in sys.modules if m.split('.')[0] in ('eval', 'indexing', 'training') or m.startswith(("
            "'gdr.eval', 'gdr.indexing', 'gdr.training', 'gdr.cli', 'gdr.bench', 'gdr.stages', 'gdr.validate', "
            "'gdr.pipeline'))])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == "[]"


CLI = ROOT / "gdr" / "cli"
BENCH = ROOT / "gdr" / "bench"
# The modules of gdr/cli and gdr/bench that are not a command or a benchmark: what they may share.
CLI_SHARED = {"gdr.cli", "gdr.cli.common", "gdr.cli.__main__", "gdr.cli.commands", "gdr.bench.common",
              "gdr.bench.syncs"}


def _module(path: Path) -> str:
    """The module a source file imports as: the kernels' top-level folders (indexing/, training/, eval/) are
    gdr.indexing, gdr.training and gdr.eval."""
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    parts = ["gdr", *parts] if parts[0] in KERNELS else parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def test_no_command_module_imports_another():
    """A command module (gdr/cli/commands/*) or benchmark (gdr/bench/*) imports no other command or benchmark:
    what they share lives in the library (gdr.stages, gdr.pipeline), gdr.cli.common, gdr.bench.common or
    gdr.bench.syncs (the host-sync counter)."""
    mods = {_module(p): p for p in [*CLI.rglob("*.py"), *BENCH.rglob("*.py")]}
    commands = {m for m in mods if m not in CLI_SHARED and m != "gdr.bench"}
    assert {"gdr.cli.commands.run", "gdr.cli.commands.sample", "gdr.bench.decoding", "gdr.bench.gpu"} <= commands
    bad = {m: i for m in commands for i in _imports(mods[m])
           if i != m and any(i == c or i.startswith(c + ".") for c in commands)}
    assert bad == {}


def test_no_stage_function_takes_a_hydra_config():
    """Stage functions (gdr/stages/*) take plain typed arguments: no DictConfig, no omegaconf/hydra import,
    no parameter named cfg."""
    stages = sorted((ROOT / "gdr" / "stages").glob("*.py"))
    assert len(stages) >= 10
    bad = []
    for p in stages:
        assert not [m for m in _imports(p) if m.split(".")[0] in ("omegaconf", "hydra")], p
        for node in ast.walk(ast.parse(p.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                for a in node.args.args + node.args.kwonlyargs:
                    ann = ast.unparse(a.annotation) if a.annotation is not None else ""
                    if a.arg == "cfg" or "DictConfig" in ann:
                        bad.append(f"{p.name}:{node.lineno} {node.name}({a.arg})")
    assert bad == []


PACKAGES = ("gdr", *KERNELS)


def _import_graph() -> dict[str, set[str]]:
    """module -> the modules of gdr, training, indexing and eval it imports (at its top or inside a function;
    ``from a import b`` counts a.b too where b is a module)."""
    files = {_module(p): p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")}
    graph = {}
    for mod, path in files.items():
        names = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
        graph[mod] = {n for n in names if n in files and n != mod}
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str]:
    """One import loop of ``graph`` (a depth-first search's back edge), or []."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(m: str) -> list[str]:
        state[m] = 1
        path.append(m)
        for n in sorted(graph[m]):
            if state.get(n) == 1:
                return path[path.index(n):] + [n]
            if n not in state and (found := visit(n)):
                return found
        state[m] = 2
        path.pop()
        return []

    for m in sorted(graph):
        if m not in state and (found := visit(m)):
            return found
    return []


def test_cycle_finder_finds_a_loop():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) == []


def test_the_kernels_import_only_under_gdr():
    """indexing, training and eval are gdr.indexing, gdr.training and gdr.eval everywhere: a bare ``import
    training`` would load a second copy of the module (in a checkout its folder is also on sys.path), which a
    wheel does not even install."""
    files = [p for pkg in (*PACKAGES, "tests", "examples", "reports") for p in (ROOT / pkg).rglob("*.py")]
    assert len(files) > 100
    bad = [f"{p.relative_to(ROOT)}: {m}" for p in files for m in _imports(p) if m.split(".")[0] in KERNELS]
    assert bad == []


def test_no_module_imports_in_a_loop():
    graph = _import_graph()
    assert {"gdr.data", "gdr.validate", "gdr.training.train"} <= set(graph)
    assert _cycle(graph) == []


# modules that import nothing of gdr
GROUND = ("gdr.rules", "gdr.cost", "gdr.logs", "gdr.device", "gdr.gguf_llama", "gdr.paths", "gdr.signals")


def test_rules_import_nothing_of_gdr_and_lm_nothing_above_it():
    """gdr.rules, gdr.cost and gdr.logs are the ground floor; gdr.lm (the query generator) needs only itself,
    gdr.models and those."""
    graph = _import_graph()
    for ground in GROUND:
        assert {m for m in graph[ground] if m.split(".")[0] in PACKAGES} == set(), ground
    assert graph["gdr.models"] <= set(GROUND)
    lm = {m: deps for m, deps in graph.items() if m == "gdr.lm" or m.startswith("gdr.lm.")}
    assert len(lm) >= 5
    above = {m: sorted(d for d in deps if not (d == "gdr.lm" or d.startswith("gdr.lm.")
                                               or d in ("gdr.models", *GROUND)))
             for m, deps in lm.items()}
    assert {m: d for m, d in above.items() if d} == {}


# a package that is one room split along its seams: its modules share their private names
ONE_ROOM = ("gdr.cluster",)


def _room(module: str) -> str:
    return next((r for r in ONE_ROOM if module == r or module.startswith(r + ".")), module)


def _private_imports(path: Path, own: str, modules: set[str]) -> list[str]:
    """Where ``path`` (module ``own``) reads a private name (``_x``, not a dunder) of another first-party module
    (another room: :data:`ONE_ROOM`'s packages are one): ``from m import _x`` or ``m._x`` with ``m`` bound by
    ``import m`` / ``from pkg import m``."""
    def first_party(m: str) -> str:
        return f"gdr.{m}" if m.split(".")[0] in KERNELS else m

    tree = ast.parse(path.read_text(encoding="utf-8"))
    where = path.relative_to(ROOT) if ROOT in path.parents else path.name
    bound, bad = {}, []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            src = first_party(node.module)
            for a in node.names:
                if (src in modules and _room(src) != _room(own) and a.name.startswith("_")
                        and not a.name.startswith("__")):
                    bad.append(f"{where}:{node.lineno} from {src} import {a.name}")
                if f"{src}.{a.name}" in modules:
                    bound[a.asname or a.name] = f"{src}.{a.name}"
        elif isinstance(node, ast.Import):
            bound |= {a.asname or a.name: first_party(a.name) for a in node.names if first_party(a.name) in modules}
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__")
                and _room(bound.get(ast.unparse(node.value), own)) != _room(own)):
            bad.append(f"{where}:{node.lineno} {ast.unparse(node)}")
    return bad


def test_private_scan_finds_both_forms(tmp_path):
    src = tmp_path / "mod.py"
    src.write_text("from gdr.cluster import _x, y\nimport gdr.io as io\nfrom gdr import store\n"
                   "io._a(store._b, y.__doc__)\n", encoding="utf-8")
    found = _private_imports(src, "probe", {"gdr.cluster", "gdr.io", "gdr.store"})
    assert sorted(f.split(" ", 1)[1] for f in found) == ["from gdr.cluster import _x", "io._a", "store._b"]


def test_no_private_name_crosses_modules():
    """A name another module of gdr, training, indexing or eval reads is public (no leading underscore): a private
    name is its module's own, free to change. Tests may read privates: they test one module's insides."""
    files = {_module(p): p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")}
    bad = [b for mod, path in files.items() for b in _private_imports(path, mod, set(files))]
    assert bad == []
