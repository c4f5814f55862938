import json
import os
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from edgekit import cli, devices, gate
from edgekit.errors import EdgekitError, UsageError


def test_gate_passes_and_fails_on_real_metrics(finished, tmp_path, monkeypatch, capsys):
    summary = tmp_path / "summary.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    code = cli.main(["gate", str(finished), "--max-size-mb", "100", "--max-latency-ms-p90", "100000",
                     "--min-accuracy-retained", "1.5", "--junit", str(tmp_path / "gate.xml")])
    out = capsys.readouterr().out.splitlines()
    assert code == 3 and len(out) == 3
    assert out[0].split()[0] == "size_mb" and out[0].endswith("ok") and " OVER (95% interval " in out[2]
    assert out[2].endswith(", bound outside)")  # no share kept reaches 1.5: the split can tell
    suite = ET.parse(tmp_path / "gate.xml").getroot()
    assert suite.get("tests") == "3" and suite.get("failures") == "1"
    assert suite.find("testcase/failure").get("message").endswith(", bound outside)")  # the interval travels too
    assert "| accuracy_retained |" in summary.read_text() and "❌" in summary.read_text()
    assert cli.main(["gate", str(finished / "manifest.json"), "--max-size-mb", "100"]) == 0


def test_without_flags_the_recipe_budgets_are_checked(finished):
    rows = gate.check(finished, [])
    assert [r["metric"] for r in rows] == ["size_mb"] and rows[0]["ok"]


def test_budgets_given_replace_the_recipes_and_a_warning_names_those_left_unchecked(finished, capsys):
    """Loosening one bound in CI dropped the recipe's other budgets without a word."""
    from edgekit import recipe

    op, bound = recipe.parse_bound(json.loads((finished / "manifest.json").read_text())["recipe"]["budgets"]["size_mb"])
    rows = gate.check(finished, [("accuracy_retained", ">=", 0.5)])
    assert [r["metric"] for r in rows] == ["accuracy_retained"]
    assert capsys.readouterr().err == (f"edgekit: warning: the budgets given replace the recipe's; not checked: "
                                       f"size_mb {op} {bound:g} (give them too to check them)\n")
    gate.check(finished, [("size_mb", "<=", 50.0)])  # the recipe's one budget, given with another bound
    gate.check(finished, [])
    assert capsys.readouterr().err == ""


def test_size_is_read_from_the_files_not_trusted_from_the_manifest(finished):
    manifest = json.loads((finished / "manifest.json").read_text())
    manifest["final"]["metrics"]["size_mb"] = 0.0001
    (finished / "manifest.json").write_text(json.dumps(manifest))
    actual = gate.check(finished, [("size_mb", "<=", 100.0)])[0]["actual"]
    assert actual == pytest.approx((finished / "04-quantize" / "model.onnx").stat().st_size / 1e6, abs=1e-3)


def test_size_only_gate_on_model_files_does_not_import_torch(finished):
    model = finished / "04-quantize" / "model.onnx"
    code = ("import sys; from edgekit import cli; rc = cli.main(['gate', %r, '--max-size-mb', '0.001']); "
            "assert 'torch' not in sys.modules; sys.exit(rc)" % str(model))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 3, done.stderr
    assert "OVER" in done.stdout


@pytest.mark.parametrize("change, message", [
    (lambda m: m.update(schema=2), "manifest schema 2; this edgekit reads schema 1"),
    (lambda m: m.update(status="running"), "unfinished run"),
    (lambda m: m["stages"][-2]["files"].update({"04-quantize/gone.bin": "0" * 64}), "missing final model files"),
    (lambda m: m["stages"][-2]["files"].update({"04-quantize/model.onnx": "0" * 64}),  # was a pass on a cut file
     "model.onnx is not the file the run made and measured"),
])
def test_gate_never_passes_when_it_could_not_check(finished, change, message):
    manifest = json.loads((finished / "manifest.json").read_text())
    change(manifest)
    (finished / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(EdgekitError, match=message):
        gate.check(finished, [("size_mb", "<=", 100.0)])


def test_bad_budgets_and_targets(finished, tmp_path):
    with pytest.raises(UsageError, match="unknown metric 'speed'"):
        gate.parse_budget("speed<=3")
    with pytest.raises(UsageError, match="must look like METRIC<=NUMBER"):
        gate.parse_budget("size_mb<=lots")
    assert gate.parse_budget("peak_rss_mb <= 300") == ("peak_rss_mb", "<=", 300.0)
    with pytest.raises(EdgekitError, match="no complete results for target 'pi4'; targets with results: none"):
        gate.check(finished, [("size_mb", "<=", 1.0)], target="pi4")
    with pytest.raises(UsageError, match="only --max-size-mb can be checked"):  # a wrong command line: exit 2
        gate.check(finished / "04-quantize" / "model.onnx", [("accuracy", ">=", 0.5)])
    home = Path.home() / f"edgekit-gate-test-{os.getpid()}.onnx"  # ~ is expanded, as --teacher's is
    shutil.copy(finished / "04-quantize" / "model.onnx", home)
    try:
        assert gate.check(f"~/{home.name}", [("size_mb", "<=", 100.0)])[0]["ok"]
    finally:
        home.unlink()
    with pytest.raises(EdgekitError, match="does not exist"):
        gate.check(tmp_path / "nowhere", [])
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(EdgekitError, match="cannot read"):
        gate.check(tmp_path / "bad.json", [])


def test_a_gate_that_cannot_check_still_writes_its_ci_reports(finished, tmp_path, monkeypatch, capsys):
    summary = tmp_path / "summary.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    manifest = json.loads((finished / "manifest.json").read_text())
    (finished / "manifest.json").write_text(json.dumps(dict(manifest, status="running")))
    assert cli.main(["gate", str(finished), "--junit", str(tmp_path / "g.xml")]) == 1
    suite = ET.parse(tmp_path / "g.xml").getroot()  # there was no file: CI showed "not found", not why
    assert suite.get("errors") == "1" and "unfinished run" in suite.find("testcase/error").get("message")
    assert "could not check: " in summary.read_text()
    (finished / "manifest.json").write_text(json.dumps(manifest))
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(tmp_path / "no" / "summary.md"))  # made a passing gate fail
    assert cli.main(["gate", str(finished), "--max-size-mb", "100"]) == 0
    assert "warning: cannot append to GITHUB_STEP_SUMMARY" in capsys.readouterr().err
    assert cli.main(["gate", str(finished), "--max-size-mb", "100", "--junit", str(tmp_path / "no" / "g.xml")]) == 2
    err = capsys.readouterr().err
    assert "g.xml: its folder does not exist" in err and ".tmp" not in err
    for bad in (["--max-size-mb", "nan"], ["--max-size-mb", "-5"], ["--budget", "size_mb<=nan"]):
        assert cli.main(["gate", str(finished), *bad]) == 2, bad  # were always OVER (exit 3)


