"""The ``gdr`` command: one sub-command per pipeline stage.

Each sub-command is ``module:function`` (:mod:`gdr.cli.commands`); the function takes the remaining argv
(Hydra-style overrides such as ``data=r5 sample.n_queries=64``), composes its config
from ``conf/``, validates it (:mod:`gdr.validate`) and calls the library (:mod:`gdr.stages`,
:mod:`gdr.pipeline`) with plain typed settings. Modules are imported lazily so ``gdr --help`` stays fast.

Logging: gdr's own lines at INFO, other libraries' only from WARNING up (:mod:`gdr.logs`); ``--verbose``
anywhere on the command line shows them all.

Errors the user can fix (a bad value, an unknown key, a missing file) print one line
``gdr <command>: error: <message>`` and exit 2; ``--debug`` anywhere on the command line
re-raises them with the full traceback.
"""
from __future__ import annotations

import importlib
import logging
import os
import shlex
import sys

from gdr.logs import setup_logging

COMMANDS: dict[str, tuple[str, str]] = {
    "sample": ("gdr.cli.commands.sample", "sample_main"),
    "score": ("gdr.cli.commands.sample", "score_main"),
    "cluster": ("gdr.cli.commands.cluster", "cluster_main"),
    "index": ("gdr.cli.commands.index", "index_main"),
    "train": ("gdr.cli.commands.train", "train_main"),
    "evaluate": ("gdr.cli.commands.evaluate", "evaluate_main"),
    "search": ("gdr.cli.commands.search", "search_main"),
    "bench": ("gdr.bench", "bench_main"),
    "run": ("gdr.cli.commands.run", "run_main"),
    "plan": ("gdr.cli.commands.plan", "plan_main"),
    "qg": ("gdr.cli.commands.qg", "qg_main"),
    "upgrade": ("gdr.cli.commands.upgrade", "upgrade_main"),
    "prune": ("gdr.cli.commands.prune", "prune_main"),
    "pack": ("gdr.cli.commands.pack", "pack_main"),
    "unpack": ("gdr.cli.commands.unpack", "unpack_main"),
}
HELP = {
    "sample": "sample J queries from a corpus with a generative LM (Algorithm 1, line 1)",
    "score": "score log p(query | doc) for every pair: the P matrix (Algorithm 1, line 2)",
    "cluster": "generative clustering of a corpus, with evaluation when labels exist",
    "index": "build prefix-code docids (gc | hkmi | bmi | random | atomic); `gdr index add` grows one",
    "train": "train an NCI-style seq2seq retriever on docids",
    "evaluate": "Success@k, R@k and RR@k of a trained retriever (and BM25), k = the results per query",
    "search": "search a trained retriever from the command line",
    "bench": ("benchmarks: scoring | clustering | indexing | decoding | sampling | training | integrity | overlap | "
              "gpu (every GPU figure)"),
    "run": "the whole pipeline: sample, score, cluster, index, train, evaluate, report (cached by stage)",
    "plan": "each stage's predicted seconds of a `gdr run` (device=h200|cpu.. free_gb=GB); --check RUN_DIR",
    "qg": "fine-tune a query generator on (document, query) pairs; model.name=<out>/model uses it",
    "upgrade": "bring a run or score folder of an older gdr to the current format, keeping its P (RUN_DIR)",
    "prune": "drop the weights of a run's evaluated retrievers, keeping every result (RUN_DIR)",
    "pack": "a pruned run as checksummed pieces of <= 16 MiB, to carry to another machine (RUN_DIR OUTDIR)",
    "unpack": "rebuild a run packed by `gdr pack` anywhere, its pieces checked (OUTDIR DEST)",
}


