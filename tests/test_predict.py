"""edgekit predict: a model's labels and probabilities for texts from arguments, a file or standard input."""
import csv
import io
import json
import shutil

import numpy as np
import pytest

import edgekit
from edgekit import cli, data, pipeline, recipe, testing


def table(out: str) -> list:
    """The rows of the markdown table predict printed, as lists of cells."""
    rows = [line[2:-2].split(" | ") for line in out.splitlines() if line.startswith("| ")]
    return [[c.strip() for c in r] for r in rows[1:]]  # past the header (the rule row starts with "| -")


def test_texts_given_as_arguments_get_the_labels_and_probabilities_load_gives(one_run, capsys):
    texts = ["a great superb film", "dull and awful acting"]
    assert cli.main(["predict", str(one_run), *texts]) == 0
    out = capsys.readouterr().out
    rows = [r for r in table(out) if not set(r[0]) <= set("-")]
    want = edgekit.load(one_run)(texts)
    assert [r[0] for r in rows] == want["labels"] and [r[2] for r in rows] == texts
    assert [float(r[1]) for r in rows] == pytest.approx(want["probs"].max(-1), abs=6e-5)
    assert "accuracy" not in out  # nothing labelled


def test_a_labelled_file_gives_the_accuracy_over_its_labelled_rows(one_run, tmp_path, capsys):
    model = edgekit.load(one_run)
    rows = list(csv.reader((one_run.parent / "d.csv").open()))[1:41]
    labels = model.labels
    file = tmp_path / "mixed.csv"
    with file.open("w", newline="") as f:  # names, indices, and rows with no label (kept, not counted)
        w = csv.writer(f)
        w.writerow(["review", "y"])
        for i, (text, label) in enumerate(rows):
            w.writerow([text, label if i % 3 == 0 else str(labels.index(label)) if i % 3 == 1 else ""])
    assert cli.main(["predict", str(one_run), "--data", str(file), "--text-column", "review",
                     "--label-column", "y"]) == 0
    out = capsys.readouterr().out
    predicted = model([t for t, _ in rows])["labels"]
    labelled = [i for i in range(len(rows)) if i % 3 != 2]
    right = sum(predicted[i] == rows[i][1] for i in labelled)
    assert f"accuracy {right / len(labelled):.4f} ({right} of {len(labelled)} labelled texts)" in out
    assert len(table(out)) == len(rows) + 1  # the rule row, then every text


def test_out_writes_every_prediction_with_each_class_probability(one_run, tmp_path, capsys):
    source = one_run.parent / "d.csv"
    assert cli.main(["predict", str(one_run), "--data", str(source), "--out", str(tmp_path / "p.csv")]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"written: {tmp_path / 'p.csv'} (240 predictions)\naccuracy ")
    got = list(csv.DictReader((tmp_path / "p.csv").open()))
    rows, _ = data.read_texts(source)
    texts, gold = [t for t, _, _ in rows], [g for _, g, _ in rows]
    model = edgekit.load(one_run)
    want = model(texts)
    assert [r["text"] for r in got] == texts and [r["gold"] for r in got] == gold
    assert [r["row"] for r in got] == [str(i) for i in range(1, 241)]
    assert [r["label"] for r in got] == want["labels"]
    probs = np.array([[float(r[f"prob_{k}"]) for k in model.labels] for r in got])
    assert np.allclose(probs, want["probs"], atol=1e-6) and np.allclose(probs.sum(1), 1, atol=1e-5)
    assert cli.main(["predict", str(one_run), "--data", str(source), "--out", str(tmp_path / "p.jsonl")]) == 0
    lines = [json.loads(line) for line in (tmp_path / "p.jsonl").read_text().splitlines()]
    assert [x["label"] for x in lines] == want["labels"] and lines[0]["gold"] == gold[0]
    assert set(lines[0]["probs"]) == set(model.labels) and lines[0]["prob"] == max(lines[0]["probs"].values())
    assert cli.main(["predict", str(one_run), "a", "--out", str(tmp_path / "p.txt")]) == 2
    assert "--out " + str(tmp_path / "p.txt") + ": give a .csv or .jsonl file (or --format" in capsys.readouterr().err
    assert not (tmp_path / "p.txt").exists()
    assert cli.main(["predict", str(one_run), "a", "--out", str(tmp_path / "p.txt"), "--format", "jsonl"]) == 0
    assert json.loads((tmp_path / "p.txt").read_text())["text"] == "a"


def stdin(raw: bytes):
    return io.TextIOWrapper(io.BytesIO(raw), encoding="utf-8")


