"""The wheel's build step beyond pyproject.toml: copy the repository folders gdr reads at run time (``conf/``, the
committed GPU figures of ``reports/gpu-runs/``) into the built package as ``gdr/_shipped/<name>/``, so that the
repository keeps one copy and an installed gdr finds them (:mod:`gdr.paths`). An editable install reads the
folders where they are and copies nothing."""
import importlib.util
import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
# gdr/paths.py by its file: importing the gdr package here would need it on sys.path
_spec = importlib.util.spec_from_file_location("_gdr_paths", ROOT / "gdr" / "paths.py")
paths = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(paths)


class BuildPyShipped(build_py):
    def run(self):
        super().run()
        if self.editable_mode:
            return
        for name, (folder, pattern) in paths.SHIPPED.items():
            src, out = ROOT / folder, Path(self.build_lib) / "gdr" / "_shipped" / name
            shutil.rmtree(out, ignore_errors=True)  # a file gone from the repository leaves no copy of an earlier build
            files = sorted(p for p in src.glob(pattern) if p.is_file())
            if not files:
                raise FileNotFoundError(f"{src}: no {pattern} to ship as gdr/_shipped/{name}")
            for f in files:
                dst = out / f.relative_to(src)
                dst.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(f, dst)


setup(cmdclass={"build_py": BuildPyShipped})
