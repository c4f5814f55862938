"""Every bench script's --help: the docstring's first paragraph whole (not cut at its first line), a help text for
every argument, and usage errors in one line (edgekit.cli.Parser)."""
import argparse
import importlib
import sys
from pathlib import Path

import pytest

from edgekit import cli

BENCH = Path(__file__).resolve().parent.parent / "bench"
sys.path.insert(0, str(BENCH))  # bench/ scripts import each other by name


class Built(Exception):
    """Raised in place of parsing: the script's parser, before anything runs."""


def parser_of(module, monkeypatch):
    def stop(parser, args=None, namespace=None):
        raise Built(parser)

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", stop)
    monkeypatch.setattr(sys, "argv", [f"{module.__name__}.py"])
    with pytest.raises(Built) as built:
        module.main()
    return built.value.args[0]


@pytest.mark.parametrize("script", sorted(p.stem for p in BENCH.glob("*.py")))
def test_help_has_the_whole_first_paragraph_and_a_line_for_every_argument(script, monkeypatch):
    module = importlib.import_module(script)
    parser = parser_of(module, monkeypatch)
    assert parser.description == " ".join(module.__doc__.split("\n\n")[0].split())
    assert [a.dest for a in parser._actions if not a.help] == []
    assert isinstance(parser, cli.Parser)


def test_domain_transfer_source_names_only_sources_the_loader_takes(monkeypatch):
    import domain_transfer

    text = next(a.help for a in parser_of(domain_transfer, monkeypatch)._actions if a.dest == "source")
    assert "vader-tweets" not in text and "vader-movie" not in text
    assert "vader-amazon" in text and ".csv/.tsv/.jsonl" in text


def test_a_bench_usage_error_is_one_line(capsys):
    import headline

    with pytest.raises(SystemExit) as e:
        headline.main(["--rounds", "x"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1
    assert err.startswith(f"{Path(sys.argv[0]).name}: error: argument --rounds: invalid int value: 'x'; see ")


@pytest.mark.parametrize("script", ["prune", "quantize"])
def test_a_run_too_short_for_128_tokens_is_refused_before_the_work(script, tmp_path, capsys, monkeypatch):
    """Both time 128 tokens: a run of max_length 32 failed after its pruning or exports, advising a --seq-len the
    scripts do not have."""
    module = __import__(script)
    monkeypatch.setattr(module.pipeline, "context_of", lambda run: ({"recipe": {"max_length": 32}}, None))
    with pytest.raises(SystemExit) as e:
        module.main([str(tmp_path)])
    err = capsys.readouterr().err
    assert e.value.code == 2 and f"{tmp_path} was made with max_length 32; this benchmark times 128 tokens" in err