def _usage() -> str:
    lines = ["usage: gdr <command> [key=value ...]", "", "commands:"]
    lines += [f"  {name:<9} {HELP[name]}" for name in COMMANDS]
    lines += ["", "Overrides use Hydra's grammar, e.g. `gdr cluster data=r5 sample.n_queries=64`;",
              "`gdr <command> --cfg` prints the composed config and exits;",
              "`--debug` shows the full traceback of an error instead of its one-line message;",
              "`--verbose` shows other libraries' INFO lines (faiss, Lightning, transformers' load reports)."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    # Idle OpenMP threads sleep rather than spin (before torch loads, which reads it once): a CPU retriever trains on
    # one thread per core, and spinning threads cost a step ~30x as soon as anything else runs on a core (a second
    # retriever, the run's background host stages, another job). It changes how threads wait, never a result.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    try:
        return _main(argv)
    except BrokenPipeError:  # `gdr run ... --cfg | head`: the reader left; no traceback
        return stdout_gone()


def stdout_gone() -> int:
    """The reader of stdout closed it (``| head``): point stdout at /dev/null, so that nothing more is written,
    nor flushed at exit (which would print an ignored BrokenPipeError), and exit as a process killed by SIGPIPE."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):  # no real stdout (a test's capture): nothing to silence
        pass
    return 141


def _main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    debug, verbose = "--debug" in argv, "--verbose" in argv
    argv = [a for a in argv if a not in ("--debug", "--verbose")]
    if not argv or argv[0] in {"-h", "--help", "help"}:
        print(_usage())
        return 0
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f"gdr: unknown command {name!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    if any(a in ("-h", "--help") for a in rest) and not _own_help(name, rest):
        from gdr.cli.help import command_help  # lazy: `import gdr` and `gdr --help` load no command's dependencies

        print(command_help(name, HELP[name], [a for a in rest if a not in ("-h", "--help")]))
        return 0
    setup_logging(verbose=verbose or None)
    module, func = COMMANDS[name]
    from gdr import guard, signals  # lazy: `import gdr` and `gdr --help` load no command's dependencies

    guard.COMMAND_LINE = " ".join(["gdr", name, *(shlex.quote(a) for a in rest)])
    signals.install()  # SIGTERM / SIGINT: one line and exit 143 / 130, never a success (gdr.signals)
    try:
        rc = getattr(importlib.import_module(module), func)(rest)
        if signals.received():  # a library caught the stop and returned (Lightning turns SIGTERM into an exit)
            raise signals.Stopped(signals.received())
    except BaseException as e:
        signum = signals.received()
        if signum is None or debug and not isinstance(e, signals.Stopped):
            return _failed(name, rest, e, debug)
        busy = signals.background_busy()  # a host stage mid-computation, its progress bar maybe mid-line
        print(("\n" if busy else "") + signals.stop_line(sub_command(name, rest), signum), file=sys.stderr)
        if busy:  # end as a kill would: the interpreter must not finalise under that thread (gdr.signals)
            guard.release_all()
            logging.shutdown()
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(signals.exit_code(signum))
        return signals.exit_code(signum)
    finally:
        signals.uninstall()
        guard.release_all()  # the out-folder locks of this command (gdr.guard.claim_out)
    return int(rc or 0)


def _failed(name: str, rest: list[str], e: BaseException, debug: bool) -> int:
    """The exit code of a command that raised ``e`` (no signal), after its one line; re-raises what is a bug."""
    from gdr import guard  # lazy: `import gdr` and `gdr --help` load no command's dependencies

    if isinstance(e, BrokenPipeError):
        raise e  # main(): the reader of stdout left, a quiet exit
    if isinstance(e, KeyboardInterrupt):
        if debug:
            raise e
        print(f"gdr {name}: interrupted", file=sys.stderr)
        return 130
    if isinstance(e, SystemExit):  # `raise SystemExit("message")` in a command, or sys.exit(code)
        if not isinstance(e.code, str):
            return int(e.code or 0)
        if debug:
            raise e
        from gdr.validate import exit_line  # lazy: `import gdr` and `gdr --help` load no command's dependencies

        print(f"gdr {name}: error: {exit_line(e.code, name)}", file=sys.stderr)
        return 2
    if not isinstance(e, Exception):
        raise e
    from gdr.validate import error_line  # lazy: `import gdr` and `gdr --help` load no command's dependencies

    # a full disk or an unwritable file while writing outputs: one line too (the early check missed it)
    line = None if debug else guard.write_error_line(e, sub_command(name, rest)) or error_line(e, rest)
    if line is None:  # --debug, or not an error the command line can fix: the full traceback
        raise e
    print(f"gdr {name}: error: {line}", file=sys.stderr)
    return 2


def _own_help(name: str, rest: list[str]) -> bool:
    """Commands whose arguments are not config overrides parse their own ``--help`` (``gdr bench <name>``,
    ``gdr search``, ``gdr upgrade``, ``gdr prune``, ``gdr pack``, ``gdr unpack``)."""
    own = ("search", "upgrade", "prune", "pack", "unpack")
    return name in own or name == "bench" and bool(rest) and rest[0] not in ("-h", "--help")


def sub_command(name: str, rest: list[str]) -> str:
    """``index add`` for ``gdr index add ...``, else ``name``."""
    return f"{name} add" if name == "index" and rest[:1] == ["add"] else name


if __name__ == "__main__":
    sys.exit(main())