def test_standard_input_gives_one_text_per_line(one_run, monkeypatch, capsys):
    monkeypatch.setattr("sys.stdin", stdin("\ufeffa good film\n\n  \nan | awful \\| one\r\n".encode()))
    assert cli.main(["predict", str(one_run), "-"]) == 0  # - : standard input, as without texts
    rows = table(capsys.readouterr().out)[1:]
    assert [r[2] for r in rows] == ["a good film", "an \\| awful \\\\\\| one"]  # no byte-order mark; | stays text
    monkeypatch.setattr("sys.stdin", stdin(b"\n\n"))
    assert cli.main(["predict", str(one_run)]) == 2
    assert "standard input held no text; give one text per line" in capsys.readouterr().err
    monkeypatch.setattr("sys.stdin", stdin(b"fine\ngood \xff film\n"))  # Latin-1: a UnicodeDecodeError traceback
    assert cli.main(["predict", str(one_run)]) == 2
    assert "standard input line 2 is not UTF-8; convert the input (iconv" in capsys.readouterr().err


def test_texts_may_follow_options_and_start_with_a_dash_after_two_dashes(one_run, capsys):
    assert cli.main(["predict", str(one_run), "--quiet", "a good film", "--", "-1 stars", "--x"]) == 0
    assert [r[2] for r in table(capsys.readouterr().out)[1:]] == ["a good film", "-1 stars", "--x"]
    for argv in (["a", "--x"], ["a", "--ou", "f.csv"]):  # no abbreviated flags either: --ou was --out
        with pytest.raises(SystemExit) as e:
            cli.main(["predict", str(one_run), *argv])
        assert e.value.code == 2
        assert f"unrecognized arguments: {argv[1]}" in capsys.readouterr().err


def test_rows_without_a_text_are_said_and_the_out_file_numbers_the_file_s_rows(one_run, tmp_path, capsys):
    file = tmp_path / "holes.csv"
    file.write_text("text,label\n,pos\nfine film,neg\n  ,neg\ngreat cast,pos\n")
    out = tmp_path / "p.jsonl"
    assert cli.main(["predict", str(one_run), "--data", str(file), "--out", str(out)]) == 0
    assert f"2 of 4 rows of {file} have no text; left out" in capsys.readouterr().err
    assert [json.loads(line)["row"] for line in out.read_text().splitlines()] == [2, 4]


