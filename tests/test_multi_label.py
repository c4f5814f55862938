"""Multi-label classifiers (toxicity tags, emotions, topics: any number of labels per text, none too): read from
JSONL lists or CSV cells cut at data.label_separator, trained with a sigmoid per label, distilled, pruned,
exported and scored as exact-match accuracy, per-label recall and micro-F1, predicted as lists of labels."""
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

import edgekit
from edgekit import cli, data, devices, gate, pipeline, recipe, report, runtime, testing, training
from edgekit.errors import EdgekitError, UsageError
from edgekit.report import number
from edgekit.stages import evaluate

RUNNER = Path(__file__).resolve().parent.parent / "device_bench"  # the device runner, a package of its own
sys.path.insert(0, str(RUNNER))
try:
    from device_bench import runner
finally:
    sys.path.pop(0)


def rows_csv(path, cells: list) -> str:
    path.write_text("text,label\n" + "".join(f"sentence {i} {'good' * (i % 2)},{c}\n" for i, c in enumerate(cells)))
    return str(path)


def test_jsonl_lists_are_multi_label_data(tmp_path):
    splits = data.load(str(testing.make_multi_label_jsonl(tmp_path / "d.jsonl")))
    assert splits.multi_label and splits.labels == ["neg", "pos"]
    every = splits.train + splits.validation + splits.test
    assert {y for _, y in every} == {(0, 0), (1, 0), (0, 1), (1, 1)}  # none, one or both labels
    assert splits.stats["classes"] == {"neg": 120, "pos": 120}  # rows holding each label, of 240
    assert data.describe(splits).endswith("; multi-label, rows holding each label: neg 120, pos 120")
    for text, y in every:  # each row's tuple says which cues its text holds
        assert y == (int(any(w in text.split() for w in testing.NEGATIVE)),
                     int(any(w in text.split() for w in testing.POSITIVE)))
    assert not data.load(str(testing.make_csv(tmp_path / "s.csv"))).multi_label


def test_csv_cells_cut_at_the_label_separator(tmp_path):
    f = rows_csv(tmp_path / "d.csv", ["a|b", "", "b", " a | ", "b|b"] * 40)
    splits = data.load(f, label_separator="|")
    assert splits.multi_label and splits.labels == ["a", "b"]
    by_text = {t: y for t, y in splits.train + splits.validation + splits.test}
    assert [by_text[f"sentence {i} {'good' * (i % 2)}"] for i in range(5)] == [(1, 1), (0, 0), (0, 1), (1, 0), (0, 1)]
    plain = data.load(f)  # without the separator a cell is one class name, and an empty cell no label
    assert not plain.multi_label and plain.labels == ["a |", "a|b", "b", "b|b"] and plain.stats["skipped"] == 40


def jigsaw_csv(path, rows: list) -> str:
    """A Jigsaw-style file: an id, the comment, and a 0/1 column per label."""
    path.write_text("id,comment_text,toxic,insult,threat\n" + "".join(f"{i},comment {i},{','.join(r)}\n"
                                                                        for i, r in enumerate(rows)))
    return str(path)


def test_label_columns_read_a_0_1_column_per_label(tmp_path):
    """data.label_columns: each named column is a label, 1 (true, yes, 1.0) where the text has it; a row with one
    of them empty or -1 (Jigsaw's mark of a text not scored) has no label and is left out."""
    flags = [("1", "0", "1"), ("0", "0", "0"), ("true", "TRUE", "false"), ("1.0", "0.0", "0"), ("-1", "-1", "-1"),
             ("1", "", "0")] * 20
    f = jigsaw_csv(tmp_path / "j.csv", flags)
    splits = data.load(f, text_column="comment_text", label_columns="toxic, insult,threat")
    assert splits.multi_label and splits.labels == ["insult", "threat", "toxic"] and splits.stats["skipped"] == 40
    by_text = {t: y for t, y in splits.train + splits.validation + splits.test}
    assert [by_text.get(f"comment {i}") for i in range(6)] == [(0, 1, 1), (0, 0, 0), (1, 0, 1), (0, 0, 1), None, None]
    assert data.load(f, text_column="comment_text", label_columns=["threat", "toxic", "insult"]) == splits
    lines = [json.dumps({"text": f"text {i}", "rude": i % 2 == 1, "spam": i % 3 == 0}) for i in range(60)]
    (tmp_path / "j.jsonl").write_text("\n".join(lines) + "\n")  # JSON's true and false, 0 and 1 too
    read = data.load(str(tmp_path / "j.jsonl"), label_columns="spam,rude")
    by_text = {t: y for t, y in read.train + read.validation + read.test}
    assert [by_text[f"text {i}"] for i in range(4)] == [(0, 1), (1, 0), (0, 0), (1, 1)]


@pytest.mark.parametrize("cells, settings, message", [
    ([("1", "0", "0.7")], {"label_columns": "toxic,insult,threat"},
     r"j.csv row 1 \(after the header\): label column 'threat' holds '0.7'; a label column holds 0 or 1"),
    ([("1", "0", "0")], {"label_columns": "toxic,identity_hate"},
     r"has no column 'identity_hate'; columns: 'id', 'comment_text', 'toxic', 'insult', 'threat'; name only columns"),
    ([("1", "0", "0")], {"label_columns": "toxic"}, r"names one column \(toxic\); .* set data.label_column to it"),
    ([("1", "0", "0")], {"label_columns": "toxic,insult", "label_separator": "|"}, r"give one: label_columns for"),
    ([("1", "0", "0"), ("0", "1", "0")], {"label_columns": "toxic,insult,threat"},
     r"label column 'threat' marks no training row \(no 1 in it\); drop it from data.label_columns"),
])
def test_label_columns_refuse_what_they_cannot_read_in_one_line(tmp_path, cells, settings, message):
    f = jigsaw_csv(tmp_path / "j.csv", cells * 30)
    with pytest.raises(EdgekitError, match=message):
        data.load(f, text_column="comment_text", **settings)


