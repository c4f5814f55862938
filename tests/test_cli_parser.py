"""A wrong command line is one line naming the argument and where to read what is allowed, exit 2: edgekit's
parser and its subcommands', and the --help description helper the bench scripts use."""
import pytest

from edgekit import cli


@pytest.mark.parametrize("argv, line", [
    (["compare", "x", "--seq-len", "abc"],  # gate reads its bounds itself: its CI reports say such an error too
     "edgekit compare: error: argument --seq-len: invalid int value: 'abc'; see edgekit compare --help"),
    (["compare", "x", "--threads", "0"],
     "edgekit compare: error: argument --threads: '0' is not a whole number >= 1; see edgekit compare --help"),
    (["bogus"], "edgekit: error: argument command: invalid choice: 'bogus' (choose from 'compress', "),
    (["recipes", "--bogus"], "edgekit: error: unrecognized arguments: --bogus; see edgekit --help"),
])
def test_usage_errors_are_one_line(argv, line, capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(argv)
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.startswith(line) and err.endswith("--help\n") and err.count("\n") == 1, err


def test_subcommand_parsers_are_one_line_parsers_too():
    parser = cli.build_parser()
    subcommands = next(a for a in parser._actions if a.dest == "command").choices
    assert subcommands and all(isinstance(s, cli.Parser) for s in subcommands.values())


def test_description_is_the_first_paragraph_on_one_line():
    doc = """First line of the summary,
    its second line.

    python bench/x.py RUN
    """
    assert cli.description(doc) == "First line of the summary, its second line."
    assert cli.description("One line only.") == "One line only."
