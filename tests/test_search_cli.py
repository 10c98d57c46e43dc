"""`gdr search` is its own command (its module, its --help, its arguments split by argparse), and the Python API
loads models as quietly as the commands do."""
from __future__ import annotations

import pytest

from gdr.cli import main
from gdr.cli.commands.search import split_args


def test_search_help_is_its_own(capsys):
    assert main(["search", "--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: gdr search") and "gdr search: search a trained retriever" in out
    assert "run_dir=<folder>" in out and "k=10" in out and "beam width" in out and "length**length_penalty" in out
    assert "gdr evaluate:" not in out and "471 and 995" not in out and "cranfield" not in out.split("examples:")[0]


def test_search_arguments_split_settings_from_queries():
    assert split_args(["a cat", "run_dir=R", "k=2", "--json", "a dog"]) == (["run_dir=R", "k=2"], ["a cat", "a dog"],
                                                                          True)
    assert split_args(["k=2", "--query", "cat=mat", "--", "stock k=3", "--json"]) == (
        ["k=2"], ["cat=mat", "stock k=3", "--json"], False)
    with pytest.raises(SystemExit, match="unknown option --top; see gdr search --help"):
        split_args(["q", "--top", "3"])


def test_search_refuses_what_it_cannot_read_in_one_line(capsys):
    assert main(["search", "q", "--top", "3"]) == 2
    assert capsys.readouterr().err.strip() == "gdr search: error: unknown option --top; see gdr search --help"
    assert main(["search", "run_dir=x"]) == 2  # no query: the usage
    assert capsys.readouterr().err.startswith("usage: gdr search")
    assert main(["search", "a query", "  ", "run_dir=x"]) == 2  # a blank query: searched, it ranked anything
    assert capsys.readouterr().err.strip() == "gdr search: error: query 2 is empty; pass the text to search for"


def test_the_api_loads_a_model_without_transformers_bars(llama_path, capfd):
    from transformers.utils import logging as tf_logging

    import gdr

    capfd.readouterr()
    gdr.load_lm(str(llama_path))
    assert "Loading weights" not in capfd.readouterr().err
    assert tf_logging.is_progress_bar_enabled()  # the caller's setting is restored


@pytest.fixture
def llama_path(tmp_path, monkeypatch):
    from tiny_models import saved_tiny_llama
    from transformers.utils import logging as tf_logging

    monkeypatch.delenv("HF_HUB_DISABLE_PROGRESS_BARS", raising=False)
    monkeypatch.delenv("GDR_VERBOSE", raising=False)
    saved_tiny_llama(tmp_path / "tl")
    was = tf_logging.is_progress_bar_enabled()
    tf_logging.enable_progress_bar()  # as in a fresh Python session (a command run earlier in this one turns it off)
    yield tmp_path / "tl"
    (tf_logging.enable_progress_bar if was else tf_logging.disable_progress_bar)()


def test_a_retriever_on_a_pretrained_encoder_builds_without_transformers_bars(llama_path, capfd):
    """The `mini` preset's encoder (the bundled MiniLM, its first layer) loads as quietly as the LM does."""
    from transformers.utils import logging as tf_logging

    from gdr.training.model import GenerativeRetriever, RetrieverConfig

    capfd.readouterr()
    GenerativeRetriever.build(RetrieverConfig(encoder="minilm-l6", encoder_layers=1, n_digits=4, max_code_len=2,
                                              d_model=32, num_layers=1, num_heads=2, d_ff=32))
    assert "Loading weights" not in capfd.readouterr().err
    assert tf_logging.is_progress_bar_enabled()