def test_label_columns_from_a_recipe_and_predict_score_a_jigsaw_file(ml_run, tmp_path, capsys):
    """The setting as a recipe gives it (a list, or text cut at commas), and predict --label-columns reading the
    gold label sets of such a file as the JSONL lists they came from."""
    given = [json.loads(line) for line in (ml_run.parent / "d.jsonl").read_text().splitlines()]
    path = tmp_path / "j.csv"
    path.write_text("text,neg,pos\n" + "".join(f"{r['text']},{int('neg' in r['label'])},{int('pos' in r['label'])}\n"
                                                for r in given))
    (tmp_path / "r.yaml").write_text(testing.tiny_recipe(testing.make_model_dir(tmp_path / "m"), path,
                                                         stages=("finetune", "evaluate")))
    for form in ("data.label_columns=neg,pos", "data.label_columns=[pos, neg]"):
        splits, lists = pipeline.check_inputs(recipe.load(str(tmp_path / "r.yaml"), [form])), \
            data.load(str(ml_run.parent / "d.jsonl"))
        assert (splits.train, splits.test, splits.labels) == (lists.train, lists.test, lists.labels)
    assert cli.main(["predict", str(ml_run), "--data", str(path), "--label-columns", "neg,pos", "--out",
                     str(tmp_path / "p.jsonl")]) == 0
    assert [json.loads(line)["gold"] for line in (tmp_path / "p.jsonl").read_text().splitlines()] == \
        [r["label"] for r in given]
    assert "labelled texts)" in capsys.readouterr().out
    from edgekit import compare

    teacher = str(ml_run / "01-finetune" / "model")
    assert cli.main(["compare", teacher, "--data", str(path), "--label-columns", "neg,pos", "--seq-len", "32",
                     "--out", str(tmp_path / "c"), "--quiet"]) == 0
    read = json.loads((tmp_path / "c" / "compare.json").read_text())
    lists = compare.run([teacher], tmp_path / "l", str(ml_run.parent / "d.jsonl"), seq_len=32, progress=False)
    assert read[0]["accuracy"] == lists[0]["accuracy"]


def test_a_label_only_outside_training_moves_a_row_into_it_and_max_train_keeps_every_label(tmp_path):
    rows = [json.dumps({"text": f"text {i}", "label": ["x"] if i % 2 else []}) for i in range(200)]
    rows.append(json.dumps({"text": "the rare one", "label": ["x", "rare"]}))
    (tmp_path / "d.jsonl").write_text("\n".join(rows) + "\n")
    splits = data.load(str(tmp_path / "d.jsonl"))
    assert splits.labels == ["rare", "x"] and ("the rare one", (1, 1)) in splits.train
    cut = data.load(str(tmp_path / "d.jsonl"), max_train=20)
    assert len(cut.train) == 20 and ("the rare one", (1, 1)) in cut.train  # its label set kept a row
    with pytest.raises(EdgekitError, match="has one label .*a single tag is a two-class task"):
        (tmp_path / "one.jsonl").write_text("".join(json.dumps({"text": f"t{i}", "label": ["x"] * (i % 2)}) + "\n"
                                                    for i in range(50)))
        data.load(str(tmp_path / "one.jsonl"))