def test_size_only_gate_on_a_folder_of_exports_checks_each_one(finished, tmp_path):
    one = finished / "04-quantize" / "model.onnx"
    for target in ("x86-onnx", "arm64-onnx"):  # a multi-target quantize folder
        (tmp_path / "q" / target).mkdir(parents=True)
        shutil.copy(one, tmp_path / "q" / target / "model.onnx")
    rows = gate.check(tmp_path / "q", [("size_mb", "<=", 100.0)])  # was one row: the sum of both files
    assert [r["artifact"] for r in rows] == ["arm64-onnx/model.onnx", "x86-onnx/model.onnx"]
    assert all(r["actual"] == gate.weights_mb(one) for r in rows)
    rows = gate.check(finished / "02-distill" / "model", [("size_mb", "<=", 100.0)])  # a transformers folder: one
    assert len(rows) == 1 and "artifact" not in rows[0] and rows[0]["actual"] > 0


def test_size_only_gate_refuses_files_that_are_not_models(finished, tmp_path):
    for name in ("tiny.yaml", "data.csv"):  # each passed as 0 MB of weights
        (tmp_path / name).write_text("x: 1\n")
        with pytest.raises(EdgekitError, match=f"{name} holds no model weights"):
            gate.check(tmp_path / name, [("size_mb", "<=", 5.0)])
    (tmp_path / "config.json").write_text('{"model_type": "bert"}')  # said: manifest schema None; upgrade edgekit
    with pytest.raises(EdgekitError, match="config.json is not an edgekit run manifest"):
        gate.check(tmp_path / "config.json", [("size_mb", "<=", 5.0)])