def test_out_is_checked_before_any_work_and_never_replaces_the_data(one_run, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr("edgekit.runtime.load", lambda *a, **k: pytest.fail("loaded before --out was checked"))
    source = tmp_path / "d.csv"
    source.write_text(before := (one_run.parent / "d.csv").read_text())
    (tmp_path / "folder.csv").mkdir()
    for out, said in ((source, "is the --data file; give another path (it would replace your data)"),
                      (tmp_path / "folder.csv", "is a folder; give the path of a .csv or .jsonl file"),
                      (tmp_path / "no" / "p.csv", f"folder {tmp_path / 'no'} does not exist; create it")):
        assert cli.main(["predict", str(one_run), "--data", str(source), "--out", str(out)]) == 2
        assert said in capsys.readouterr().err
    assert source.read_text() == before


def test_labels_the_model_does_not_know_give_predictions_and_no_accuracy(one_run, tmp_path, capsys):
    file = testing.make_csv(tmp_path / "other.csv", n=10, labels=("bad", "good"))
    assert cli.main(["predict", str(one_run), "--data", str(file)]) == 0
    said = capsys.readouterr()
    assert "has labels the model does not know ('bad', 'good'; the model's: 'neg', 'pos'), so no accuracy" in said.err
    assert "accuracy" not in said.out and len(table(said.out)) == 11


@pytest.mark.parametrize("argv, message", [
    (["a", "--data", "f.csv"], "give texts as arguments or --data FILE, not both"),
    (["a", "--text-pair-column", "h"], "--text-pair-column names a column of --data FILE; give the file too"),
    (["a", "--label-column", "y"], "--label-column names a column of --data FILE; give the file too"),
    (["--data", "d.csv", "--label-column", "y"], "has no column 'y'; columns: 'text', 'label'; set --label-column"),
    (["a", "--max-length", "2"], "--max-length 2: give a whole number >= 3"),
    (["--data", "missing.csv"], "missing.csv is not there; give a .csv, .tsv or .jsonl file of texts"),
    (["--data", "d.csv", "--text-column", "tweet"], "has no column 'tweet'; columns: 'text', 'label'; set "
                                                    "--text-column to one of them"),
    (["--data", "d.csv", "--label-column", "label", "--text-pair-column", "text"], "--text-column and "
     "--text-pair-column name the same column 'text'"),
    (["--data", "pairs.csv", "--text-pair-column", "second"], "reads single texts, not pairs; leave out "
                                                             "--text-pair-column"),
    (["--data", "d.csv", "--label-column", "text"], "--text-column and --label-column name the same column 'text'"),
])
def test_wrong_inputs_are_one_line(one_run, tmp_path, monkeypatch, capsys, argv, message):
    shutil.copy(one_run.parent / "d.csv", tmp_path / "d.csv")
    (tmp_path / "pairs.csv").write_text("text,second\na,b\n")
    monkeypatch.chdir(tmp_path)
    assert cli.main(["predict", str(one_run), *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1, err


def test_a_model_of_text_pairs_reads_them_from_the_file(tmp_path, capsys):
    file = testing.make_pair_csv(tmp_path / "pairs.csv")
    text = testing.tiny_recipe(testing.make_model_dir(tmp_path / "m"), file, stages=("finetune", "export"))
    text = text.replace(f"data: {{source: {file}}}", f"data: {{source: {file}, text_column: premise, "
                                                     f"text_pair_column: hypothesis}}")
    (tmp_path / "r.yaml").write_text(text)
    pipeline.run(recipe.load(str(tmp_path / "r.yaml")), tmp_path / "run", progress=False)
    assert cli.main(["predict", str(tmp_path / "run"), "--data", str(file), "--text-column", "premise",
                     "--text-pair-column", "hypothesis", "--out", str(tmp_path / "p.csv")]) == 0
    got = list(csv.DictReader((tmp_path / "p.csv").open()))
    texts = [t for t, _, _ in data.read_texts(file, "premise", pair_column="hypothesis")[0]]
    assert [(r["text"], r["text_pair"]) for r in got] == texts
    assert [r["label"] for r in got] == edgekit.load(tmp_path / "run")(texts)["labels"]
    capsys.readouterr()
    assert cli.main(["predict", str(tmp_path / "run"), "one text"]) == 2
    assert "reads text pairs; give --data FILE with --text-pair-column" in capsys.readouterr().err
    stage = tmp_path / "run" / "01-finetune" / "model"  # a stage's model takes what its run read, as the export
    assert cli.main(["predict", str(stage), "one text"]) == 2  # (it predicted a single text: exit 0)
    assert f"{stage} reads text pairs; give --data FILE" in capsys.readouterr().err
    with pytest.raises(edgekit.EdgekitError, match="this model reads text pairs"):
        edgekit.load(stage)(["one text"])
    assert len(edgekit.load(stage)(texts[:3])["labels"]) == 3
    shutil.copytree(stage, tmp_path / "alone")  # outside a run: a transformers folder takes either
    assert len(edgekit.load(tmp_path / "alone")(["one text", "another"])["labels"]) == 2


def test_a_stage_model_of_a_single_text_run_refuses_pairs(one_run):
    model = edgekit.load(one_run / "01-finetune" / "model")
    with pytest.raises(edgekit.EdgekitError, match="this model reads single texts, not pairs"):
        model([("a", "b")])
    assert len(model(["a good film"])["labels"]) == 1


def test_read_texts_keeps_rows_without_a_label_and_files_without_a_label_column(tmp_path):
    (tmp_path / "a.csv").write_text("text,label\nfirst,pos\n,neg\nsecond,\nthird,nan\n")
    assert data.read_texts(tmp_path / "a.csv") == ([("first", "pos", 1), ("second", None, 3), ("third", None, 4)], 4)
    (tmp_path / "b.jsonl").write_text('{"text": "only"}\n{"text": "texts", "label": "neg"}\n')
    assert data.read_texts(tmp_path / "b.jsonl")[0] == [("only", None, 1), ("texts", "neg", 2)]
    (tmp_path / "c.tsv").write_text("text\nno labels here\n")
    assert data.read_texts(tmp_path / "c.tsv")[0] == [("no labels here", None, 1)]
    with pytest.raises(edgekit.UsageError, match="has no column 'label'"):
        data.read_texts(tmp_path / "c.tsv", label_column_needed=True)
    (tmp_path / "d.txt").write_text("text\nx\n")
    with pytest.raises(edgekit.UsageError, match="is not a .csv, .tsv or .jsonl file"):
        data.read_texts(tmp_path / "d.txt")
    with pytest.raises(edgekit.EdgekitError, match="has no row with a text"):
        (tmp_path / "e.csv").write_text("text,label\n,pos\n")
        data.read_texts(tmp_path / "e.csv")
