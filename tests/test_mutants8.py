"""Mutation audit 8 (evaluate thresholds and F1, data label columns, runtime decisions, pipeline budget kinds):
behaviour no earlier test pinned down."""
import json
import unicodedata
from dataclasses import replace
from types import SimpleNamespace

import numpy as np
import pytest

from edgekit import data, pipeline, recipe, runtime, testing
from edgekit.errors import EdgekitError, UsageError
from edgekit.stages import evaluate


# evaluate: thresholds

def test_tuning_reaches_both_ends_of_the_grid():
    """The grid runs 0.05 to 0.95: a label whose positives (0.97) and negatives (0.94) only 0.95 tells apart gets
    0.95, and one that only 0.05 tells apart (0.07 and 0.03) gets 0.05: the cut of F1 1, not the next one in."""
    probabilities = np.array([[0.97, 0.07], [0.94, 0.03]])
    logits = np.log(probabilities / (1 - probabilities))
    examples = [("a", (1, 1)), ("b", (0, 0))]
    cuts = evaluate.tuned_thresholds(logits, examples)
    assert cuts == [0.95, 0.05]
    assert runtime.decided(logits, True, cuts) == [(1, 1), (0, 0)]  # every decision right at those cuts


def test_a_probability_exactly_at_a_threshold_is_not_over_it_when_tuning():
    """Tuning scores each threshold as decided() decides (a probability over it): a positive at exactly 0.5 (logit 0)
    is not taken at 0.5, so the best cut nearest 0.5 is 0.45, under which decided() takes it."""
    logits = np.array([[0.0], [-5.0]])
    examples = [("a", (1,)), ("b", (0,))]
    cuts = evaluate.tuned_thresholds(logits, examples)
    assert runtime.decided(logits, True, [0.5]) == [(0,), (0,)]
    assert cuts == [0.45] and runtime.decided(logits, True, cuts) == [(1,), (0,)]


def test_tuning_counts_the_positives_a_threshold_misses():
    """F1 weighs the positives a cut leaves out as much as the negatives it takes in. Positives at 0.92, 0.62 and
    0.42 and a negative at 0.52: every cut up to 0.40 takes all four (F1 6/7), 0.55 and 0.60 miss 0.42 (4/5),
    0.45 and 0.50 take the negative and miss 0.42 (4/6), higher ones miss more; so 0.40, though from 0.55 up
    nothing said is wrong."""
    probabilities = np.array([[0.92], [0.62], [0.42], [0.52]])
    logits = np.log(probabilities / (1 - probabilities))
    examples = [("a", (1,)), ("b", (1,)), ("c", (1,)), ("d", (0,))]
    assert evaluate.tuned_thresholds(logits, examples) == [0.4]


def _multi_label_folder(path, thresholds=None):
    """The tiny model as a two-label multi-label classifier (neg, pos), with `thresholds` in its config."""
    testing.make_model_dir(path)
    config = json.loads((path / "config.json").read_text())
    config.update(problem_type="multi_label_classification", id2label={"0": "neg", "1": "pos"},
                  label2id={"neg": 0, "pos": 1})
    if thresholds:
        config["edgekit_thresholds"] = thresholds
    (path / "config.json").write_text(json.dumps(config))
    return path


def _ctx(thresholds, multi_label=True, validation=(("v", (1, 0)),), labels=("neg", "pos")):
    """A stand-in for a run's Context, as far as cuts_for and tune_folder read one."""
    splits = SimpleNamespace(multi_label=multi_label, validation=list(validation), labels=list(labels))
    return SimpleNamespace(splits=splits, thresholds=thresholds, max_length=32, progress=False)