def test_a_target_that_ran_another_model_is_not_gated_with_the_final_models_size(finished):
    manifest = json.loads((finished / "manifest.json").read_text())
    device = {"kind": "local", "complete": True, "metrics": {"latency_ms_p90": 1.0}}
    manifest["devices"] = {"fp32": {**device, "model": "03-export/model.onnx"},
                           "final": {**device, "model": manifest["final"]["path"]}}
    (finished / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(EdgekitError, match="target 'fp32' ran 03-export/model.onnx, not the run's final model"):
        gate.check(finished, [("latency_ms_p90", "<=", 40.0)], target="fp32")
    rows = gate.check(finished, [("latency_ms_p90", "<=", 40.0), ("size_mb", "<=", 100.0)], target="final")
    assert [r["ok"] for r in rows] == [True, True]


def test_device_results_from_edgekit_bench_are_gated_only_when_complete(finished):
    manifest = json.loads((finished / "manifest.json").read_text())
    manifest["devices"] = {"pi4": {"kind": "ssh", "complete": True, "metrics": {"latency_ms_p90": 42.0}},
                           "phone": {"kind": "adb", "complete": False, "error": "device offline",
                                     "metrics": {"latency_ms_p90": 1.0}}}
    (finished / "manifest.json").write_text(json.dumps(manifest))
    rows = gate.check(finished, [("latency_ms_p90", "<=", 40.0)], target="pi4")
    assert [(r["actual"], r["ok"]) for r in rows] == [(42.0, False)]  # the device's number, not this machine's
    with pytest.raises(EdgekitError, match="no complete results for target 'phone'; targets with results: pi4"):
        gate.check(finished, [("latency_ms_p90", "<=", 40.0)], target="phone")
    manifest["devices"]["pi4"]["budgets"] = [{"metric": "latency_ms_p90", "op": "<=", "target": 40.0, "actual": 42.0,
                                              "ok": False}]
    (finished / "manifest.json").write_text(json.dumps(manifest))
    rows = gate.check(finished, [], target="pi4")  # the recipe's budgets and the target's own: it passed before
    assert [(r["metric"], r["ok"]) for r in rows] == [("size_mb", True), ("latency_ms_p90", False)]


def test_budgets_given_with_a_target_name_the_targets_own_left_unchecked(finished, capsys):
    """`gate RUN --target pi4 --max-size-mb 25` dropped pi4's latency budget without a word."""
    manifest = json.loads((finished / "manifest.json").read_text())
    manifest["devices"] = {"pi4": {"kind": "ssh", "complete": True, "metrics": {"latency_ms_p90": 42.0},
                                   "budgets": [{"metric": "latency_ms_p90", "op": "<=", "target": 40.0}]}}
    (finished / "manifest.json").write_text(json.dumps(manifest))
    capsys.readouterr()
    assert [r["metric"] for r in gate.check(finished, [("size_mb", "<=", 25.0)], target="pi4")] == ["size_mb"]
    assert "replace the recipe's and target pi4's; not checked: latency_ms_p90 <= 40 (give them too" in \
        capsys.readouterr().err


def test_a_model_file_or_a_run_in_progress_is_named_as_such(finished, tmp_path):
    with pytest.raises(EdgekitError, match="model.onnx is a file, not a run"):  # was a 'utf-8' codec error
        gate.load_manifest(finished / "04-quantize" / "model.onnx")
    (tmp_path / "r" / "01-finetune.partial").mkdir(parents=True)
    with pytest.raises(EdgekitError, match="no manifest.json yet: its first stage is still running or was stopped"):
        gate.load_manifest(tmp_path / "r")


def test_a_target_is_gated_on_what_it_measured_and_each_row_says_where_from(finished, capsys):
    manifest = json.loads((finished / "manifest.json").read_text())
    manifest["devices"] = {"pi4": {"kind": "ssh", "complete": True, "model": manifest["final"]["path"],
                                   "metrics": {"accuracy_retained": 0.95}}}  # no latency: as benchmark_model's
    (finished / "manifest.json").write_text(json.dumps(manifest))
    budgets = [("latency_ms_p90", "<=", 1e6), ("accuracy_retained", ">=", 0.5), ("accuracy", ">=", 0.0),
               ("size_mb", "<=", 100.0)]
    rows = gate.check(finished, budgets, target="pi4")
    latency, retained, accuracy, size = rows  # the latency was this machine's, and passed
    assert latency["ok"] is False and latency["actual"] is None and latency["error"] == "not measured on pi4"
    assert (retained["actual"], retained["source"]) == (0.95, "on pi4") and "interval" not in retained
    assert accuracy["source"] == "build machine" and size["source"] == "file"
    code = cli.main(["gate", str(finished), "--target", "pi4", "--max-latency-ms-p90", "1000000",
                     "--min-accuracy-retained", "0.5", "--budget", "accuracy>=0"])
    out = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()}
    assert code == 3 and out["latency_ms_p90"].split()[:4] == ["latency_ms_p90", "-", "<=", "1e+06"]
    assert out["latency_ms_p90"].endswith("OVER (not measured on pi4)")
    assert out["accuracy_retained"].endswith("ok (on pi4)") and out["accuracy"].endswith("ok (build machine)")
    assert gate.markdown(rows, "t").count("not measured on pi4") == 1 and "not measured on pi4" in gate.junit(rows, "t")
    assert gate.lines(gate.check(finished, [("latency_ms_p90", "<=", 1e6)]))[0].endswith(" ok")  # no target: as before
    manifest["devices"]["pi4"]["metrics"]["latency_ms_p90"] = -1  # recorded before results were checked
    (finished / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(EdgekitError, match="target 'pi4' recorded latency_ms_p90 -1, not a finite number >= 0"):
        gate.check(finished, budgets, target="pi4")


def test_gate_checks_an_upload_of_the_final_stage_and_never_sizes_a_stopped_run(finished, tmp_path):
    """docs/ci.md's gate-only job: manifest.json and the final stage's folder, as the compress job uploads them (was:
    'missing stage outputs 01-finetune/...', exit 1). A stopped run has no manifest and a checkpoint: it was sized as
    model files and passed."""
    manifest = json.loads((finished / "manifest.json").read_text())
    final_dir = manifest["final"]["path"].split("/")[0]
    upload = tmp_path / "upload"
    upload.mkdir()
    shutil.copy(finished / "manifest.json", upload)
    shutil.copytree(finished / final_dir, upload / final_dir)
    assert [r["ok"] for r in gate.check(upload, [("size_mb", "<=", 100.0), ("accuracy_retained", ">=", 0.1)])] == \
        [True, True]
    shutil.rmtree(upload / final_dir)
    with pytest.raises(EdgekitError, match="missing final model files"):
        gate.check(upload, [("size_mb", "<=", 100.0)])
    stopped = tmp_path / "stopped"
    (stopped / "01-finetune.partial" / "checkpoint").mkdir(parents=True)
    shutil.copy(finished / final_dir / "model.onnx", stopped / "01-finetune.partial" / "checkpoint" / "state.pt")
    with pytest.raises(EdgekitError, match="has no manifest.json yet: its first stage is still running or was stopped"):
        gate.check(stopped, [("size_mb", "<=", 100.0)])
    assert cli.main(["gate", str(stopped), "--max-size-mb", "100"]) == 1


def test_a_budget_on_the_worst_served_class_is_measured_by_evaluate_and_gated(finished, tmp_path, capsys):
    from edgekit import recipe
    from edgekit.stages import evaluate

    classes = {"neg": {"examples": 4, "recall": 0.5, "teacher_recall": 0.5},
               "pos": {"examples": 5, "recall": 0.4, "teacher_recall": 0.8},
               "none": {"examples": 2, "recall": 0.5, "teacher_recall": 0.0}}  # the teacher never right: left out
    assert evaluate.lowest_kept(classes) == 0.5 and evaluate.lowest_kept({"none": classes["none"]}) is None
    manifest = json.loads((finished / "manifest.json").read_text())
    final = manifest["final"]["metrics"]
    assert final["class_recall_retained"] == evaluate.lowest_kept(final["per_class"])
    assert gate.check(finished, [("class_recall_retained", ">=", 0.9)])[0]["ok"] is (final["class_recall_retained"]
                                                                                    >= 0.9)
    assert final["class_recall_measured"] == [sum(c["teacher_recall"] > 0 for c in final["per_class"].values()), 2]
    final["class_recall_retained"] = 0.6  # a class that lost 40% of its recall
    final["class_recall_measured"] = [1, 2]  # a note says on how few classes it was measured (it passed silently)
    (finished / "manifest.json").write_text(json.dumps(manifest))
    assert cli.main(["gate", str(finished), "--budget", "class_recall_retained>=0.9"]) == 3
    assert "(1 of 2 classes measured: the teacher gets none of the others right)" in capsys.readouterr().out
    assert "is not a fraction" in recipe.bound_problem("class_recall_retained", 90)  # 0.9, never 90
    assert recipe._check_budgets({"budgets": {"class_recall_retained": ">= 0.9"}, "stages": ["export"]}) == [
        "budget class_recall_retained: no stage of this recipe measures it; add evaluate to stages, or drop the "
        "budget (budgets.class_recall_retained=null)"]


def test_onnx_external_data_counts_under_any_name_and_travels_to_the_device(finished, tmp_path, monkeypatch):
    import onnx

    from edgekit import artifact, devices

    source = finished / "04-quantize"
    runner = devices.runner_module()
    manifest = json.loads((finished / "manifest.json").read_text())
    for name, where in (("model.onnx_data", ""), ("weights.data", "data/")):  # Optimum's name; a subfolder
        folder = tmp_path / name.replace(".", "-")
        (folder / where).mkdir(parents=True)
        onnx.save_model(onnx.load(source / "model.onnx"), folder / "model.onnx", save_as_external_data=True,
                        all_tensors_to_one_file=True, location=where + name, size_threshold=0)
        for sidecar in ("model.json", "tokenizer.json"):
            shutil.copy(source / sidecar, folder)
        total = sum(p.stat().st_size for p in (folder / "model.onnx", folder / where / name))
        assert (folder / where / name).stat().st_size > 10_000  # the weights are in the other file
        assert artifact.weights_mb(folder / "model.onnx") == round(total / 1e6, 6)  # the .onnx alone was counted
        assert runner.weights_bytes(folder / "model.onnx") == total  # the device's runner counts the same
        rows = gate.check(folder, [("size_mb", "<=", total / 1e6 - 1e-6)])
        assert [r["ok"] for r in rows] == [False]  # a size-only gate of the folder: over by one byte
        into = tmp_path / f"job-{name}"
        into.mkdir()
        devices.stage_job(finished, manifest, folder / "model.onnx", into)  # what edgekit bench ships
        assert (into / "model" / where / name).stat().st_size == (folder / where / name).stat().st_size
    monkeypatch.chdir(tmp_path)  # a folder named relatively: its data file was counted twice (once resolved)
    assert artifact.weights_mb(Path(folder.name)) == artifact.weights_mb(folder)
    devices.stage_job(finished, manifest, Path(folder.name) / "model.onnx", tmp_path / "job-relative")  # `edgekit
    assert (tmp_path / "job-relative" / "model" / "data" / "weights.data").is_file()  # bench a/run`: ValueError
    assert artifact.weights_mb(Path(folder.name) / "data" / "..") == artifact.weights_mb(folder)  # was twice too
    code = ("import sys; sys.modules['onnx'] = None; from edgekit import cli; "  # docs/ci.md's light gate install
            "sys.exit(cli.main(['gate', %r, '--max-size-mb', '25']))")
    done = subprocess.run([sys.executable, "-c", code % str(folder / "model.onnx")], capture_output=True, text=True)
    assert (done.returncode, done.stderr.count("\n")) == (1, 1), done.stderr  # was a ModuleNotFoundError traceback
    assert "needs the onnx package; pip install onnx" in done.stderr
    done = subprocess.run([sys.executable, "-c", code % str(source / "model.onnx")], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr  # a model holding its weights needs no onnx package


def test_size_and_shares_kept_are_compared_exactly_and_shown_on_their_side_of_the_bound(tmp_path, capsys,
                                                                                    monkeypatch):
    import numpy as np

    from edgekit import pipeline, runtime
    from edgekit.artifact import Artifact
    from edgekit.stages import evaluate

    model = tmp_path / "model.onnx"
    model.write_bytes(b"\0" * 6_000_499)  # 6.000499 MB: it read 6.0 (rounded to 3 places) and passed <= 6
    assert cli.main(["gate", str(model), "--max-size-mb", "6"]) == 3
    assert capsys.readouterr().out.split()[1:3] == ["6.0005", "<="]

    class Fake:  # right on the first `right` of 1,320 sentences, all of label 0
        def __init__(self, right):
            self.right = right

        def encode(self, texts):
            return np.array([int(t) for t in texts])

        def logits(self, ids):
            return np.stack([[1.0, 0.0] if i < self.right else [0.0, 1.0] for i in ids])

    monkeypatch.setattr(runtime, "load", lambda path, **k: Fake(999 if path == "T" else 969))
    splits = type("Splits", (), {"test": [(str(i), 0) for i in range(1320)], "labels": ["a", "b"], "multi_label": False})
    ctx = type("Ctx", (), {"splits": splits, "teacher": Artifact("T", "hf"), "max_length": 32, "progress": False})
    m = evaluate.run(Artifact("S", "onnx"), tmp_path / "eval", ctx).metrics
    assert m["accuracy_retained"] == 969 / 999  # 0.96997: from the rounded accuracies it was 0.97
    assert m["class_recall_retained"] == 969 / 999  # likewise from the rounded recalls
    row = pipeline.check_budgets({"accuracy_retained": ">= 0.97"}, m)[0]
    assert not row["ok"] and gate.number(row) == "0.96997"  # never shown as 0.97 beside OVER
    assert gate.number(dict(row, actual=0.9712, ok=True)) == "0.9712"
    assert gate.number(dict(row, actual=0.9699996)) == "0.9699996"  # 6 significant digits read 0.97


def test_a_final_model_outside_the_run_is_checked_against_the_run_or_refused(finished, tmp_path):
    from edgekit import pipeline, recipe, testing

    teacher = tmp_path / "teacher"  # a recipe whose stages write no model: its final model is the teacher itself
    shutil.copytree(finished / "01-finetune" / "model", teacher)
    (tmp_path / "r.yaml").write_text(testing.tiny_recipe(teacher, testing.make_csv(tmp_path / "d.csv"), ("evaluate",)))
    pipeline.run(recipe.load(str(tmp_path / "r.yaml")), tmp_path / "ev", progress=False)
    assert json.loads((tmp_path / "ev" / "manifest.json").read_text())["final"]["path"] == str(teacher)
    assert gate.check(tmp_path / "ev", [])[0]["ok"]
    with open(teacher / "model.safetensors", "ab") as f:  # was a pass on a changed model
        f.write(b"x")
    with pytest.raises(EdgekitError, match="is not the model the run measured"):
        gate.check(tmp_path / "ev", [])
    shutil.rmtree(teacher)  # was "holds no model weights"
    with pytest.raises(EdgekitError, match=f"its teacher {teacher}, is not there"):
        gate.check(tmp_path / "ev", [])
    manifest = json.loads((finished / "manifest.json").read_text())
    manifest["final"]["path"] = "../elsewhere/model.onnx"  # an edited manifest: it sized a file of another run
    (finished / "manifest.json").write_text(json.dumps(manifest))
    (finished.parent / "elsewhere").mkdir()
    shutil.copy(finished / "04-quantize" / "model.onnx", finished.parent / "elsewhere")
    with pytest.raises(EdgekitError, match="lies outside .* where no stage wrote it"):
        gate.check(finished, [])


def test_every_refusal_replaces_the_ci_reports_and_odd_paths_still_give_valid_junit(finished, tmp_path, capsys,
                                                                                    monkeypatch):
    report, summary = tmp_path / "gate.xml", tmp_path / "summary.md"
    assert cli.main(["gate", str(finished), "--junit", str(report)]) == 0  # a pass, then a gate that cannot check
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    for bad, said in ((["--budget", "size<=1"], "names unknown metric 'size'"),
                      (["--max-size-mb", "25MB"], "--max-size-mb 25MB: give a number, without a unit")):
        assert cli.main(["gate", str(finished), *bad, "--junit", str(report)]) == 2
        assert said in capsys.readouterr().err
        error = ET.parse(report).getroot().find("testcase/error")  # the earlier pass stayed in the file
        assert error is not None and said in error.get("message") and said in summary.read_text()
    assert cli.main(["gate", str(finished), "--max-size-mb", "100", "--budget", "size_mb<=100"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 1  # one budget given twice: was two rows, two testcases
    assert cli.main(["gate", str(finished), "--junit", str(tmp_path)]) == 2
    assert f"--junit {tmp_path} is a folder" in capsys.readouterr().err
    for odd in ("ctl\x01x", "w&<\"x'\udcff"):  # a control character, an undecodable byte (os.fsdecode of 0xff)
        run = tmp_path / odd
        shutil.copytree(finished, run)
        assert cli.main(["gate", str(run), "--max-size-mb", "0.001", "--junit", str(report)]) == 3
        suite = ET.parse(report).getroot()  # it was not well-formed, or a UnicodeEncodeError traceback
        assert suite.get("failures") == "1" and ("\\x01" in suite.get("name") or "\\udcff" in suite.get("name"))
    assert summary.read_text(encoding="utf-8").count("### edgekit gate") == 6  # 3 refusals (one of a --junit
    # folder: said in the summary too), 1 pass, 2 odd paths


def test_a_run_of_an_older_edgekit_is_gated_on_its_counts_not_its_rounded_ratio(finished, capsys):
    """Before evaluate's REVISION 5 a run stored round(0.8036 / 0.8512, 4) = 0.9441 for 135 of 143 right on 168
    sentences (0.94406): gate read it and passed `>= 0.9441`; the same run compressed again fails it."""
    manifest = json.loads((finished / "manifest.json").read_text())
    for entry in [manifest["final"], *(manifest["final"].get("outputs") or {}).values()]:
        entry["metrics"].update(accuracy=0.8036, teacher_accuracy=0.8512, eval_examples=168, accuracy_retained=0.9441)
        entry["metrics"].pop("accuracy_retained_interval", None)
    (finished / "manifest.json").write_text(json.dumps(manifest))
    assert cli.main(["gate", str(finished), "--min-accuracy-retained", "0.9441"]) == 3
    assert "0.94406" in capsys.readouterr().out
    assert cli.main(["gate", str(finished), "--min-accuracy-retained", "0.944"]) == 0


def test_a_teacher_that_scored_nothing_is_named_as_the_reason(finished, capsys):
    manifest = json.loads((finished / "manifest.json").read_text())
    for entry in [manifest["final"], *(manifest["final"].get("outputs") or {}).values()]:
        entry["metrics"].update(teacher_accuracy=0, accuracy_retained=None)
    (finished / "manifest.json").write_text(json.dumps(manifest))
    assert cli.main(["gate", str(finished), "--min-accuracy-retained", "0.5"]) == 1
    assert "accuracy_retained is undefined: the teacher scored 0 on the run's test split" in capsys.readouterr().err


def test_a_size_gate_on_a_folder_skips_files_of_a_stopped_stage_below_it(finished, tmp_path, capsys):
    exports = tmp_path / "exports"
    (exports / "old" / "01-quantize.partial").mkdir(parents=True)
    shutil.copy(finished / "03-export" / "model.onnx", exports / "a.onnx")
    (exports / "old" / "01-quantize.partial" / "model.onnx").write_bytes(b"\0" * 10_000_000)  # half written
    assert cli.main(["gate", str(exports), "--max-size-mb", "5"]) == 0
    out = capsys.readouterr().out
    assert "a.onnx" in out and "partial" not in out


@pytest.mark.parametrize("where", ["outside the model's folder", "missing"])
def test_external_data_that_onnx_runtime_would_not_load_is_not_counted(tmp_path, where):
    import numpy as np
    import onnx
    from onnx import helper, numpy_helper

    from edgekit import artifact

    weight = numpy_helper.from_array(np.ones((64, 64), np.float32), "w")
    graph = helper.make_graph([helper.make_node("Identity", ["w"], ["y"])], "g", [],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [64, 64])], [weight])
    model = helper.make_model(graph)
    (tmp_path / "m").mkdir()
    onnx.save(model, str(tmp_path / "m" / "model.onnx"), save_as_external_data=True, location="w.data",
              size_threshold=0)
    if where == "missing":
        (tmp_path / "m" / "w.data").unlink()
    else:  # the model names ../w.data: ONNX Runtime refuses a location outside the model's folder
        (tmp_path / "m" / "w.data").rename(tmp_path / "w.data")
        m = onnx.load(str(tmp_path / "m" / "model.onnx"), load_external_data=False)
        m.graph.initializer[0].external_data[0].value = "../w.data"
        onnx.save(m, str(tmp_path / "m" / "model.onnx"))
    assert artifact.onnx_data_files(tmp_path / "m" / "model.onnx") == []
    assert artifact.weights_mb(tmp_path / "m" / "model.onnx") == (tmp_path / "m" / "model.onnx").stat().st_size / 1e6


def test_external_data_of_tensors_inside_if_branches_is_counted(tmp_path):
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from edgekit import artifact

    def branch(name, value):  # an If's branches hold their own initializers
        weight = numpy_helper.from_array(np.full((64, 64), value, np.float32), f"{name}_w")
        return helper.make_graph([helper.make_node("Identity", [f"{name}_w"], [f"{name}_y"])], name, [],
                                 [helper.make_tensor_value_info(f"{name}_y", TensorProto.FLOAT, [64, 64])], [weight])

    node = helper.make_node("If", ["c"], ["y"], then_branch=branch("t", 1.0), else_branch=branch("e", 2.0))
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("c", TensorProto.BOOL, [])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [64, 64])])
    onnx.save(helper.make_model(graph), str(tmp_path / "model.onnx"), save_as_external_data=True, location="w.data",
              size_threshold=0)
    assert artifact.onnx_data_files(tmp_path / "model.onnx") == [tmp_path.resolve() / "w.data"]
    assert artifact.weights_mb(tmp_path / "model.onnx") == sum(p.stat().st_size for p in tmp_path.iterdir()) / 1e6
    runner = devices.runner_module()  # the device's own reader of the protobuf, without the onnx package
    assert [p.name for p in runner.weight_files(tmp_path / "model.onnx")] == ["model.onnx", "w.data"]