def test_a_label_set_that_fills_most_rows_is_warned_of(tmp_path):
    rows = [json.dumps({"text": f"text {i}", "label": [["a"], ["b"]][i // 10 % 2] if i % 10 == 0 else []})
            for i in range(300)]
    (tmp_path / "d.jsonl").write_text("\n".join(rows) + "\n")
    said = data.warnings(data.load(str(tmp_path / "d.jsonl")))
    assert any(w.startswith("label set 'none' holds 89.6% of the 250 training rows") and "class_recall_retained" in w for w in said), said


def test_augmented_copies_keep_their_label_sets_through_the_cache(tmp_path):
    """The augmentation cache is JSON: a multi-label tuple comes back as a tuple, so the entry is used, not made
    again on every run."""
    from edgekit import augment

    examples = [("bad film", (1, 0)), ("good bad film", (1, 1))]
    augment.save(tmp_path / "entry.json", examples, "mlm")
    assert augment.cached(tmp_path / "entry.json", {(1, 0), (1, 1)}) == (examples, "mlm")
    assert augment.cached(tmp_path / "entry.json", {(1, 0)}) is None  # a label set of other sentences: not this entry


def test_multi_label_losses():
    torch.manual_seed(0)
    logits, labels = torch.randn(4, 3), torch.tensor([[1, 0, 1], [0, 0, 0], [0, 1, 0], [1, 1, 1]])
    expected = torch.nn.functional.binary_cross_entropy_with_logits(logits, labels.float())
    assert torch.isclose(training.task_loss(logits, labels), expected)
    assert torch.isclose(training.labelled_ce(logits, labels), expected)
    unlabelled = torch.cat([labels, torch.full((4, 3), data.UNLABELLED)])  # transfer rows add nothing
    assert torch.isclose(training.labelled_ce(torch.cat([logits, torch.randn(4, 3)]), unlabelled), expected / 2)
    student = logits.clone().requires_grad_(True)
    training.soft_label_kd(student, logits, 2.0, multi_label=True).backward()
    assert student.grad.abs().max() < 1e-6  # the student that says what the teacher says is at the minimum
    assert training.soft_label_kd(-logits, logits, 2.0, multi_label=True) > \
        training.soft_label_kd(logits, logits, 2.0, multi_label=True)
    assert runtime.decided(np.array([[0.3, -0.1, 0.0]]), True) == [(1, 0, 0)]  # a logit over 0: the label applies
    assert runtime.decided(np.array([[0.3, 2.0, 0.0]]), False) == [1]


@pytest.fixture(scope="module")
def ml_run(tmp_path_factory):
    """A finished multi-label run of every stage on the tiny model and multi-label data, its thresholds tuned (f1)."""
    root = tmp_path_factory.mktemp("multi")
    jsonl = testing.make_multi_label_jsonl(root / "d.jsonl")
    (root / "r.yaml").write_text(testing.tiny_recipe(testing.make_model_dir(root / "m"), jsonl, stages=(
        "finetune", "distill", "prune", "export", "quantize", "evaluate")))
    pipeline.run(recipe.load(str(root / "r.yaml"), ["finetune.epochs=8", "thresholds=f1"]), root / "run",
                 progress=False)
    return root / "run"


def test_a_multi_label_run_trains_exports_and_scores_label_sets(ml_run):
    m = json.loads((ml_run / "manifest.json").read_text())
    assert m["status"] == "complete"
    config = json.loads((ml_run / "01-finetune" / "model" / "config.json").read_text())
    assert config["problem_type"] == "multi_label_classification" and len(config["id2label"]) == 2
    final = m["final"]["metrics"]
    path = ml_run / m["final"]["path"]
    assert json.loads((path.parent / "model.json").read_text())["multi_label"] is True
    splits = pipeline.context_of(ml_run, progress=False)[1].splits
    said = evaluate.predictions(runtime.load(path), splits.test, 1, False, "")
    assert all(isinstance(y, tuple) and len(y) == 2 for y in said)
    gold = [y for _, y in splits.test]
    assert final["accuracy"] == sum(p == g for p, g in zip(said, gold)) / len(gold)  # the whole set right
    rows = [i for i, g in enumerate(gold) if g[0]]
    assert final["per_class"]["neg"]["recall"] == sum(said[i][0] for i in rows) / len(rows)
    tp = sum(a == b == 1 for p, g in zip(said, gold) for a, b in zip(p, g))
    wrong = sum(a != b for p, g in zip(said, gold) for a, b in zip(p, g))
    assert final["f1_micro"] == 2 * tp / (2 * tp + wrong) and final["teacher_f1_micro"] > 0.5
    assert final["per_class"]["neg"]["teacher_recall"] >= 0.9  # the teacher learned a label from its cues
    out = edgekit.load(ml_run)(["bad awful film", "the plot"])
    assert all(isinstance(labels, list) for labels in out["labels"]) and out["probs"].shape == (2, 2)
    assert out["labels"][0] == [n for n, p in zip(["neg", "pos"], out["probs"][0]) if p > 0.5]


def test_each_label_has_its_recall_precision_and_f1_beside_the_teachers(ml_run):
    """per_class of a multi-label run: each label's recall, precision (None where never said) and F1, the teacher's
    beside them, from the same decisions evaluate scored; the report tables the three per label."""
    examples = [("a", (1, 0)), ("b", (1, 1)), ("c", (0, 1)), ("d", (0, 0))]
    said, teacher_said = [(1, 0), (0, 1), (1, 1), (1, 0)], [(0, 0), (0, 1), (0, 1), (0, 0)]
    assert evaluate.per_class(said, teacher_said, examples, ["x", "y"]) == {  # x: said on a, c, d; right on a
        "x": {"examples": 2, "recall": 0.5, "precision": 1 / 3, "f1": 0.4,
              "teacher_recall": 0.0, "teacher_precision": None, "teacher_f1": 0.0},
        "y": {"examples": 2, "recall": 1.0, "precision": 1.0, "f1": 1.0,
              "teacher_recall": 1.0, "teacher_precision": 1.0, "teacher_f1": 1.0}}
    m = json.loads((ml_run / "manifest.json").read_text())
    ctx = pipeline.context_of(ml_run, progress=False)[1]
    gold = [y for _, y in ctx.splits.test]
    final = evaluate.predictions(runtime.load(ml_run / m["final"]["path"]), ctx.splits.test, 1, False, "")
    teacher = evaluate.predictions(evaluate.teacher_of(ctx), ctx.splits.test, 64, False, "")
    classes = m["final"]["metrics"]["per_class"]
    for k, name in enumerate(ctx.splits.labels):
        for prefix, by in (("", final), ("teacher_", teacher)):
            tp = sum(p[k] == g[k] == 1 for p, g in zip(by, gold))
            told, there = sum(p[k] for p in by), sum(g[k] for g in gold)
            assert classes[name][f"{prefix}precision"] == (tp / told if told else None)
            assert classes[name][f"{prefix}f1"] == 2 * tp / (there + told) and classes[name]["examples"] == there
    kept = [c["f1"] / c["teacher_f1"] for c in classes.values() if c["teacher_f1"]]
    assert m["final"]["metrics"]["label_f1_retained"] == pytest.approx(min(kept), abs=1e-12)
    rows = report.per_class_table(m)
    assert rows[1] == "Recall / precision / F1 per label on the test split (a label never said has no precision):"
    c = classes["neg"]
    cells = [" / ".join("-" if c[f"{p}{k}"] is None else f"{c[f'{p}{k}']:.4f}" for k in ("recall", "precision", "f1"))
             for p in ("teacher_", "")]
    assert f"| neg | {c['examples']} | {cells[0]} | {cells[1]} |" in rows


def test_label_f1_retained_is_the_worst_labels_share_of_its_teachers_f1(ml_run):
    """From the counts: a label the teacher gets all of (F1 1) that the model gets 2 of 3 of with one false alarm
    (F1 4/6) keeps 2/3; a label the teacher never says rightly is left out; a budget on it is gated, and refused for
    single-label data."""
    examples = [("a", (1, 1)), ("b", (1, 0)), ("c", (0, 0)), ("d", (1, 0))]
    teacher = [(1, 0), (1, 0), (0, 0), (1, 0)]  # label 2: never said by the teacher
    model = [(1, 1), (0, 1), (1, 0), (1, 0)]
    assert evaluate.lowest_f1_kept(model, teacher, examples) == 2 / 3
    assert evaluate.lowest_f1_kept(model, [(0, 0)] * 4, examples) is None
    assert evaluate.lowest_f1_kept(teacher, teacher, examples) == 1.0
    value = json.loads((ml_run / "manifest.json").read_text())["final"]["metrics"]["label_f1_retained"]
    assert [r["ok"] for r in gate.check(ml_run, [("label_f1_retained", ">=", value),
                                                ("label_f1_retained", ">", value)])] == [True, False]
    with pytest.raises(UsageError, match="budget label_f1_retained: only a multi-label run measures it"):
        pipeline.check_budget_kind({"label_f1_retained": ">= 0.9"}, False)


def test_predict_writes_label_lists_and_scores_label_sets(ml_run, tmp_path, capsys):
    data_file = ml_run.parent / "d.jsonl"
    assert cli.main(["predict", str(ml_run), "--data", str(data_file), "--out", str(tmp_path / "p.jsonl")]) == 0
    rows = [json.loads(line) for line in (tmp_path / "p.jsonl").read_text().splitlines()]
    given = [json.loads(line)["label"] for line in data_file.read_text().splitlines()]
    assert [r["gold"] for r in rows] == given and all(isinstance(r["label"], list) for r in rows)
    right = sum(r["label"] == r["gold"] for r in rows)
    assert f"accuracy {right / len(rows):.4f} ({right} of {len(rows)} labelled texts)" in capsys.readouterr().out
    assert cli.main(["predict", str(ml_run), "--data", str(data_file), "--out", str(tmp_path / "p.csv")]) == 0
    cells = [line.split(",") for line in (tmp_path / "p.csv").read_text().splitlines()[1:]]
    assert [c[2] for c in cells] == ["|".join(r["label"]) for r in rows]  # --label-separator reads them back
    assert [c[-1] for c in cells] == ["|".join(g) for g in given]
    assert cli.main(["predict", str(ml_run), "--data", str(tmp_path / "p.csv"), "--label-column", "gold",
                     "--label-separator", "|", "--out", str(tmp_path / "again.jsonl")]) == 0
    assert [json.loads(line)["gold"] for line in (tmp_path / "again.jsonl").read_text().splitlines()] == given


def test_the_device_runner_scores_label_sets(ml_run, tmp_path):
    (tmp_path / "t.csv").write_text("text,label\nbad film,neg\ngood bad,neg|pos\nthe plot,\n")
    assert runner.read_labelled(tmp_path / "t.csv", ["neg", "pos"], "text", "label", multi_label=True) == \
        (["bad film", "good bad", "the plot"], [(1, 0), (1, 1), (0, 0)])
    (tmp_path / "u.csv").write_text("text,label\nbad film,neg|rude\n")
    with pytest.raises(runner.BenchError, match=r"labels the multi-label model does not know \(rude; the first on "
                                                r"line 2\)"):
        runner.read_labelled(tmp_path / "u.csv", ["neg", "pos"], "text", "label", multi_label=True)
    m = json.loads((ml_run / "manifest.json").read_text())
    job = tmp_path / "job"
    staged = devices.stage_job(ml_run, m, ml_run / m["final"]["path"], job, 0)
    texts, gold = runner.read_labelled(job / "test.csv", ["neg", "pos"], "text", "label", multi_label=True)
    splits = pipeline.context_of(ml_run, progress=False)[1].splits
    assert staged["examples"] == len(gold) and gold == [y for _, y in splits.test]  # the split evaluate scored
    result = subprocess.run([sys.executable, "-m", "device_bench", str(job / staged["model"]), "--data",
                             str(job / "test.csv"), "--out", str(tmp_path / "r.json"), "--runs", "2", "--warmup",
                             "1", "--seq-len", "16"], capture_output=True, text=True,
                            env={"PYTHONPATH": str(RUNNER), "PATH": "/usr/bin"})
    assert result.returncode == 0, result.stderr
    measured = json.loads((tmp_path / "r.json").read_text())
    assert measured["accuracy"] == m["final"]["metrics"]["accuracy"]  # the device scores as evaluate did
    assert measured["f1_micro"] == m["final"]["metrics"]["f1_micro"] == runner.f1_micro(measured["predictions"], gold)


def test_the_device_runner_reads_label_columns_and_separators_as_compress_does(tmp_path):
    """--label-columns (a 0/1 column per label, a row with one empty or -1 left out) and --label-separator give the
    device the label sets edgekit compress reads from the same file, in the model's label order."""
    flags = [("1", "0", "1"), ("0", "0", "0"), ("true", "TRUE", "false"), ("1.0", "0.0", "0"), ("-1", "-1", "-1"),
             ("1", "", "0"), ("0", "1", "1")]
    f = Path(jigsaw_csv(tmp_path / "j.csv", flags))
    labels = ["threat", "toxic", "insult"]  # the model's order, not the file's
    texts, gold = runner.read_labelled(f, labels, "comment_text", "label", multi_label=True,
                                       flag_columns=("toxic", "insult", "threat"))
    rows = data._read_file(f, "comment_text", "label", "", label_columns="toxic,insult,threat")[0]
    assert texts == [t for t, _, _ in rows] == ["comment 0", "comment 1", "comment 2", "comment 3", "comment 6"]
    assert gold == [tuple(int(n in names) for n in labels) for _, names, _ in rows]
    assert gold[0] == (1, 1, 0) and gold[2] == (0, 1, 1)
    (tmp_path / "j.jsonl").write_text('{"text": "a", "rude": true, "spam": 0}\n{"text": "b", "rude": false, "spam": 1}\n')
    assert runner.read_labelled(tmp_path / "j.jsonl", ["spam", "rude"], "text", "label", multi_label=True,
                                flag_columns=("rude", "spam")) == (["a", "b"], [(0, 1), (1, 0)])
    (tmp_path / "s.csv").write_text("text,label\nbad film,neg;pos\ngood film, pos ;\nthe plot,\nlast,nan\n")
    read = data._read_file(tmp_path / "s.csv", "text", "label", "", label_separator=";")[0]
    assert runner.read_labelled(tmp_path / "s.csv", ["pos", "neg"], "text", "label", multi_label=True,
                                separator=";") == ([t for t, _, _ in read], [(1, 1), (1, 0), (0, 0), (0, 0)])
    assert [names for _, names, _ in read] == [("neg", "pos"), ("pos",), (), ()]
    (tmp_path / "b.csv").write_text("id,comment_text,toxic,insult,threat\n0,fine,0,0,0\n1,rude,1,0.7,-1\n")
    with pytest.raises(runner.BenchError, match=r"b.csv line 3: label column insult holds '0.7'; a label column "
                                                r"holds 0 or 1 \(true or false\); threshold a score first"):
        runner.read_labelled(tmp_path / "b.csv", labels, "comment_text", "label", multi_label=True,
                             flag_columns=("toxic", "insult", "threat"))
    with pytest.raises(runner.BenchError, match=r"needs a header with columns comment_text, toxic, spam and at least "
                                                r"one row; it has .* \(the columns --label-columns names\)"):
        runner.read_labelled(tmp_path / "b.csv", ["toxic", "spam"], "comment_text", "label", multi_label=True,
                             flag_columns=("toxic", "spam"))


@pytest.mark.parametrize("argv, meta, message", [
    (["--label-columns", "neg,pos"], {}, "--label-columns given, but m.onnx is a single-label classifier"),
    (["--label-separator", ";"], {}, "--label-separator given, but m.onnx is a single-label classifier"),
    (["--label-columns", "neg,pos", "--label-separator", ";"], {"multi_label": True}, "give one: --label-columns"),
    (["--label-separator", ""], {"multi_label": True}, "--label-separator is empty"),
    (["--label-columns", "neg,rude"], {"multi_label": True}, "names rude, not among the model's labels (neg, pos)"),
    (["--label-columns", "neg, neg"], {"multi_label": True}, "leaves out the model's label pos; name a 0/1 column"),
])
def test_device_label_options_that_do_not_fit_the_model_are_refused(argv, meta, message):
    args = runner.parser().parse_args(["m.onnx", *argv])
    assert message in runner.option_problem(Path("m.onnx"), {"labels": ["neg", "pos"], **meta}, args)
    fits = runner.parser().parse_args(["m.onnx", "--label-columns", "pos, neg", "--label-separator", ";"][:3])
    assert runner.option_problem(Path("m.onnx"), {"labels": ["neg", "pos"], "multi_label": True}, fits) == ""


def test_a_device_measures_micro_f1_and_checks_f1_budgets(ml_run, tmp_path):
    """A multi-label model's device result holds its micro-F1 over the test split evaluate scored, and
    f1_micro_retained against the teacher's: a target's F1 budgets are checked on them, by bench and by gate."""
    run = tmp_path / "run"
    shutil.copytree(ml_run, run)
    final = json.loads((run / "manifest.json").read_text())["final"]["metrics"]
    (tmp_path / "t.yaml").write_text(yaml.safe_dump({"devices": {"box": {
        "kind": "local", "runs": 2, "warmup": 1, "seq_len": 16,
        "budgets": {"f1_micro_retained": ">= 0.5", "f1_micro": f"< {final['f1_micro']}"}}}}))
    entry = devices.bench(run, "box", tmp_path / "t.yaml", progress=False)
    metrics = entry["metrics"]
    assert metrics["f1_micro"] == final["f1_micro"]
    assert metrics["f1_micro_retained"] == final["f1_micro"] / final["teacher_f1_micro"] == final["f1_micro_retained"]
    assert {r["metric"]: r["ok"] for r in entry["budgets"]} == {"f1_micro_retained": True, "f1_micro": False}
    assert f"micro-F1 {number(final['f1_micro'])} (retained " in devices.summary("box", entry)
    rows = gate.check(run, [("f1_micro_retained", ">=", 0.5)], target="box")
    assert rows[0]["source"] == "on box" and rows[0]["actual"] == metrics["f1_micro_retained"]


def test_f1_budgets_for_a_device_are_refused_for_a_single_label_run(tmp_path):
    single = testing.make_csv(tmp_path / "s.csv")
    (tmp_path / "r.yaml").write_text(testing.tiny_recipe(testing.make_model_dir(tmp_path / "m"), single,
                                                         stages=("export", "evaluate")))
    pipeline.run(recipe.load(str(tmp_path / "r.yaml")), tmp_path / "run", progress=False)
    targets = {"devices": {"box": {"kind": "local", "budgets": {"accuracy": ">= 0.1", "f1_micro": ">= 0.5"}}}}
    (tmp_path / "t.yaml").write_text(yaml.safe_dump(targets))
    with pytest.raises(UsageError, match=r"budget f1_micro: only a multi-label run measures it .* "
                                         r"\(devices.box.budgets.f1_micro=null drops it\)"):
        devices.bench(tmp_path / "run", "box", tmp_path / "t.yaml", progress=False)
    assert "devices" not in json.loads((tmp_path / "run" / "manifest.json").read_text())  # nothing ran nor merged
    with_devices = dict(recipe.load(str(tmp_path / "r.yaml")), devices=targets["devices"])
    with pytest.raises(UsageError, match=r"\(devices.box.budgets.f1_micro=null drops it\)"):
        pipeline.check_inputs(with_devices)


def test_teacher_heads_must_match_the_data_kind_without_finetune(ml_run, tmp_path):
    multi_teacher = ml_run / "01-finetune" / "model"
    single = testing.make_csv(tmp_path / "s.csv")
    (tmp_path / "a.yaml").write_text(testing.tiny_recipe(multi_teacher, single, stages=("export", "evaluate")))
    with pytest.raises(EdgekitError, match="has a multi-label head .* but the data gives one label per row"):
        pipeline.run(recipe.load(str(tmp_path / "a.yaml")), tmp_path / "a", progress=False)
    (tmp_path / "b.yaml").write_text(testing.tiny_recipe(testing.make_model_dir(tmp_path / "m"), ml_run.parent / "d.jsonl",
                                                         stages=("export", "evaluate")))
    with pytest.raises(EdgekitError, match="the data is multi-label .* single-label head"):
        pipeline.run(recipe.load(str(tmp_path / "b.yaml")), tmp_path / "b", progress=False)
    (tmp_path / "c.yaml").write_text(testing.tiny_recipe(multi_teacher, ml_run.parent / "d.jsonl",
                                                         stages=("export", "evaluate")))
    m = pipeline.run(recipe.load(str(tmp_path / "c.yaml")), tmp_path / "c", progress=False)
    assert m["status"] == "complete" and m["final"]["metrics"]["accuracy_retained"] == 1.0  # the teacher exported
    shutil.rmtree(tmp_path / "c")


def test_the_data_takes_a_multi_label_teachers_order(tmp_path):
    """A teacher whose labels come in another order than the data's sorted names (a toxicity model's toxic,
    severe_toxic, obscene, ...): each row's 0/1 tuple is permuted with the names, so position k means the teacher's
    label k."""
    splits = data.load(str(testing.make_multi_label_jsonl(tmp_path / "d.jsonl")))
    moved = pipeline.in_teacher_order(splits, ["pos", "neg"])
    assert moved.labels == ["pos", "neg"] and moved.multi_label
    for (text, y), (same, z) in zip(splits.train + splits.test, moved.train + moved.test):
        assert text == same and z == (y[1], y[0])


def test_the_run_summary_says_what_accuracy_means_and_gives_micro_f1(ml_run):
    m = json.loads((ml_run / "manifest.json").read_text())
    final, said = m["final"]["metrics"], cli.summary(m)
    low, high = final["f1_micro_retained_interval"]
    assert (f"micro-F1 {final['f1_micro']:.4f} against the teacher's {final['teacher_f1_micro']:.4f}, retained "
            f"{final['f1_micro_retained']:.4f} (95% interval {low:.4f}-{high:.4f})") in said
    assert f"(always the commonest label set: {final['majority_accuracy']:.4f})" in said
    final["per_class"] = {  # the label whose F1 fell most is named, not the one whose recall did
        "neg": {"examples": 9, "recall": 0.6, "teacher_recall": 0.9, "precision": 0.9, "teacher_precision": 0.6,
                "f1": 0.72, "teacher_f1": 0.72},
        "pos": {"examples": 11, "recall": 0.9, "teacher_recall": 0.9, "precision": 0.5, "teacher_precision": 0.9,
                "f1": 0.6429, "teacher_f1": 0.9}}
    said = cli.summary(m)
    assert ("label losing most: 'pos', F1 0.6429 against the teacher's 0.9000 (recall 0.9000 against 0.9000; 11 "
            "sentences have it; every label: edgekit report)") in said and "class losing most" not in said
    for c in final["per_class"].values():
        c["f1"] = c["teacher_f1"]
    assert "losing most" not in cli.summary(m)  # no label's F1 fell


def test_compare_scores_a_multi_label_model_on_label_sets_and_no_other_kind(ml_run, tmp_path, capsys):
    from edgekit import compare

    teacher, jsonl = ml_run / "01-finetune" / "model", ml_run.parent / "d.jsonl"
    rows = compare.run([str(teacher)], tmp_path / "c", str(jsonl), seq_len=32, progress=False)
    splits = data.load(str(jsonl))
    said = evaluate.predictions(runtime.HFModel(teacher, max_length=32), splits.test, 64, False, "")
    expected = evaluate.accuracy(runtime.HFModel(teacher, max_length=32), splits.test, 64, False, "")
    assert rows[0]["accuracy"] == expected and 0 < expected < 1
    assert rows[0]["f1_micro"] == round(evaluate.f1_micro(said, splits.test), 4) and rows[0]["f1_micro"] != expected
    table = (tmp_path / "c" / "compare.md").read_text().splitlines()
    assert table[0].endswith("| accuracy | micro-F1 |") and table[2].endswith(f"| {number(rows[0]['f1_micro'])} |")
    rows = compare.run([str(teacher)], tmp_path / "c", str(testing.make_csv(tmp_path / "s.csv")), seq_len=32,
                       progress=False)
    assert "accuracy" not in rows[0] and "f1_micro" not in rows[0]  # exact-match against one class per row: 0
    assert "it is a multi-label classifier and the data gives one label per row" in capsys.readouterr().err


def test_predict_reads_given_labels_as_names_before_indices():
    """Labels named by digits: "1" is the label named 1, as for a single-label model, not the label at index 1;
    an index that names no label is read as one."""
    from edgekit import predict

    assert predict.gold_names([("1",), ("0", "1"), None, ("2",)], ["1", "0", "x"], "f", True) == \
        [["1"], ["1", "0"], None, ["x"]]
    assert predict.gold_names(["1", "2", None], ["1", "0", "x"], "f") == ["1", "x", None]


def test_transfer_texts_join_a_multi_label_run_without_a_label(tmp_path):
    """distill.transfer and prune.transfer add texts whose label is a row of UNLABELLED (a bare UNLABELLED among the
    0/1 tuples could not make one labels tensor)."""
    (tmp_path / "t.txt").write_text("some other text here\nanother line of words\nthe film was a film\nmore text\n")
    (tmp_path / "r.yaml").write_text(testing.tiny_recipe(
        testing.make_model_dir(tmp_path / "m"), testing.make_multi_label_jsonl(tmp_path / "d.jsonl"),
        stages=("finetune", "distill", "prune", "evaluate")))
    overrides = [f"distill.transfer={tmp_path / 't.txt'}", f"prune.transfer={tmp_path / 't.txt'}"]
    m = pipeline.run(recipe.load(str(tmp_path / "r.yaml"), overrides), tmp_path / "run", progress=False)
    assert m["status"] == "complete" and m["stages"][1]["metrics"]["transfer_examples"] == 4
    assert data.no_label(pipeline.context_of(tmp_path / "run", progress=False)[1].splits) == (data.UNLABELLED,) * 2


def test_f1_budgets_gate_a_multi_label_run_and_a_single_label_run_refuses_them(ml_run, tmp_path):
    """f1_micro_retained is the model's micro-F1 over the teacher's, inside its paired interval; gate checks f1
    budgets of a multi-label run, and a single-label recipe that bounds one is refused before its first stage."""
    final = json.loads((ml_run / "manifest.json").read_text())["final"]["metrics"]
    kept = final["f1_micro_retained"]
    assert kept == final["f1_micro"] / final["teacher_f1_micro"]
    low, high = final["f1_micro_retained_interval"]
    assert low <= kept <= high
    rows = gate.check(ml_run, [("f1_micro_retained", ">=", kept), ("f1_micro", ">", final["f1_micro"])])
    assert [(r["ok"], r.get("interval")) for r in rows] == [(True, [low, high]), (False, None)]
    single = testing.make_csv(tmp_path / "s.csv")
    (tmp_path / "s.yaml").write_text(testing.tiny_recipe(testing.make_model_dir(tmp_path / "m"), single,
                                                         stages=("export", "evaluate")))
    bounded = recipe.load(str(tmp_path / "s.yaml"), ["budgets.f1_micro_retained=>= 0.9"])
    for check in (lambda: pipeline.check_inputs(bounded), lambda: pipeline.run(bounded, tmp_path / "r")):
        with pytest.raises(UsageError, match="budget f1_micro_retained: only a multi-label run measures it"):
            check()
    assert not (tmp_path / "r").exists()
    finished = pipeline.run(recipe.load(str(tmp_path / "s.yaml")), tmp_path / "r", progress=False)
    assert "f1_micro" not in finished["final"]["metrics"]
    with pytest.raises(EdgekitError, match="did not measure f1_micro: only a multi-label run's evaluate does"):
        gate.check(tmp_path / "r", [("f1_micro", ">=", 0.5)])


def test_the_f1_interval_resamples_sentences_for_both_models_at_once():
    """Each draw pools the label decisions of the sentences drawn, for model and teacher alike: the same decisions
    keep all of it, and the interval is the percentiles of the ratios drawn (seeded, as kept_interval's)."""
    rng = np.random.default_rng(3)
    gold = [tuple(int(v) for v in rng.random(3) < 0.4) for _ in range(300)]
    teacher = [tuple(g if rng.random() < 0.9 else 1 - g for g in y) for y in gold]
    mine = [tuple(t if rng.random() < 0.9 else 1 - t for t in y) for y in teacher]
    examples = [("text", y) for y in gold]
    assert evaluate.f1_kept_interval(teacher, teacher, examples) == [1.0, 1.0]
    index = np.random.default_rng(0).integers(0, 300, (2000, 300))

    def f1(said, rows):
        return evaluate.f1_micro([said[i] for i in rows], [examples[i] for i in rows])

    ratios = [f1(mine, rows) / f1(teacher, rows) for rows in index]
    assert evaluate.f1_kept_interval(mine, teacher, examples) == [round(float(q), 4)
                                                                  for q in np.percentile(ratios, [2.5, 97.5])]


def test_tuned_thresholds_take_each_labels_best_f1_nearest_one_half():
    """A label whose examples all sit under 0.5 but over the rest gets the grid's cut between them nearest 0.5; a
    label no example has keeps 0.5; decisions are over each label's own threshold."""
    logits = np.array([[-0.5, -3.0, 1.0], [-0.5, -3.0, 1.0], [-2.0, -3.0, -1.0], [-2.0, 2.0, -1.0]])
    examples = [("a", (1, 0, 1)), ("b", (1, 0, 1)), ("c", (0, 0, 0)), ("d", (0, 0, 0))]
    cuts = evaluate.tuned_thresholds(logits, examples)
    assert cuts == [0.35, 0.5, 0.5]  # sigmoid(-0.5) = 0.378 over 0.35, sigmoid(-2) = 0.119 under it
    assert runtime.decided(logits, True, cuts) == [(1, 0, 1), (1, 0, 1), (0, 0, 0), (0, 1, 0)]  # label 1 at 0.5
    assert runtime.decided(logits, True) == runtime.decided(logits, True, [0.5] * 3) == \
        [(0, 0, 1), (0, 0, 1), (0, 0, 0), (0, 1, 0)] and runtime.logit(0.5) == 0.0


def test_thresholds_are_tuned_on_validation_and_every_runtime_decides_by_them(ml_run):
    """Each trained folder's config.json carries its thresholds (tuned on the validation split with its own
    logits), the exported files' model.json carries the last folder's, and edgekit.load and evaluate decide by
    them."""
    ctx = pipeline.context_of(ml_run, progress=False)[1]
    val = ctx.splits.validation
    for stage in ("01-finetune", "02-distill", "03-prune"):
        folder = ml_run / stage / "model"
        logits = evaluate.logits_of(runtime.HFModel(folder, max_length=ctx.max_length), val, 64, False, "")
        assert json.loads((folder / "config.json").read_text())["edgekit_thresholds"] == \
            evaluate.tuned_thresholds(logits, val)
    cuts = json.loads((ml_run / "03-prune" / "model" / "config.json").read_text())["edgekit_thresholds"]
    assert cuts != [0.5, 0.5]  # the tiny model's "pos" sigmoid hovers near 0.5: its cut moved
    m = json.loads((ml_run / "manifest.json").read_text())
    final = ml_run / m["final"]["path"]
    assert json.loads((final.parent / "model.json").read_text())["thresholds"] == cuts
    assert json.loads((ml_run / "04-export" / "model.json").read_text())["thresholds"] == cuts
    model = runtime.load(final)
    texts = [t for t, _ in ctx.splits.test]
    out = edgekit.load(final)(texts)
    assert out["labels"] == [[n for n, p, c in zip(["neg", "pos"], row, cuts) if p > c] for row in out["probs"]]
    said = evaluate.predictions(model, ctx.splits.test, 1, False, "")
    assert said == runtime.decided(evaluate.logits_of(model, ctx.splits.test, 1, False, ""), True, cuts)
    assert said != runtime.decided(evaluate.logits_of(model, ctx.splits.test, 1, False, ""), True)  # 0.5 differs


def test_the_thresholds_setting_reaches_the_files_and_the_teacher_alike(ml_run, tmp_path, capsys):
    """The recipe's thresholds for a teacher exported as it is: 0.5 (the default) writes none, a probability is
    every label's, f1 tunes each label's on the validation split; the teacher decides at the same ones in
    evaluate, whatever another run left in its config, so the teacher exported keeps all of its accuracy."""
    teacher = tmp_path / "teacher"
    shutil.copytree(ml_run / "01-finetune" / "model", teacher)
    tuned = json.loads((teacher / "config.json").read_text())["edgekit_thresholds"]  # ml_run's, tuned (f1)
    (tmp_path / "c.yaml").write_text(testing.tiny_recipe(teacher, ml_run.parent / "d.jsonl",
                                                         stages=("export", "evaluate")))
    plain = None
    for setting, written in ((0.5, None), (0.3, [0.3, 0.3]), ("f1", tuned)):
        m = pipeline.run(recipe.load(str(tmp_path / "c.yaml"), [f"thresholds={setting}"]), tmp_path / str(setting),
                         progress=False)
        assert json.loads((tmp_path / str(setting) / "01-export" / "model.json").read_text()).get("thresholds") == \
            written
        final = m["final"]["metrics"]
        assert final["accuracy_retained"] == 1.0 and final["label_agreement"] == 1.0
        said = runtime.decided(evaluate.logits_of(runtime.load(teacher), ml_run_test(ml_run), 64, False, ""), True,
                               written)
        assert final["teacher_accuracy"] == sum(p == y for p, (_, y) in zip(said, ml_run_test(ml_run))) / len(said)
        plain = plain or final["teacher_accuracy"]
    assert final["teacher_accuracy"] != plain  # f1's thresholds decide otherwise than 0.5 here
    for bad in ("1.5", "0", "auto", "true"):
        with pytest.raises(UsageError, match=r"thresholds must be a probability in \(0, 1\).* or f1"):
            recipe.load(str(tmp_path / "c.yaml"), [f"thresholds={bad}"])
    single = testing.make_csv(tmp_path / "s.csv")
    pipeline.tell_data(data.load(str(single)), False, recipe.load(str(tmp_path / "c.yaml"), ["thresholds=f1"]))
    assert "warning: thresholds is set but does nothing: the data gives one label per text" in capsys.readouterr().err


def ml_run_test(run) -> list:
    return pipeline.context_of(run, progress=False)[1].splits.test


def test_thresholds_that_do_not_fit_the_labels_are_refused(ml_run, tmp_path):
    m = json.loads((ml_run / "manifest.json").read_text())
    folder = tmp_path / "f"
    shutil.copytree((ml_run / m["final"]["path"]).parent, folder)
    meta = json.loads((folder / "model.json").read_text())
    model = folder / Path(m["final"]["path"]).name
    for bad, line in (([0.5], "gives 1 thresholds for 2 labels"), ([0.5, 1.0], "is invalid at thresholds/1")):
        (folder / "model.json").write_text(json.dumps(dict(meta, thresholds=bad)))
        with pytest.raises(EdgekitError, match=line):
            runtime.load(model)
        with pytest.raises(runner.BenchError, match=r"thresholds .* are not one probability in \(0, 1\) per label"):
            runner.read_sidecar(model)


def test_the_thresholds_bench_scores_both_rules_from_the_same_logits(ml_run, tmp_path):
    """bench/thresholds.py tunes each model on the validation split as thresholds: f1 does (the teacher's are the
    ones the run wrote into its config) and scores the test split at 0.5 and at those, from the same logits."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
    try:
        import thresholds as bench
    finally:
        sys.path.pop(0)
    bench.main([str(ml_run), "--out", str(tmp_path / "t.json")])
    result = json.loads((tmp_path / "t.json").read_text())
    assert result["thresholds"]["teacher"] == \
        json.loads((ml_run / "01-finetune" / "model" / "config.json").read_text())["edgekit_thresholds"]
    rows = {(r["model"], r["thresholds"]): r for r in result["rows"]}
    ctx = pipeline.context_of(ml_run, progress=False)[1]
    test = ctx.splits.test
    model = runtime.load(ml_run / json.loads((ml_run / "manifest.json").read_text())["final"]["path"])
    logits = evaluate.logits_of(model, test, 1, False, "")
    cuts = evaluate.tuned_thresholds(evaluate.logits_of(model, ctx.splits.validation, 1, False, ""),
                                     ctx.splits.validation)
    assert result["thresholds"]["final"] == cuts
    for rule, given in (("0.5", None), ("f1", cuts)):
        said = runtime.decided(logits, True, given)
        assert rows["final", rule]["accuracy"] == sum(p == y for p, (_, y) in zip(said, test)) / len(test)
        assert rows["final", rule]["f1_micro"] == evaluate.f1_micro(said, test)
        assert rows["final", rule]["per_label"]["pos"]["recall"] == \
            sum(p[1] for p, (_, y) in zip(said, test) if y[1]) / sum(y[1] for _, y in test)
        assert rows["final", rule]["f1_micro_retained"] == \
            rows["final", rule]["f1_micro"] / rows["teacher", rule]["f1_micro"]
    assert "| final | f1 |" in (tmp_path / "t.md").read_text()