def test_cuts_for_gives_none_for_single_label_data_and_for_f1_without_validation_rows(tmp_path):
    """thresholds do nothing for single-label data, whatever the recipe says; f1 with no validation row to tune on is
    0.5 (None) rather than a failure; a probability is every label's."""
    unused = tmp_path / "not-read"  # none of these loads the folder
    assert evaluate.cuts_for(unused, _ctx(0.3, multi_label=False)) is None
    assert evaluate.cuts_for(unused, _ctx("f1", validation=())) is None
    assert evaluate.cuts_for(unused, _ctx(0.5)) is None
    assert evaluate.cuts_for(unused, _ctx(0.3, labels=("a", "b", "c"))) == [0.3, 0.3, 0.3]


def test_f1_thresholds_are_tuned_on_logits_truncated_where_the_run_truncates(tmp_path, monkeypatch):
    """cuts_for loads a folder it is not given at the run's max_length, so the logits it tunes on are the ones the
    run's models decide by."""
    folder, built = _multi_label_folder(tmp_path / "m"), []
    made = runtime.HFModel
    monkeypatch.setattr(runtime, "HFModel", lambda path, **kw: built.append(kw) or made(path, **kw))
    ctx = _ctx("f1", validation=[("good film", (0, 1)), ("bad film", (1, 0))])
    cuts = evaluate.cuts_for(folder, ctx)
    assert built == [{"max_length": 32}] and len(cuts) == 2


def test_tune_folder_drops_thresholds_a_config_carried_from_its_teacher(tmp_path):
    """A student's config copied from a teacher tuned in another run keeps none of its thresholds where this run's
    are 0.5, and takes this run's otherwise; the rest of the config is left alone."""
    folder = tmp_path / "student"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "bert", "edgekit_thresholds": [0.2, 0.8]}))
    assert evaluate.tune_folder(folder, _ctx(0.5)) is None
    assert json.loads((folder / "config.json").read_text()) == {"model_type": "bert"}
    assert evaluate.tune_folder(folder, _ctx(0.3)) == [0.3, 0.3]
    assert json.loads((folder / "config.json").read_text()) == {"model_type": "bert", "edgekit_thresholds": [0.3, 0.3]}


# evaluate: micro-F1 and its interval

def test_f1_micro_is_zero_when_every_decision_is_wrong_and_none_when_there_is_none_to_make():
    """Labels given but none said (or said wrong) is an F1 of 0; no label given or said anywhere has no F1."""
    assert evaluate.f1_micro([(0, 0)], [("t", (1, 1))]) == 0.0
    assert evaluate.f1_micro([(1, 0)], [("t", (0, 1))]) == 0.0
    assert evaluate.f1_micro([(0, 0), (0, 0)], [("t", (0, 0)), ("u", (0, 0))]) is None


def test_a_teacher_with_no_label_right_leaves_f1_retained_unmeasured():
    """A teacher whose micro-F1 is 0 has no share to keep: retained and its interval are None, not a division by 0."""
    examples = [("t", (1, 0)), ("u", (1, 0))]
    got = evaluate.f1_measures([(1, 0), (1, 0)], [(0, 1), (0, 0)], examples)
    assert got == {"f1_micro": 1.0, "teacher_f1_micro": 0.0, "f1_micro_retained": None,
                   "f1_micro_retained_interval": None}


def test_the_f1_interval_leaves_out_draws_where_the_teacher_gets_no_label_right():
    """On five sentences of which the teacher gets one label right, a third of the draws miss that sentence: they
    have no ratio and are left out, as kept_interval leaves out draws where the teacher gets nothing right."""
    examples = [("t", (1, 0))] * 5
    teacher = [(1, 0), (0, 1), (0, 1), (0, 0), (0, 0)]
    mine = [(1, 1), (1, 0), (0, 0), (1, 0), (0, 1)]
    index = np.random.default_rng(0).integers(0, 5, (2000, 5))

    def f1(said, rows):
        return evaluate.f1_micro([said[i] for i in rows], [examples[i] for i in rows])

    ratios = [f1(mine, rows) / f1(teacher, rows) for rows in index if f1(teacher, rows)]
    assert 1000 < len(ratios) < 2000  # some draws have no ratio
    assert evaluate.f1_kept_interval(mine, teacher, examples) == [round(float(q), 4)
                                                                  for q in np.percentile(ratios, [2.5, 97.5])]