def test_json_verdict_to_a_file_and_to_stdout_and_when_nothing_could_be_checked(finished, tmp_path, capsys):
    report = tmp_path / "gate.json"
    code = cli.main(["gate", str(finished), "--max-size-mb", "100", "--min-accuracy-retained", "1.5",
                     "--json", str(report)])
    verdict = json.loads(report.read_text())
    assert code == 3 and verdict["ok"] is False and verdict["error"] is None and verdict["checked"] == str(finished)
    size, kept = verdict["budgets"]
    assert (size["metric"], size["op"], size["bound"], size["ok"]) == ("size_mb", "<=", 100, True)
    assert size["actual"] == gate.check(finished, [("size_mb", "<=", 100.0)])[0]["actual"] > 0
    assert (kept["metric"], kept["op"], kept["bound"], kept["ok"]) == ("accuracy_retained", ">=", 1.5, False)
    assert len(kept["interval"]) == 2 and kept["interval"][0] <= kept["actual"] <= kept["interval"][1]
    assert len(capsys.readouterr().out.splitlines()) == 2  # a file: the table still prints
    assert cli.main(["gate", str(finished), "--max-size-mb", "100", "--json", "-"]) == 0
    printed = json.loads(capsys.readouterr().out)  # in place of the table: stdout is the JSON alone
    assert printed["ok"] is True and [b["metric"] for b in printed["budgets"]] == ["size_mb"]
    assert cli.main(["gate", str(finished), "--budget", "size<=1", "--json", str(report)]) == 2
    verdict = json.loads(report.read_text())  # the earlier verdict is replaced, never left to pass
    assert verdict["ok"] is False and verdict["budgets"] == [] and "names unknown metric 'size'" in verdict["error"]
    for bad, said in ((["--json", str(tmp_path)], "is a folder"), (["--json", str(tmp_path / "no" / "g.json")],
                                                                  "its folder does not exist"),
                      (["--junit", "-"], "--junit - is not allowed"),
                      (["--junit", str(report), "--json", str(report)], "give each its own file")):
        assert cli.main(["gate", str(finished), "--max-size-mb", "100", *bad]) == 2
        assert said in capsys.readouterr().err


