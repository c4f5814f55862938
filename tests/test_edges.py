"""Edges and orders no other test pinned: a budget on its bound, which heads prune keeps, which node stays in float,
a three-class head reordered, the 95% interval's width, a stage resumed under another key, a shared stage changed in
place, and more. A mutation audit found each gap: every test here fails on the one-line mutant it names."""
import json

import pytest
import torch

from edgekit import cli, data, families, gate, pipeline, recipe, report, runtime, testing
from edgekit.artifact import Artifact
from edgekit.errors import EdgekitError, UsageError
from edgekit.pipeline import Context
from edgekit.stages import evaluate, export, prune, quantize

def test_a_three_class_head_in_another_order_keeps_each_labels_row(tmp_path):
    """M29: families.load_model moves output rows by old.index(n) for n in labels; the inverse permutation is the
    same for two classes (a swap), so only three or more classes can tell."""
    from transformers import AutoModelForSequenceClassification, BertTokenizer

    config = testing.tiny_config("bert")
    config.num_labels = 3
    config.id2label, config.label2id = {0: "a", 1: "b", 2: "c"}, {"a": 0, "b": 1, "c": 2}
    torch.manual_seed(0)
    model = AutoModelForSequenceClassification.from_config(config).eval()
    model.save_pretrained(tmp_path / "m")
    BertTokenizer(vocab=testing.tiny_vocab()).save_pretrained(tmp_path / "m")
    ids = torch.tensor([[2, 10, 12, 5, 3]])
    with torch.no_grad():
        before = model(input_ids=ids).logits
        rotated = families.load_model(tmp_path / "m", ["c", "a", "b"])
        assert families.label_names(rotated.config) == ["c", "a", "b"]
        assert torch.allclose(rotated(input_ids=ids).logits, before[:, [2, 0, 1]], atol=1e-6)


def test_prune_model_keeps_the_highest_scored_heads_and_neurons(tmp_path):
    """M27: the test that silences a head checks only how many heads are left, not which."""
    model = families.load_model(testing.make_model_dir(tmp_path / "m"))
    layer = model.bert.encoder.layer[0]
    query, ffn_in = layer.attention.self.query.weight.detach().clone(), layer.intermediate.dense.weight.detach().clone()
    scores = {"heads": [torch.tensor([0.1, 5.0, 0.2, 4.0])] * 4, "ffn": [torch.arange(64.0)] * 4}
    prune.prune_model(model, 0.5, 0.5, scores)
    layer = model.bert.encoder.layer[0]
    assert torch.equal(layer.attention.self.query.weight, torch.cat([query[8:16], query[24:32]]))  # heads 1 and 3
    assert torch.equal(layer.intermediate.dense.weight, ffn_in[32:])  # the 32 highest-scored neurons, in order


def test_hash_split_is_80_10_10(tmp_path):
    """M38: docs/settings.md and the README promise a deterministic 80/10/10 hash split."""
    f = tmp_path / "d.csv"
    f.write_text("text,label\n" + "\n".join(f"sentence number {i},{'ab'[i % 2]}" for i in range(2000)))
    s = data.load(str(f))
    assert [round(len(x) / 2000, 2) for x in (s.train, s.validation, s.test)] == pytest.approx([0.8, 0.1, 0.1], abs=0.02)


def test_kept_interval_leaves_out_draws_where_the_teacher_gets_nothing_right():
    """8 sentences, the teacher right on the first only, the model on the other 7: a draw without the first has no
    ratio; it counted as 8 right / 1, so the interval reached 8 where no draw with a ratio goes past 7."""
    teacher = [True] + [False] * 7
    low, high = evaluate.kept_interval([not t for t in teacher], teacher)
    assert 0 < low <= high <= 7
    assert evaluate.kept_interval([True, False], [False, False]) is None  # no draw has a ratio


def test_kept_interval_is_95_percent_wide():
    """M39: the 5th-95th percentiles (a 90% interval, reported as 95%) passed every test. With a teacher right on
    every sentence the share kept is the model's accuracy, a binomial proportion: its 95% interval is about
    +-1.96 standard errors."""
    teacher = [True] * 400
    model = [True] * 280 + [False] * 120  # 0.7
    low, high = evaluate.kept_interval(model, teacher)
    assert high - low == pytest.approx(2 * 1.96 * (0.7 * 0.3 / 400) ** 0.5, rel=0.08)


