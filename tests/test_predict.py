"""edgekit predict: a model's labels and probabilities for texts from arguments, a file or standard input."""
import csv
import io
import json

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
    texts, gold = data.read_texts(source)
    model = edgekit.load(one_run)
    want = model(texts)
    assert [r["text"] for r in got] == texts and [r["gold"] for r in got] == gold
    assert [r["label"] for r in got] == want["labels"]
    probs = np.array([[float(r[f"prob_{k}"]) for k in model.labels] for r in got])
    assert np.allclose(probs, want["probs"], atol=1e-6) and np.allclose(probs.sum(1), 1, atol=1e-5)
    assert cli.main(["predict", str(one_run), "--data", str(source), "--out", str(tmp_path / "p.jsonl")]) == 0
    lines = [json.loads(line) for line in (tmp_path / "p.jsonl").read_text().splitlines()]
    assert [x["label"] for x in lines] == want["labels"] and lines[0]["gold"] == gold[0]
    assert set(lines[0]["probs"]) == set(model.labels) and lines[0]["prob"] == max(lines[0]["probs"].values())
    assert cli.main(["predict", str(one_run), "a", "--out", str(tmp_path / "p.txt")]) == 2
    assert "--out " + str(tmp_path / "p.txt") + ": give a .csv or .jsonl file" in capsys.readouterr().err
    assert not (tmp_path / "p.txt").exists()


def test_standard_input_gives_one_text_per_line(one_run, monkeypatch, capsys):
    monkeypatch.setattr("sys.stdin", io.StringIO("a good film\n\n  \nan | awful one\r\n"))
    assert cli.main(["predict", str(one_run)]) == 0
    rows = table(capsys.readouterr().out)[1:]
    assert [r[2] for r in rows] == ["a good film", "an \\| awful one"]  # a | in a text stays in its cell
    monkeypatch.setattr("sys.stdin", io.StringIO("\n\n"))
    assert cli.main(["predict", str(one_run)]) == 2
    assert "standard input held no text; give one text per line" in capsys.readouterr().err


def test_labels_the_model_does_not_know_give_predictions_and_no_accuracy(one_run, tmp_path, capsys):
    file = testing.make_csv(tmp_path / "other.csv", n=10, labels=("bad", "good"))
    assert cli.main(["predict", str(one_run), "--data", str(file)]) == 0
    said = capsys.readouterr()
    assert "has labels the model does not know ('bad', 'good'; the model's: 'neg', 'pos'), so no accuracy" in said.err
    assert "accuracy" not in said.out and len(table(said.out)) == 11


@pytest.mark.parametrize("argv, message", [
    (["a", "--data", "f.csv"], "give texts as arguments or --data FILE, not both"),
    (["a", "--text-pair-column", "h"], "--text-pair-column reads --data FILE; give the file of text pairs"),
    (["--data", "missing.csv"], "missing.csv is not there; give a .csv, .tsv or .jsonl file of texts"),
    (["--data", "d.csv", "--text-column", "tweet"], "has no column 'tweet'; columns: 'text', 'label'; set "
                                                    "--text-column to one of them"),
    (["--data", "d.csv", "--label-column", "gold", "--text-pair-column", "label"], "reads single texts, not pairs; "
                                                                                  "leave out --text-pair-column"),
    (["--data", "d.csv", "--label-column", "text"], "--text-column and --label-column name the same column 'text'"),
])
def test_wrong_inputs_are_one_line(one_run, monkeypatch, capsys, argv, message):
    monkeypatch.chdir(one_run.parent)
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
    texts, _ = data.read_texts(file, "premise", pair_column="hypothesis")
    assert [(r["text"], r["text_pair"]) for r in got] == texts
    assert [r["label"] for r in got] == edgekit.load(tmp_path / "run")(texts)["labels"]
    capsys.readouterr()
    assert cli.main(["predict", str(tmp_path / "run"), "one text"]) == 2
    assert "reads text pairs; give --data FILE with --text-pair-column" in capsys.readouterr().err


def test_read_texts_keeps_rows_without_a_label_and_files_without_a_label_column(tmp_path):
    (tmp_path / "a.csv").write_text("text,label\nfirst,pos\nsecond,\nthird,nan\n,neg\n")
    assert data.read_texts(tmp_path / "a.csv") == (["first", "second", "third"], ["pos", None, None])
    (tmp_path / "b.jsonl").write_text('{"text": "only"}\n{"text": "texts", "label": "neg"}\n')
    assert data.read_texts(tmp_path / "b.jsonl") == (["only", "texts"], [None, "neg"])
    (tmp_path / "c.tsv").write_text("text\nno labels here\n")
    assert data.read_texts(tmp_path / "c.tsv") == (["no labels here"], [None])
    (tmp_path / "d.txt").write_text("text\nx\n")
    with pytest.raises(edgekit.UsageError, match="is not a .csv, .tsv or .jsonl file"):
        data.read_texts(tmp_path / "d.txt")
    with pytest.raises(edgekit.EdgekitError, match="has no row with a text"):
        (tmp_path / "e.csv").write_text("text,label\n,pos\n")
        data.read_texts(tmp_path / "e.csv")