def test_json_verdict_holds_no_nan_and_names_each_artifact():
    rows = [dict(metric="size_mb", op="<=", target=1.0, actual=float("nan"), ok=False, artifact="x86-onnx"),
            dict(metric="latency_ms_p90", op="<=", target=2.0, actual=None, ok=False, error="not measured on pi4")]
    verdict = json.loads(gate.as_json(rows, "r"))  # strict JSON: NaN is not JSON
    assert verdict["budgets"][0]["actual"] is None and verdict["budgets"][0]["artifact"] == "x86-onnx"
    assert verdict["budgets"][1]["error"] == "not measured on pi4" and verdict["ok"] is False
    assert json.loads(gate.as_json([], "r", error="e"))["ok"] is False  # nothing checked never reads as a pass


def test_gate_lines_align_whatever_the_artifact_names():
    rows = [dict(metric=m, op="<=", target=1.0, actual=0.5, ok=True, artifact=a)
            for a in ("x86-onnx", "x86-torchscript") for m in ("size_mb", "accuracy_retained")]
    printed = gate.lines(rows)
    assert len({line.index(" <= ") for line in printed}) == 1, printed  # the bounds line up in one column


def test_a_manifest_without_schema_gets_each_commands_own_advice(tmp_path, capsys):
    (tmp_path / "manifest.json").write_text('{"x": 1}')
    assert cli.main(["gate", str(tmp_path)]) == 1
    assert capsys.readouterr().err.rstrip().endswith("give a run folder or its manifest.json, or a model file or "
                                                     "folder for --max-size-mb")
    assert cli.main(["report", str(tmp_path), "--out", str(tmp_path / "rep")]) == 1
    assert capsys.readouterr().err.rstrip().endswith("(no schema); give a run folder or its manifest.json")  # was
    # gate's --max-size-mb, which report does not take