def test_an_f1_interval_of_no_sentences_is_refused():
    with pytest.raises(ValueError, match="no examples"):
        evaluate.f1_kept_interval([], [], [])


# data: label columns

def _flag_csv(path, header: str, rows: list) -> str:
    path.write_text(header + "\n" + "".join(f"text {i} here,{r}\n" for i, r in enumerate(rows)))
    return str(path)


def test_label_columns_take_yes_and_no_and_skip_every_mark_of_no_score(tmp_path):
    """yes/no are 1/0 as true/false are; -1.0 and nan (any case) mark a row not scored (left out), as -1 does; the
    cells may be padded with spaces."""
    rows = ["yes,no", "no,yes", " 1 , 0 ", "-1.0,1", "nan,0", "1,NaN", "0,1"] * 20
    splits = data.load(_flag_csv(tmp_path / "f.csv", "text,a,b", rows), label_columns="a,b")
    assert splits.stats["skipped"] == 60
    by_text = {t: y for t, y in splits.train + splits.validation + splits.test}
    assert [by_text.get(f"text {i} here") for i in range(7)] == [(1, 0), (0, 1), (1, 0), None, None, None, (0, 1)]


def test_label_columns_ignore_an_empty_name_and_take_names_that_are_not_text(tmp_path):
    """A trailing comma names no column; a YAML list of numbers names the columns headed by those numbers."""
    f = _flag_csv(tmp_path / "f.csv", "text,1,2", ["1,0", "0,1", "1,1"] * 20)
    splits = data.load(f, label_columns="1,2,")
    assert splits.labels == ["1", "2"] and splits.multi_label
    assert data.load(f, label_columns=[1, 2]) == splits


@pytest.mark.parametrize("separator", [";", ","])
def test_label_columns_with_any_label_separator_are_refused(tmp_path, separator):
    """Two ways of giving multi-label labels at once are refused whatever the separator, not only '|'."""
    f = _flag_csv(tmp_path / "f.csv", "text,a,b", ["1,0", "0,1"] * 30)
    with pytest.raises(UsageError, match="give one: label_columns for a 0/1 column per label"):
        data.load(f, label_columns="a,b", label_separator=separator)


def test_a_first_label_column_that_marks_no_training_row_is_refused(tmp_path):
    """Every named column must mark some training row, the first as much as the last."""
    f = _flag_csv(tmp_path / "f.csv", "text,a,b,c", ["0,1,0", "0,0,1"] * 30)
    with pytest.raises(EdgekitError, match=r"label column 'a' marks no training row"):
        data.load(f, label_columns="a,b,c")


def test_a_label_column_named_in_decomposed_unicode_is_read_as_its_labels_are(tmp_path):
    """A header written on macOS (NFD: 'e' and a combining accent) names a column whose labels are read as NFC, as
    every label is; the column marks the rows with a 1 in it like any other. (Was: the check for a column that
    marks no training row compared the name as given, NFD, with the NFC label names, and refused this column, 1 on
    half the rows, as marking none.)"""
    name = unicodedata.normalize("NFD", "caf\u00e9")
    f = _flag_csv(tmp_path / "f.csv", f"text,{name},b", ["1,0", "0,1"] * 30)
    splits = data.load(f, label_columns=f"{name},b")
    assert splits.labels == ["b", unicodedata.normalize("NFC", name)]