def test_a_budget_on_the_bound_itself_holds_for_le_and_ge_and_fails_for_lt_and_gt():
    """M01/M02: `<=` written `<` (or `>=` as `>`) passed every test: no test puts a value on its bound."""
    assert [recipe.budget_row("size_mb", op, 5.0, 5.0)["ok"] for op in ("<=", ">=", "<", ">")] == \
        [True, True, False, False]


def test_model_files_without_a_budget_are_refused_not_passed(finished, capsys):
    """M11: with `if others or not budgets` cut to `if others`, a gate on a model file with no budget checked
    nothing and exited 0."""
    model = finished / "04-quantize" / "model.onnx"
    with pytest.raises(UsageError, match="only --max-size-mb can be checked"):
        gate.check(model, [])
    assert cli.main(["gate", str(model)]) == 2


def test_a_budget_on_a_metric_the_run_did_not_record_is_an_error_not_a_row(finished):
    """M12: without the 'did not measure' check a missing metric raised KeyError (a traceback), and a null one became
    an OVER row (exit 3) instead of 'could not check' (exit 1)."""
    manifest = json.loads((finished / "manifest.json").read_text())
    del manifest["final"]["metrics"]["accuracy_retained"]
    (finished / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(EdgekitError, match="the run did not measure accuracy_retained"):
        gate.check(finished, [("accuracy_retained", ">=", 0.5)])
    manifest["final"]["metrics"]["accuracy_retained"] = None  # evaluate writes null when the teacher scored 0
    (finished / "manifest.json").write_text(json.dumps(manifest))
    assert cli.main(["gate", str(finished), "--min-accuracy-retained", "0.5"]) == 1


def test_global_scope_keeps_a_head_in_a_layer_whose_scores_are_all_zero():
    """M24: dropping `max(1, ...)` in global scope passed: no test has a layer that loses the global ranking whole."""
    scores = [torch.tensor([9.0, 8.0, 7.0, 6.0]), torch.zeros(4)]  # a silenced layer: every head scores 0
    assert prune.keep_counts(scores, 0.25, 4, "global") == [2, 1]  # the silenced layer still keeps one


def test_a_bound_on_the_end_of_the_interval_is_inside_it():
    """M62: `ci[0] <= bound <= ci[1]` made strict passed."""
    assert gate.interval_note([0.9, 0.95], 0.95) == " (95% interval 0.9000-0.9500, bound inside)"
    assert gate.interval_note([0.9, 0.95], 0.9).endswith("bound inside)")
    assert gate.interval_note([0.9, 0.95], 0.96).endswith("bound outside)")


@pytest.mark.parametrize("result", [{"latency_ms": {"p50": 1, "p90": 1, "p99": 1}},
                                    {"complete": False, "latency_ms": {"p50": 1, "p90": 1, "p99": 1}}])
def test_a_result_the_runner_did_not_mark_complete_is_never_read(result):
    """M60: read_result without its `complete is not True` check passed: every incomplete result in the tests also
    lacks latency_ms or is not JSON."""
    from edgekit import devices

    with pytest.raises(EdgekitError, match="target pi: the runner's result is incomplete; nothing merged"):
        devices.read_result("pi", json.dumps(result))


def test_the_teacher_itself_retains_exactly_all_of_its_accuracy_at_a_short_max_length(tmp_path, model_dir, csv_file):
    """M41: evaluate loading the teacher without max_length (so at 128 tokens, while the artifact is cut at the run's
    max_length) passed: every test recipe's sentences fit in max_length."""
    model = families.load_model(model_dir)
    with torch.no_grad():  # weights 20x their init scale: each sentence's words move its prediction (no training)
        for p in model.parameters():
            p.mul_(20 if p.dim() > 1 else 1)
    model.save_pretrained(model_dir)
    teacher = Artifact(model_dir, "hf")
    ctx = Context(data.load(str(csv_file)), teacher, 0, 5, False)  # [CLS], 3 words, [SEP]: most sentences are cut
    m = evaluate.run(teacher, tmp_path / "e", ctx).metrics
    assert m["accuracy_retained"] == 1.0 and m["accuracy_retained_interval"] == [1.0, 1.0]


def test_the_accuracy_drop_is_measured_on_the_validation_split_never_the_test_split(tmp_path, model_dir, csv_file,
                                                                                    monkeypatch):
    """M20: measuring max_accuracy_drop on the test split passed; the choice of kept nodes would then be fitted to
    the sentences evaluate reports."""
    ctx = Context(data.load(str(csv_file)), Artifact(model_dir, "hf"), 0, 32, False, ["x86"])
    fp32 = export.run(Artifact(model_dir, "hf"), tmp_path / "onnx", ctx, check_sentences=8)
    seen = []
    monkeypatch.setattr(quantize, "correct", lambda model, examples, *a: seen.append(examples) or [True] * len(examples))
    q = quantize.run(fp32, tmp_path / "q", ctx, max_accuracy_drop=0.01, check_sentences=8).metrics["quantization"]
    assert len(seen) == 2 and all(e == ctx.splits.validation for e in seen) and ctx.splits.validation != ctx.splits.test
    assert q["drop_measured_on"] == f"validation ({len(ctx.splits.validation)} sentences)"


def test_parameter_counts_switch_from_k_to_m_at_100k():
    """M52: the k/M threshold (1e5) is untested between 100k and 1M."""
    assert [report.params_text(n) for n in (99_499, 100_000, 420_000)] == ["99k", "0.1M", "0.4M"]


@pytest.mark.parametrize("left_key, resumed", [("key-of-these-settings", True), ("key-of-other-settings", False),
                                               ("key-an-older-edgekit-made", True)])
def test_a_stopped_stage_resumes_only_under_its_own_key(tmp_path, monkeypatch, capsys, left_key, resumed):
    """M43: `.key` compared `or True` passed: no test stops a stage, changes its settings, then runs again, so a
    checkpoint of other settings (epochs, lr, another teacher) would be trained on."""
    partial = tmp_path / "02-distill.partial"
    (partial / "checkpoint").mkdir(parents=True)
    (partial / "checkpoint" / "state.pt").write_text("optimizer state of the stopped run")
    (partial / ".key").write_text(left_key)
    seen = {}

    def stage(artifact, out_dir, ctx, **settings):
        seen["checkpoint"] = (out_dir / "checkpoint" / "state.pt").is_file()
        (out_dir / "model").mkdir()
        return Artifact(out_dir / "model", "hf")

    monkeypatch.setattr(pipeline.stages, "entry", lambda name: stage)
    ctx = Context(None, Artifact(tmp_path, "hf"), 0, 32, False)
    out = pipeline.run_stage("distill", Artifact(tmp_path, "hf"), tmp_path / "02-distill", "key-of-these-settings",
                             ctx, {}, legacy="key-an-older-edgekit-made")  # a run stopped before an upgrade resumes
    assert seen["checkpoint"] is resumed
    assert out.path == tmp_path / "02-distill" / "model" and not partial.exists()
    said = "edgekit: warning: distill: the checkpoint in 02-distill.partial was made with other settings or inputs, " \
           "or by an older edgekit; the stage starts over"  # it was deleted without a word
    assert (said in capsys.readouterr().err) is not resumed


def test_a_shared_stage_whose_file_changed_is_not_taken(tmp_path):
    """M48: from_shared without its sha256 check passed every sweep test: a stage file changed through one of its
    hard links (an edit in any point's folder changes the shared copy too) was reused by the next point."""
    from edgekit import assets

    stage = tmp_path / "run" / "03-export"
    stage.mkdir(parents=True)
    (stage / "model.onnx").write_bytes(b"the exported weights")
    entry = {"name": "export", "key": "k", "metrics": {}, "seconds": 0.0, "reused": False,
             "input": {"path": "02-distill/model", "kind": "hf", "metrics": {}},
             "output": Artifact(stage / "model.onnx", "onnx").to_json(tmp_path / "run"),
             "files": {"03-export/model.onnx": assets.sha256_file(stage / "model.onnx")}}
    pipeline.to_shared(tmp_path / "shared", entry, stage)
    taken = pipeline.from_shared(tmp_path / "shared", "k", tmp_path / "b" / "03-export")
    assert taken["output"]["path"] == "03-export/model.onnx" and (tmp_path / "b" / "03-export" / "model.onnx").is_file()
    (stage / "model.onnx").write_bytes(b"edited in place")  # the same inode as shared/k/stage/model.onnx
    assert pipeline.from_shared(tmp_path / "shared", "k", tmp_path / "c" / "03-export") is None
    assert not (tmp_path / "c" / "03-export").exists()


def context(model_dir, csv_file):
    return Context(data.load(str(csv_file)), Artifact(model_dir, "hf"), 0, 32, False, ["x86"])


def test_the_node_kept_in_float_is_the_one_whose_int8_moves_the_logits_most(tmp_path, model_dir, csv_file,
                                                                            monkeypatch):
    """M18: ordering the nodes least sensitive first passed: the existing test checks how many nodes stay float,
    not which."""
    ctx = context(model_dir, csv_file)
    fp32 = export.run(Artifact(model_dir, "hf"), tmp_path / "onnx", ctx, check_sentences=8)
    probed, excluded = [], []
    real_int8, real_file, real_model = quantize.int8, quantize.quantize_file, runtime.OnnxModel

    def int8(prepared, target, settings, calib, exclude=(), only=None):
        if only:
            probed.append(only[0])
        return real_int8(prepared, target, settings, calib, exclude, only)

    def quantize_file(source, target, fmt, settings, calib, meta, exclude=()):
        excluded.append(list(exclude))
        return real_file(source, target, fmt, settings, calib, meta, exclude)

    class Probe(real_model):  # the third node probed moves the logits far more than any other
        def logits(self, batch):
            return real_model.logits(self, batch) + (100.0 if self.path.name == "probe.onnx" and len(probed) == 3 else 0)

    monkeypatch.setattr(quantize, "int8", int8)
    monkeypatch.setattr(quantize, "quantize_file", quantize_file)
    monkeypatch.setattr(quantize.runtime, "OnnxModel", Probe)
    monkeypatch.setattr(quantize, "correct",  # the drop holds once one node stays float
                        lambda model, *a: testing.answers(0.9 if model.path == fp32.path or excluded[-1] else 0.5))
    q = quantize.run(fp32, tmp_path / "q", ctx, max_accuracy_drop=0.01, check_sentences=8).metrics["quantization"]
    assert len(probed) > 3 and q["kept_float"] == [probed[2]] and q["met"]
    assert not [p.name for p in (tmp_path / "q").rglob("*") if p.name in ("probe.onnx", "prepared.onnx.tmp")]


@pytest.mark.parametrize("with_one_node_float, kept", [(0.89, 1), (0.5, "all")])
def test_nodes_are_kept_in_float_until_the_drop_holds_exactly_or_all_are(tmp_path, model_dir, csv_file, monkeypatch,
                                                                         capsys, with_one_node_float, kept):
    """A drop equal to the limit with one node kept in float holds there (`<` went on to keep every node); a limit
    never met keeps every quantizable node before it warns (without the last doubling some were never tried)."""
    ctx = context(model_dir, csv_file)
    fp32 = export.run(Artifact(model_dir, "hf"), tmp_path / "onnx", ctx, check_sentences=8)
    probed, excluded = [], []
    real_int8, real_file = quantize.int8, quantize.quantize_file

    def int8(prepared, target, settings, calib, exclude=(), only=None):
        probed.extend(only or [])
        return real_int8(prepared, target, settings, calib, exclude, only)

    def quantize_file(source, target, fmt, settings, calib, meta, exclude=()):
        excluded.append(list(exclude))
        return real_file(source, target, fmt, settings, calib, meta, exclude)

    monkeypatch.setattr(quantize, "int8", int8)
    monkeypatch.setattr(quantize, "quantize_file", quantize_file)
    monkeypatch.setattr(quantize, "correct", lambda model, *a: testing.answers(
        0.9 if model.path == fp32.path else with_one_node_float if excluded[-1] else 0.5))
    q = quantize.run(fp32, tmp_path / "q", ctx, max_accuracy_drop=0.01, check_sentences=8).metrics["quantization"]
    assert len(probed) > 3
    if kept == 1:
        assert len(q["kept_float"]) == 1 and q["met"] and "loses" not in capsys.readouterr().err
    else:
        assert sorted(excluded[-1]) == sorted(probed) and not q["met"]
        assert f"with every quantizable node ({len(probed)}) kept in float" in capsys.readouterr().err


@pytest.mark.parametrize("lost, kept", [(300, []), (600, ["node"]), (301, ["node"])])
def test_a_drop_equal_to_max_accuracy_drop_is_met_without_keeping_nodes_in_float(tmp_path, model_dir, csv_file,
                                                                                 monkeypatch, capsys, lost, kept):
    """M17/M21: `drop > max_drop` written `>=` (or met as `<`) passed: every test drop is far from the bound. And
    301 of 30,000 (0.01003) is over 0.01: a difference of accuracies rounded to 4 places (0.9 - 0.89) read 0.01."""
    ctx = context(model_dir, csv_file)
    fp32 = export.run(Artifact(model_dir, "hf"), tmp_path / "onnx", ctx, check_sentences=8)
    monkeypatch.setattr(quantize, "correct", lambda model, *a: [True] * (27000 - (model.path != fp32.path) * lost)
                        + [False] * (3000 + (model.path != fp32.path) * lost))
    monkeypatch.setattr(quantize, "keep_sensitive_in_float", lambda *a: (0.0, ["node"]))
    q = quantize.run(fp32, tmp_path / "q", ctx, max_accuracy_drop=0.01, check_sentences=8).metrics["quantization"]
    assert q["kept_float"] == kept and q["met"] is True
    assert "loses" not in capsys.readouterr().err  # no warning for a drop that holds


def test_batched_predictions_group_sentences_of_one_length_and_come_back_in_order():
    import numpy as np

    from edgekit.stages import evaluate

    class Model:  # class 1 for texts with an "x"; records the lengths of each batch
        batches = []

        def encode(self, texts):
            self.batches.append([len(t) for t in texts])
            return texts

        def logits(self, texts):
            return np.array([[0.0, 1.0] if "x" in t else [1.0, 0.0] for t in texts])

    examples = [("x" * n if n % 3 == 0 else "a" * n, 0) for n in (9, 1, 7, 3, 8, 2, 6, 4)]
    model = Model()
    said = evaluate.predictions(model, examples, 4, False, "test")
    assert said == [int("x" in t) for t, _ in examples]
    assert model.batches == [[1, 2, 3, 4], [6, 7, 8, 9]]  # was file order: each batch padded to its longest
    model.batches.clear()
    assert evaluate.predictions(model, examples, 1, False, "test") == said and model.batches[0] == [9]



class _Says:
    """A model that answers class `said[text]` for each text (texts are "0", "1", ...)."""

    def __init__(self, said):
        self.said = said

    def encode(self, texts):
        return [int(t) for t in texts]

    def logits(self, ids):
        import numpy as np

        return np.array([[1.0, 0.0] if self.said[i] == 0 else [0.0, 1.0] for i in ids])


def _evaluate(tmp_path, monkeypatch, labels, teacher_said, student_said):
    monkeypatch.setattr(runtime, "load", lambda path, **k: _Says(teacher_said if path == "T" else student_said))
    splits = type("Splits", (), {"test": [(str(i), y) for i, y in enumerate(labels)], "labels": ["neg", "pos"],
                                 "multi_label": False})
    ctx = type("Ctx", (), {"splits": splits, "teacher": Artifact("T", "hf"), "max_length": 32, "progress": False})
    return evaluate.run(Artifact("S", "onnx"), tmp_path / "eval", ctx).metrics


def test_a_teacher_no_better_than_the_majority_class_is_warned_about_even_when_equal(tmp_path, monkeypatch, capsys):
    """Half the sentences right on a half/half split is what always answering one class scores: warned."""
    _evaluate(tmp_path, monkeypatch, [0, 0, 1, 1], [0, 0, 0, 0], [0, 0, 0, 0])
    assert "no better than always answering" in capsys.readouterr().err


def test_kept_interval_of_no_examples_is_refused():
    """No examples: the same one-line error as a length mismatch, not a ZeroDivisionError."""
    with pytest.raises(ValueError, match="score both on the same split"):
        evaluate.kept_interval([], [])