def test_a_refused_report_path_still_replaces_the_other_report(finished, tmp_path, capsys):
    """A bad --junit path left an earlier passing --json verdict (and the other way round) in place."""
    verdict, xml = tmp_path / "g.json", tmp_path / "g.xml"
    assert cli.main(["gate", str(finished), "--max-size-mb", "100", "--json", str(verdict), "--junit", str(xml)]) == 0
    assert cli.main(["gate", str(finished), "--max-size-mb", "100", "--json", str(verdict),
                     "--junit", str(tmp_path / "no" / "g.xml")]) == 2
    said = json.loads(verdict.read_text())
    assert said["ok"] is False and "its folder does not exist" in said["error"]
    assert cli.main(["gate", str(finished), "--max-size-mb", "100", "--json", str(tmp_path),
                     "--junit", str(xml)]) == 2
    assert ET.parse(xml).getroot().find("testcase/error").get("message").endswith("is a folder; give the path of "
                                                                                   "the JSON file to write")
    capsys.readouterr()
    assert cli.main(["gate", str(finished), "--json", "-", "--junit", str(tmp_path / "no" / "g.xml")]) == 2
    assert json.loads(capsys.readouterr().out)["ok"] is False  # stdout was empty: jq saw no input


def test_a_report_to_a_pipe_is_written_into_it_not_replaced(tmp_path):
    """--json /dev/stdout, for root: the temp file and rename replaced the device itself with a file."""
    import stat
    import threading

    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    got = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_text()))
    reader.start()
    gate.artifact.write_text(fifo, '{"ok": true}\n')  # (gate's reports go through it)
    reader.join(10)
    assert got == ['{"ok": true}\n'] and stat.S_ISFIFO(fifo.stat().st_mode)