def test_a_label_separator_leaves_jsonl_label_lists_as_they_are(tmp_path):
    """With label_separator set, a JSONL row's list is already its labels and a string is cut at the separator."""
    rows = [{"text": f"text {i}", "label": ["a", "b"] if i % 3 == 0 else "a|b" if i % 3 == 1 else ["b"]}
            for i in range(60)]
    (tmp_path / "d.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    splits = data.load(str(tmp_path / "d.jsonl"), label_separator="|")
    by_text = {t: y for t, y in splits.train + splits.validation + splits.test}
    assert splits.labels == ["a", "b"] and [by_text[f"text {i}"] for i in range(3)] == [(1, 1), (1, 1), (0, 1)]


# runtime

def test_a_transformers_folder_decides_at_the_thresholds_in_its_config(tmp_path):
    """edgekit.load of a trained folder decides each label at the config's edgekit_thresholds, as its exports do."""
    cuts = [0.05, 0.95]
    model = runtime.load(_multi_label_folder(tmp_path / "m", cuts))
    assert model.thresholds == cuts
    out = model(["good film", "bad plot", "the movie"])
    assert out["labels"] == [[n for n, p, c in zip(["neg", "pos"], row, cuts) if p > c] for row in out["probs"]]
    assert all(labels == ["neg"] for labels in out["labels"])  # the tiny model's sigmoids sit near 0.5


def test_a_folder_whose_config_gives_thresholds_for_other_labels_is_refused(tmp_path):
    """One threshold for two labels is refused for a transformers folder as it is for an exported file's model.json
    ("gives 1 thresholds for 2 labels"). (Was: HFModel took the config's edgekit_thresholds unchecked, and decided()
    zipped them with the logits, so the second label was silently never given.)"""
    with pytest.raises(EdgekitError, match="1 thresholds for 2 labels"):
        runtime.load(_multi_label_folder(tmp_path / "m", [0.05]))


# pipeline: budget kinds and stage keys

def test_every_multi_label_budget_is_refused_for_single_label_data_and_kept_for_multi_label_data():
    for metric in recipe.MULTI_LABEL_METRICS:
        with pytest.raises(UsageError, match=f"budget {metric}: only a multi-label run measures it"):
            pipeline.check_budget_kind({"accuracy": ">= 0.5", metric: ">= 0.9"}, False)
        pipeline.check_budget_kind({metric: ">= 0.9"}, True)
    pipeline.check_budget_kind({"accuracy_retained": ">= 0.9"}, False)


def test_dry_run_refuses_an_f1_budget_on_a_named_dataset(model_dir, tmp_path):
    """A named dataset gives one label per text: its dry run refuses an f1 budget as its run would."""
    (tmp_path / "r.yaml").write_text(testing.tiny_recipe(model_dir, "rt-polarity", stages=("finetune", "evaluate")))
    bounded = recipe.load(str(tmp_path / "r.yaml"), ["budgets.f1_micro=>= 0.5"])
    with pytest.raises(UsageError, match="budget f1_micro: only a multi-label run measures it"):
        pipeline.check_inputs(bounded)


def _keys(splits):
    base = {"seed": 0, "max_length": 32, "targets": ["x86"]}

    def key(name, thresholds=None, legacy=False, of=splits):
        given = base if thresholds is None else {**base, "thresholds": thresholds}
        return pipeline.stage_key(name, {}, "in", "teacher", of, given, legacy=legacy)
    return key


def test_thresholds_key_the_stages_of_a_multi_label_run_only(tmp_path, csv_file):
    """A multi-label run's stages are redone when its thresholds change (0.5, the default, keys as a recipe without
    the setting); a single-label run's are not, the setting doing nothing there; nor do the keys older runs stored
    (legacy) know of it."""
    multi = data.load(str(testing.make_multi_label_jsonl(tmp_path / "d.jsonl")))
    key = _keys(multi)
    for name in ("finetune", "export", "evaluate"):
        assert key(name) == key(name, 0.5)
        assert len({key(name, 0.5), key(name, 0.3), key(name, 0.7), key(name, "f1")}) == 4, name
        assert key(name, 0.3, legacy=True) == key(name, 0.5, legacy=True)
    single = _keys(data.load(str(csv_file)))
    for name in ("finetune", "evaluate"):
        assert single(name, 0.3) == single(name, "f1") == single(name), name


def test_tuned_thresholds_key_a_training_stage_on_the_validation_split(tmp_path):
    """With thresholds f1 a trained folder's thresholds are tuned on the validation split: a change to it redoes the
    training stage; with a fixed probability it does not (only the training split is keyed)."""
    multi = data.load(str(testing.make_multi_label_jsonl(tmp_path / "d.jsonl")))
    fewer = replace(multi, validation=multi.validation[:-1])
    key = _keys(multi)
    assert key("finetune", "f1") != key("finetune", "f1", of=fewer)
    assert key("finetune", 0.3) == key("finetune", 0.3, of=fewer)


def test_a_run_read_back_keeps_its_thresholds_and_its_teacher_decides_at_them(tmp_path):
    """context_of gives a finished run's thresholds (what bench scripts and device jobs decide by), and evaluate's
    teacher decided at them, not at the 0.5 of the folder's own config."""
    jsonl = testing.make_multi_label_jsonl(tmp_path / "d.jsonl")
    teacher = _multi_label_folder(tmp_path / "m")
    (tmp_path / "r.yaml").write_text(testing.tiny_recipe(teacher, jsonl, stages=("evaluate",)))
    m = pipeline.run(recipe.load(str(tmp_path / "r.yaml"), ["thresholds=0.45"]), tmp_path / "run", progress=False)
    ctx = pipeline.context_of(tmp_path / "run", progress=False)[1]
    assert ctx.thresholds == 0.45
    logits = evaluate.logits_of(runtime.load(teacher, max_length=32), ctx.splits.test, 64, False, "")
    said = runtime.decided(logits, True, [0.45, 0.45])
    assert said != runtime.decided(logits, True)  # 0.45 decides otherwise than 0.5 here
    assert m["final"]["metrics"]["teacher_f1_micro"] == evaluate.f1_micro(said, ctx.splits.test)


def test_a_single_label_run_at_the_default_thresholds_is_not_warned_of_them(csv_file, model_dir, tmp_path, capsys):
    (tmp_path / "r.yaml").write_text(testing.tiny_recipe(model_dir, csv_file, stages=("evaluate",)))
    pipeline.tell_data(data.load(str(csv_file)), False, recipe.load(str(tmp_path / "r.yaml")))
    assert "thresholds" not in capsys.readouterr().err


# recipe

@pytest.mark.parametrize("bad", ["1", "1.0"])
def test_a_threshold_of_one_is_refused(tiny_recipe, bad):
    """(0, 1) is open at both ends: at 1 no label could ever apply."""
    with pytest.raises(UsageError, match=r"thresholds must be a probability in \(0, 1\)"):
        recipe.load(str(tiny_recipe), [f"thresholds={bad}"])


def test_f1_budgets_are_fractions_measured_by_evaluate(tiny_recipe, model_dir, csv_file, tmp_path):
    """The F1 metrics may be bounded; 97 is refused as not a fraction; a recipe without evaluate measures none."""
    loaded = recipe.load(str(tiny_recipe), ["budgets.f1_micro=>= 0.5", "budgets.f1_micro_retained=>= 0.9"])
    assert loaded["budgets"]["f1_micro"] == ">= 0.5" and loaded["budgets"]["f1_micro_retained"] == ">= 0.9"
    for metric in recipe.MULTI_LABEL_METRICS:
        with pytest.raises(UsageError, match=f"budget {metric} 97 is not a fraction"):
            recipe.load(str(tiny_recipe), [f"budgets.{metric}=>= 97"])
    (tmp_path / "unscored.yaml").write_text(testing.tiny_recipe(model_dir, csv_file, stages=("finetune", "export")))
    for metric in recipe.MULTI_LABEL_METRICS:
        with pytest.raises(UsageError, match=f"budget {metric}: no stage of this recipe measures it; add evaluate"):
            recipe.load(str(tmp_path / "unscored.yaml"), [f"budgets.{metric}=>= 0.9"])