def test_a_report_through_a_link_under_proc_is_written_into_and_a_users_link_stays(tmp_path):
    """`gate --json /dev/stdout > verdict.json`: /dev/stdout links to a regular file then, and the rename replaced
    the link itself (for root) or was refused (/dev is not writable)."""
    target = tmp_path / "verdict.json"
    fd = os.open(target, os.O_WRONLY | os.O_CREAT)
    try:
        os.write(fd, b"before\n")  # `(echo before; edgekit gate --json /dev/stdout) > f`: kept, not truncated away
        gate.artifact.write_text(Path(f"/proc/self/fd/{fd}"), '{"ok": true}\n')
    finally:
        os.close(fd)
    assert target.read_text() == 'before\n{"ok": true}\n' and [p.name for p in tmp_path.iterdir()] == [target.name]
    (tmp_path / "link.json").symlink_to(target)
    gate.artifact.write_text(tmp_path / "link.json", '{"ok": false}\n')
    assert (tmp_path / "link.json").is_symlink() and target.read_text() == '{"ok": false}\n'


def test_retained_is_counted_back_even_when_the_teacher_got_one_sentence_right():
    """One right answer of the teacher is a count to divide by: the stored (rounded) ratio is not kept."""
    numbers = {"eval_examples": 10, "accuracy": 0.1, "teacher_accuracy": 0.1, "accuracy_retained": 0.5}
    assert gate.from_counts(numbers)["accuracy_retained"] == 1.0


def test_a_number_is_shown_to_four_significant_digits_when_they_read_on_its_side():
    """4 significant digits first (123.5), more only when the bound needs them."""
    assert gate.faithful(123.456, lambda v: v <= 200) == "123.5"


def test_json_verdict_turns_infinity_to_null_and_keeps_a_rows_error():
    """A bound or actual of inf is null (JSON has no Infinity); a row's `error` (not measured on a target) is kept."""
    rows = [{"metric": "latency_ms_p90", "op": "<=", "target": float("inf"), "actual": None, "ok": False,
             "error": "not measured on pi"}]
    verdict = json.loads(gate.as_json(rows, "run"))
    assert verdict["budgets"] == [{"metric": "latency_ms_p90", "op": "<=", "bound": None, "actual": None,
                                   "ok": False, "error": "not measured on pi"}]


def test_one_missing_final_file_is_named_alone(finished):
    """One missing file is named without 'and 0 more'."""
    manifest = json.loads((finished / "manifest.json").read_text())
    finals = {Path(o["path"]).parts[0] for o in [manifest["final"], *(manifest["final"].get("outputs") or {}).values()]}
    rel = sorted(r for r in gate.recorded_files(manifest) if Path(r).parts[0] in finals)[0]
    (finished / rel).unlink()
    with pytest.raises(EdgekitError) as e:
        gate.check(finished, [("size_mb", "<=", 100.0)])
    assert f"is missing final model files ({rel}); " in str(e.value)


def test_external_data_reached_through_a_link_in_the_folder_is_counted_once(tmp_path):
    """A data file the model names through a symlink to a file the folder scan found is one file, not two."""
    import numpy as np
    import onnx
    from onnx import helper, numpy_helper

    from edgekit import artifact

    weight = numpy_helper.from_array(np.ones((64, 64), np.float32), "w")
    graph = helper.make_graph([helper.make_node("Identity", ["w"], ["y"])], "g", [],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [64, 64])], [weight])
    onnx.save(helper.make_model(graph), str(tmp_path / "model.onnx"), save_as_external_data=True,
              location="w.data", size_threshold=0)
    (tmp_path / "w.data").rename(tmp_path / "real.data")
    (tmp_path / "w.data").symlink_to("real.data")
    size = (tmp_path / "model.onnx").stat().st_size + (tmp_path / "real.data").stat().st_size
    assert artifact.weights_mb(tmp_path) == round(size / 1e6, 6)
