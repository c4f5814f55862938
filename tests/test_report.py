import json
import re
import shutil
from pathlib import Path

import pytest

from edgekit import cli, pipeline, recipe, report, testing


@pytest.fixture(scope="module")
def pruned_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("report")
    stages = ("finetune", "prune", "export", "quantize", "evaluate", "bench")
    text = testing.tiny_recipe(testing.make_model_dir(root / "m"), testing.make_csv(root / "d.csv"), stages)
    (root / "r.yaml").write_text(text.replace("recover_epochs: 2", "recover_epochs: 0"))
    pipeline.run(recipe.load(str(root / "r.yaml")), root / "run", progress=False)
    return root / "run"


def test_report_has_tables_plots_and_a_self_contained_html(pruned_run, tmp_path, capsys):
    assert cli.main(["report", str(pruned_run), "--out", str(tmp_path / "rep")]) == 0
    md = (tmp_path / "rep" / "report.md").read_text()
    assert "| prune |" in md and "| size_mb <= 100 |" in md and "Pareto" in md
    for png in ("tradeoff.png", "sizes.png", "heads-run.png"):
        assert (tmp_path / "rep" / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    page = (tmp_path / "rep" / "report.html").read_text()
    assert page.count("data:image/png;base64,") == 3
    assert not re.search(r'src="(?!data:)', page)  # nothing loaded from elsewhere


def test_two_runs_of_one_folder_name_keep_their_own_labels_and_plots(pruned_run, tmp_path):
    import shutil

    for job in ("job-a", "job-b"):  # two CI jobs' artifacts/run: both were labelled `run`, one heads plot overwrote
        shutil.copytree(pruned_run, tmp_path / job / "run")
    report.build([tmp_path / "job-a" / "run", tmp_path / "job-b" / "run", tmp_path / "job-a" / "run"], tmp_path / "rep")
    md = (tmp_path / "rep" / "report.md").read_text()
    assert md.count("## job-a/run (") == 1 and md.count("## job-b/run (") == 1  # the repeated run once
    assert "| job-a/run: " in md and "| job-b/run: " in md
    assert (tmp_path / "rep" / "heads-job-a-run.png").is_file() and (tmp_path / "rep" / "heads-job-b-run.png").is_file()


def test_report_of_a_manifest_path_goes_beside_the_run(pruned_run, tmp_path):
    import shutil

    run = shutil.copytree(pruned_run, tmp_path / "run")
    assert cli.main(["report", str(run / "manifest.json")]) == 0  # was "manifest.json/report is in the way"
    assert (run / "report" / "report.md").is_file()
    (run / "report" / "report.md").unlink()
    assert cli.main(["report", str(run), f"{run}/", str(run / "manifest.json")]) == 0  # one run, given three ways
    assert (run / "report" / "report.md").is_file()  # beside it, not in artifacts/report


def test_size_breakdown_adds_up_and_shrinks_with_int8(pruned_run):
    fp32 = report.breakdown(pruned_run / "03-export" / "model.onnx")
    int8 = report.breakdown(pruned_run / "04-quantize" / "model.onnx")
    hf = report.breakdown(pruned_run / "02-prune" / "model")
    assert fp32["embeddings"] > 0 and fp32["attention"] > 0 and fp32["ffn"] > 0
    assert sum(fp32.values()) == pytest.approx((pruned_run / "03-export" / "model.onnx").stat().st_size / 1e6, rel=0.1)
    assert int8["attention"] < fp32["attention"] and int8["ffn"] < fp32["ffn"]
    assert hf["attention"] == pytest.approx(fp32["attention"], rel=0.1)


def test_size_breakdown_of_an_onnx_file_with_external_data_adds_up_to_its_size(pruned_run, tmp_path):
    import onnx

    model = onnx.load(str(pruned_run / "03-export" / "model.onnx"))
    onnx.save(model, str(tmp_path / "model.onnx"), save_as_external_data=True, location="model.onnx.data",
              size_threshold=0)
    whole = report.breakdown(pruned_run / "03-export" / "model.onnx")
    split = report.breakdown(tmp_path / "model.onnx")
    size = sum(p.stat().st_size for p in tmp_path.iterdir()) / 1e6
    assert sum(split.values()) == pytest.approx(size, abs=0.002)  # the graph's own bytes were lost
    assert split["ffn"] == whole["ffn"] and split["embeddings"] == whole["embeddings"]


def test_every_artifact_of_a_multi_target_run_is_a_point(tmp_path):
    out = {name: {"path": f"04-quantize/{name}/model.{name.split('-')[1]}",
                  "metrics": {"accuracy": 0.8, "latency_ms_p50": ms, "size_mb": 1.0}}
           for name, ms in (("x86-onnx", 2.0), ("arm64-tflite", 1.0))}
    manifest = {"final": {"path": "04-quantize/x86-onnx/model.onnx", "metrics": {"accuracy": 0.8}, "outputs": out}}
    labels = [p[0] for p in report.points([(manifest, tmp_path / "run")], ["run"])]  # was the first artifact only
    assert labels == ["run: 04-quantize/x86-onnx/model.onnx", "run: 04-quantize/arm64-tflite/model.tflite"]


def test_pareto_front():
    pts = [("a", 0.9, 10, 1), ("b", 0.8, 5, 1), ("c", 0.7, 8, 1), ("d", 0.9, 12, 1)]
    assert [p[0] for p in report.pareto(pts)] == ["a", "b"]


def test_parts_are_named_in_the_words_of_the_field():
    assert report.part_of("bert.embeddings.word_embeddings.weight") == "embeddings"
    assert report.part_of("onnx::MatMul_12 /m/bert/encoder/layer.0/attention/self/query/MatMul") == "attention"
    assert report.part_of("bert.encoder.layer.0.intermediate.dense.weight") == "ffn"
    assert report.part_of("bert.encoder.layer.0.output.dense.weight") == "ffn"
    assert report.part_of("bert.encoder.layer.0.attention.output.dense.weight") == "attention"
    assert report.part_of("classifier.weight") == "other"


def copy_run(run, dest, edit):
    """A copy of a finished run with its manifest changed by edit(manifest)."""
    shutil.copytree(run, dest)
    manifest = json.loads((dest / "manifest.json").read_text())
    edit(manifest)
    (dest / "manifest.json").write_text(json.dumps(manifest))
    return dest


def benched_locally(heads):
    def edit(manifest):
        manifest["devices"] = {"local": {"kind": "local", "complete": True, "model": "04-quantize/model.onnx",
                                         "metrics": {"latency_ms_p50": 0.2}}}
        next(s for s in manifest["stages"] if s["name"] == "prune")["metrics"]["heads_kept"] = heads
    return edit


def tradeoff_axes(pts, tmp_path, monkeypatch):
    """The axes plot_tradeoff drew (plt.close kept from freeing the figure)."""
    figures = []
    monkeypatch.setattr(report.pyplot(), "close", figures.append)
    report.plot_tradeoff(pts, tmp_path / "t.png")
    return figures[0].axes[0]


def test_runs_with_device_results_keep_their_own_heads_plot_under_a_name_markdown_shows(pruned_run, tmp_path):
    copy_run(pruned_run, tmp_path / "my run", benched_locally([1, 1, 1, 1]))  # both were heads-local.png
    copy_run(pruned_run, tmp_path / "my-run", benched_locally([3, 3, 3, 3]))
    report.build([tmp_path / "my run", tmp_path / "my-run"], tmp_path / "rep")
    md = (tmp_path / "rep" / "report.md").read_text()
    assert "](heads-my-run.png)" in md and "](heads-my-run-1.png)" in md  # was (heads-my run.png): not an image
    plots = tmp_path / "rep" / "heads-my-run.png", tmp_path / "rep" / "heads-my-run-1.png"
    assert plots[0].read_bytes() != plots[1].read_bytes()


def test_target_line_says_which_model_the_target_ran(pruned_run, tmp_path):
    report.build([copy_run(pruned_run, tmp_path / "run", benched_locally([2, 2, 2, 2]))], tmp_path / "rep")
    md = (tmp_path / "rep" / "report.md").read_text()
    assert "Target `local` ran `04-quantize/model.onnx`: latency_ms_p50 0.200" in md


def test_budget_rows_name_their_artifact_and_interval_as_gate_does(pruned_run, tmp_path):
    def edit(manifest):
        manifest["budgets"] = [{"metric": "accuracy_retained", "op": ">=", "target": 0.97, "actual": 0.92, "ok": False,
                                "interval": [0.8, 1.0], "artifact": "x86-onnx"}]
    report.build([copy_run(pruned_run, tmp_path / "run", edit)], tmp_path / "rep")
    md = (tmp_path / "rep" / "report.md").read_text()
    assert "| x86-onnx: accuracy_retained >= 0.97 | 0.92 (95% interval 0.8000-1.0000, bound inside) | **no** |" in md


def test_an_unmeasured_budget_says_not_measured(pruned_run, tmp_path):
    def edit(manifest):
        manifest["budgets"] = [{"metric": "latency_ms_p90", "op": "<=", "target": 5.0, "actual": None, "ok": False}]
    report.build([copy_run(pruned_run, tmp_path / "run", edit)], tmp_path / "rep")
    assert "| latency_ms_p90 <= 5 | - (not measured) | **no** |" in (tmp_path / "rep" / "report.md").read_text()


def test_html_shows_bold_as_bold():
    page = report.to_html("| budget | ok |\n|---|---|\n| size_mb <= 1 | **no** |\n\nsome **bold** words\n", [])
    assert "<td><b>no</b></td>" in page and "<p>some <b>bold</b> words</p>" in page and "**" not in page


def test_params_of_a_tiny_model_read_as_compress_writes_them(pruned_run, tmp_path):
    md = (report.build([pruned_run], tmp_path / "rep")).read_text()
    assert re.search(r"\| finetune \| \d+ \| 42k \|", md) and re.search(r"\| prune \| \d+ \| 25k \|", md)  # was 0.0M
    assert report.params_text(1_394_002) == "1.4M"


def test_accuracy_axis_and_table_say_which_split_each_run_was_scored_on(pruned_run, tmp_path, monkeypatch):
    copy_run(pruned_run, tmp_path / "val", lambda m: m["final"]["metrics"].update(eval_split="validation"))
    copy_run(pruned_run, tmp_path / "test", lambda m: None)
    figures = []
    monkeypatch.setattr(report.pyplot(), "close", figures.append)
    md = report.build([tmp_path / "val", tmp_path / "test"], tmp_path / "rep").read_text()
    ax = next(f.axes[0] for f in figures if f.axes[0].get_title().startswith("accuracy against latency"))
    assert ax.get_ylabel() == "accuracy (test / validation split)"  # was "accuracy (test split)" whatever the split
    assert re.search(r"\| val: \S+ \| [\d.]+ \| validation \|", md)
    assert re.search(r"\| test: \S+ \| [\d.]+ \| test \|", md)


def test_the_file_peers_json_timed_takes_its_latency_from_that_session(tmp_path):
    run = tmp_path / "moved"  # peers.json names the files where the run was when bench/peers.py ran
    (run / "peers").mkdir(parents=True)
    rows = [{"model": "teacher FP32 (ONNX Runtime)", "path": "/old/run/peers/teacher-fp32/model.onnx", "accuracy": 1.0,
             "latency_ms_p50_128": 0.18, "size_mb": 0.25},
            {"model": "edgekit r final", "path": "/old/run/04-quantize/model.onnx", "accuracy": 1.0,
             "latency_ms_p50_128": 0.07, "size_mb": 0.08}]
    (run / "peers" / "peers.json").write_text(json.dumps({"run": "/old/run", "seq_len": 128, "rows": rows}))
    manifest = {"final": {"path": "04-quantize/model.onnx",
                          "metrics": {"accuracy": 1.0, "latency_ms_p50": 0.13, "size_mb": 0.08, "bench_seq_len": 32}}}
    pts = report.points([(manifest, run)], ["run"])
    assert [p[:3] for p in pts] == [("run: 04-quantize/model.onnx", 1.0, 0.07),  # was the bench stage's 0.13
                                    ("run: teacher FP32 (ONNX Runtime)", 1.0, 0.18)]
    note = report.peers_note("run", manifest, run)
    assert "04-quantize/model.onnx are from one bench/peers.py session (128 tokens)" in note and "(32 tokens)" in note


def test_the_file_peers_json_timed_is_compared_on_its_sentences_and_tokens(tmp_path):
    """peers.py scores the whole test split at its --seq-len; evaluate may have scored data.max_eval sentences. The
    point took the manifest's accuracy (30 sentences) beside the teacher's on all 83, at a label of 128 tokens."""
    run = tmp_path / "run"
    (run / "peers").mkdir(parents=True)
    rows = [{"model": "teacher FP32 (ONNX Runtime)", "path": str(run / "t.onnx"), "accuracy": 0.8072,
             "latency_ms_p50_128": 0.18, "size_mb": 0.25},
            {"model": "edgekit r final", "path": str(run / "04-quantize/model.onnx"), "accuracy": 0.8434,
             "latency_ms_p50_128": 0.07, "size_mb": 0.08}]
    (run / "peers" / "peers.json").write_text(json.dumps({"run": str(run), "seq_len": 32, "rows": rows}))
    manifest = {"final": {"path": "04-quantize/model.onnx", "metrics": {"accuracy": 0.8, "latency_ms_p50": 0.13,
                                                                         "size_mb": 0.08, "bench_seq_len": 64}}}
    pts = report.points([(manifest, run)], ["run"])
    assert [(p[1], p[5]) for p in pts] == [(0.8434, 32), (0.8072, 32)]
    assert [p[0] for p in report.pareto(pts)] == ["run: 04-quantize/model.onnx"]  # the teacher was on the front


def test_size_breakdown_covers_every_output_and_names_the_ones_it_cannot_read(pruned_run, tmp_path):
    def edit(manifest):
        quantize = next(s for s in manifest["stages"] if s["name"] == "quantize")
        quantize["output"]["outputs"] = {name: {"path": path, "kind": path.rsplit(".", 1)[1]} for name, path in
                                         (("x86-onnx", "04-quantize/model.onnx"),
                                          ("arm64-onnx", "04-quantize/arm64-onnx/model.onnx"),
                                          ("x86-tflite", "04-quantize/x86-tflite/model.tflite"))}
    run = copy_run(pruned_run, tmp_path / "run", edit)
    (run / "04-quantize" / "arm64-onnx").mkdir()
    shutil.copy(run / "04-quantize" / "model.onnx", run / "04-quantize" / "arm64-onnx" / "model.onnx")
    (run / "04-quantize" / "x86-tflite").mkdir()
    (run / "04-quantize" / "x86-tflite" / "model.tflite").write_bytes(b"TFL3")
    md = report.build([run], tmp_path / "rep").read_text()
    assert "| run/04-quantize/arm64-onnx/model.onnx | " in md  # was each stage's first output only
    assert "Not in the size breakdown (it reads ONNX files and transformers folders): run/04-quantize/x86-tflite/" in md


def test_a_copy_of_the_final_stage_alone_is_reported_as_gate_checks_it(pruned_run, tmp_path):
    upload = tmp_path / "artifacts" / "run"  # docs/ci.md's upload: manifest.json and the final stage's folder
    upload.mkdir(parents=True)
    shutil.copy(pruned_run / "manifest.json", upload)
    shutil.copytree(pruned_run / "04-quantize", upload / "04-quantize")
    md = report.build([upload], tmp_path / "rep").read_text()  # was: 03-export/model.onnx does not exist
    assert "| run/04-quantize/model.onnx | " in md
    assert "Not in this copy of the run, so not in the size breakdown: run/01-finetune/model, run/02-prune/model, " \
           "run/03-export/model.onnx" in md


def test_small_models_get_bubbles_of_their_own_size(tmp_path, monkeypatch):
    pts = [("a", 0.9, 1.0, 1.0, "test", 32), ("b", 0.8, 2.0, 1.8, "test", 32)]  # both were 20 pt² (max(20, 8*size))
    small, big = (c.get_sizes()[0] for c in tradeoff_axes(pts, tmp_path, monkeypatch).collections)
    assert big > 1.5 * small


def test_a_pareto_front_of_one_point_is_marked(tmp_path, monkeypatch):
    pts = [("a", 0.9, 1.0, 1.0, "test", 32), ("b", 0.8, 2.0, 1.0, "test", 32)]  # a is the whole front
    (front,) = tradeoff_axes(pts, tmp_path, monkeypatch).lines
    assert front.get_marker() not in ("", "None", None) and list(front.get_xdata()) == [1.0]


def test_each_class_recall_is_recorded_beside_the_teachers_tabled_and_its_worst_drop_named(one_run, tmp_path):
    from edgekit.stages import evaluate

    said, teacher, examples = [0, 1, 1, 0], [0, 1, 0, 0], [("a", 0), ("b", 0), ("c", 1), ("d", 1)]
    assert evaluate.per_class(said, teacher, examples, ["neg", "pos", "none"]) == {
        "neg": {"examples": 2, "recall": 0.5, "teacher_recall": 0.5},
        "pos": {"examples": 2, "recall": 0.5, "teacher_recall": 0.0}}  # a class with no sentence has no row
    manifest = json.loads((one_run / "manifest.json").read_text())
    final = manifest["final"]["metrics"]
    classes = final["per_class"]
    assert sorted(classes) == ["neg", "pos"] and sum(c["examples"] for c in classes.values()) == final["eval_examples"]
    for key, overall in (("recall", "accuracy"), ("teacher_recall", "teacher_accuracy")):  # recalls add up to accuracy
        assert sum(c[key] * c["examples"] for c in classes.values()) / final["eval_examples"] == \
            pytest.approx(final[overall], abs=1e-3)
    text = report.build([one_run], tmp_path / "rep").read_text()
    assert "Recall per class on the test split:" in text
    assert re.search(rf"\| neg \| {classes['neg']['examples']} \| {classes['neg']['teacher_recall']:.4f} \| "
                     rf"{classes['neg']['recall']:.4f} \|", text)
    assert "class losing most" not in cli.summary(manifest)  # no class fell on the tiny run
    final["per_class"] = {"neg": {"examples": 9, "recall": 0.7, "teacher_recall": 0.9},
                          "pos": {"examples": 11, "recall": 0.95, "teacher_recall": 0.9}}
    assert "class losing most: 'neg', recall 0.7000 against the teacher's 0.9000 (9 sentences" in cli.summary(manifest)


def test_plots_say_what_they_compare(pruned_run, tmp_path, monkeypatch):
    """Probe 28: the heads plot against the heads each layer had; the trade-off never sets latencies at two token
    counts on one front, reads 300 ms teachers and 3 ms students on a log axis, and has no latency below zero; the
    headline plot has a colour for every run, and runs in folders of one name are told apart."""
    import sys

    from edgekit import report

    manifest = json.loads((pruned_run / "manifest.json").read_text())
    prune_metrics = next(s["metrics"] for s in manifest["stages"] if s["name"] == "prune")
    assert prune_metrics["heads_before"] == [4] * 4 and prune_metrics["ffn_before"] == [64] * 4
    drawn, plot_heads = {}, report.plot_heads
    monkeypatch.setattr(report, "plot_heads", lambda heads, png, before=None: drawn.update(heads=(heads, before))
                        or plot_heads(heads, png, before))
    html = (report.build([pruned_run], tmp_path / "rep").parent / "report.html").read_text()
    assert drawn["heads"] == (prune_metrics["heads_kept"], [4] * 4)  # was against the most kept: 2 of 4 read as all
    assert "<h2>run (recipe r, teacher" in html  # was `r` with its backticks
    pts = [("a", 0.9, 2.0, 1.0, "test", 32), ("b", 0.8, 1.0, 1.0, "test", 32), ("c", 0.85, 300.0, 400.0, "test", 128)]
    assert [p[0] for p in report.pareto(pts)] == ["a", "b", "c"]  # c alone at 128 tokens: a 32-token point beat it
    captured = {}
    real = report.pyplot()
    monkeypatch.setattr(real.Figure, "savefig", lambda fig, path, **k: captured.update(ax=fig.axes[0]))
    report.plot_tradeoff(pts, tmp_path / "t.png")
    ax = captured["ax"]
    assert ax.get_xscale() == "log" and "(ms, log)" in ax.get_xlabel() and ax.get_xlim()[0] > 0
    assert any("32 tokens" in t.get_text() for t in ax.get_legend().get_texts())  # each point says its length
    report.plot_tradeoff(pts[:2], tmp_path / "t.png")
    assert captured["ax"].get_xlim()[0] == 0 and "32 tokens" in captured["ax"].get_xlabel()
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
    import headline
    sys.path.pop(0)
    assert headline.run_labels(["edge-small", "edge-small", "edge-base"], ["/ci/job-a/edge-small",
                                                                          "/ci/job-b/edge-small", "/x/edge-base"]) \
        == ["edge-small (job-a/edge-small)", "edge-small (job-b/edge-small)", "edge-base"]  # both read (edge-small)
    rows = [{"model": "teacher FP32", "p50_ms": 30.0, "accuracy": 0.8, "size_mb": 90.0}]
    runs = [{"recipe": f"r{i}", "run": f"/x/r{i}", "rows": rows, "teacher": "t"} for i in range(5)]
    colours, said = [], []
    monkeypatch.setattr(real.Axes, "scatter", lambda ax, *a, **k: colours.append(tuple(k.get("color"))))
    monkeypatch.setattr(real.Axes, "annotate", lambda ax, text, *a, **k: said.append(text))
    headline.plot(runs, tmp_path / "h.png")
    assert len(set(colours)) == 5  # the fifth run had no colour: no points, no legend entry
    assert said == ["teacher FP32, 90.0 MB"]  # one teacher's label, once: five drawn on one spot were unreadable


def test_the_pareto_column_marks_the_front_and_only_the_front(pruned_run, tmp_path):
    slower = copy_run(pruned_run, tmp_path / "slower", lambda m: m["final"]["metrics"].update(
        accuracy=m["final"]["metrics"]["accuracy"] - 0.1, latency_ms_p50=m["final"]["metrics"]["latency_ms_p50"] * 2))
    assert cli.main(["report", str(pruned_run), str(slower), "--out", str(tmp_path / "rep")]) == 0
    md = (tmp_path / "rep" / "report.md").read_text()
    table = md.split("## Accuracy against latency")[1].split("\n\n")[2].splitlines()[2:]
    marked = {row.split(" | ")[0].strip("| ").split(":")[0]: row.rstrip(" |").endswith("yes") for row in table}
    assert marked == {"run": True, "slower": False}  # the column read inverted with its test passing


def test_pareto_ties_leave_the_worse_point_off_the_front():
    pts = [("a", 0.9, 1.0, 1, "test", 32), ("b", 0.8, 1.0, 1, "test", 32), ("c", 0.9, 2.0, 1, "test", 32)]
    assert [p[0] for p in report.pareto(pts)] == ["a"]  # b: as fast, less accurate; c: as accurate, slower


def test_a_run_with_accuracy_but_no_latency_is_no_point(tmp_path):
    manifest = {"final": {"path": "03-export/model.onnx", "metrics": {"accuracy": 0.8, "size_mb": 1.0}}}
    assert report.points([(manifest, tmp_path / "run")], ["run"]) == []  # a None latency broke the plot


def test_the_size_breakdown_of_a_folder_is_in_mb_as_the_files(pruned_run):
    folder = pruned_run / "02-prune" / "model"
    raw = (folder / "model.safetensors").read_bytes()
    tensors = len(raw) - 8 - int.from_bytes(raw[:8], "little")  # the file less its length field and JSON header
    assert sum(report.breakdown(folder).values()) == pytest.approx(tensors / 1e6, abs=0.002)  # MiB read 4.6% less


def test_bubbles_scale_to_the_largest_model_and_a_10x_spread_of_latency_is_log(tmp_path, monkeypatch):
    pts = [("a", 0.9, 1.0, 0.1, "test", 32), ("b", 0.8, 10.0, 400.0, "test", 32)]
    ax = tradeoff_axes(pts, tmp_path, monkeypatch)
    assert max(c.get_sizes()[0] for c in ax.collections) <= 630 and ax.get_xscale() == "log"


@pytest.mark.parametrize("value, unit, shown", [
    (17.504961, "MB", "17.50"), (0.066227, "MB", "0.0662"), (0.9996, "MB", "1.00"), (0, "ms", "0.00"),
    (0.995, "MB", "0.995"), (0.9949, "MB", "0.995"), (0.996, "MB", "1.00"), (0.09999, "MB", "0.100"),
    (0.41234, "ms", "0.412"), (0.5, "ms", "0.500"), (0.0996, "MB", "0.0996"), (5.0349, "ms", "5.03"),
    (0.812345, "", "0.8123"), (123.456, "MiB", "123.5"), (__import__("numpy").float32(0.25), "ms", "0.250"),
    (22713216, "params", "22.7M"), (22.713, "M", "22.71"), (None, "MB", ""), (True, "", ""), ("?", "ms", "")])
def test_a_number_is_shown_one_way(value, unit, shown):
    assert report.number(value, unit) == shown


def test_every_table_and_summary_shows_a_number_the_same_way(pruned_run, tmp_path):
    """A size read 0.07, 0.06623 or 0.066227 depending on the table; a device's latency 0.41234 or 0.41."""
    from edgekit import compare, devices, sweep

    size, ms, acc = 0.066227, 0.41234, 0.812345
    device = {"kind": "local", "emulated": False, "complete": True, "model": "04-quantize/model.onnx", "budgets": [],
              "metrics": {"size_mb": size, "accuracy": acc, "peak_rss_mb": 123.456, "latency_ms_p50": ms},
              "result": {"runtime": "onnxruntime", "latency_ms": {"p50": ms, "p90": 0.5, "p99": 1.23456}}}

    def edit(manifest):
        for m in [s["metrics"] for s in manifest["stages"][-3:]] + [manifest["final"]["metrics"]]:
            m.update(size_mb=size, accuracy=acc, latency_ms_p50=ms)
        manifest["devices"] = {"local": device}
    run = copy_run(pruned_run, tmp_path / "run", edit)
    manifest = json.loads((run / "manifest.json").read_text())
    assert "| 0.0662 | 0.8123 | 0.412 |" in cli.summary(manifest)
    report.build([run], tmp_path / "rep")
    md = (tmp_path / "rep" / "report.md").read_text()
    assert "| 0.0662 | 0.8123 | 0.412 |" in md and "| 0.8123 | test | 0.412 | 32 | 0.0662 |" in md
    assert "size_mb 0.0662, accuracy 0.8123, peak_rss_mb 123.5, latency_ms_p50 0.412" in md  # the device's line
    sweep.summarize([["x=1"]], [run], [manifest], tmp_path)
    assert "| 0.8123 | 0.412 | 0.0662 |" in (tmp_path / "sweep.md").read_text()
    shown = devices.summary("local", device)
    assert "size 0.0662 MB" in shown and "latency p50/p90/p99 0.412/0.500/1.23 ms" in shown
    assert "peak RSS 123.5 MiB" in shown and "accuracy 0.8123" in shown
    row = {"model": "m", "params_m": 0.0421, "size_fp32_mb": 0.2634, "size_int8_mb": size, "latency_ms_b1_fp32": 1.2,
           "latency_ms_b1_int8": ms, "latency_ms_b32_int8": 3.0, "rss_after_load_mb_int8": 123.456, "accuracy": acc}
    assert "| m | 0.0421 | 0.263 | 0.0662 | 1.20 | 0.412 | 3.00 | 123.5 | 0.8123 |" in compare.markdown([row])


def test_a_run_into_a_folder_removes_the_report_of_the_run_it_replaces(pruned_run, tmp_path, capsys):
    """RUN/report stayed after a rerun into RUN: its tables and plots showed the replaced model's numbers."""
    run = shutil.copytree(pruned_run, tmp_path / "run")
    report.build([run], run / "report")
    (run / "my-report").mkdir()  # not the folder edgekit report writes by default: kept
    settings = json.loads((run / "manifest.json").read_text())["recipe"]
    pipeline.run(settings, run)
    assert not (run / "report").exists() and (run / "my-report").is_dir()
    assert f"removed {run / 'report'}: it described the run this one replaces (edgekit report {run} makes it again)" \
        in capsys.readouterr().err
    (run / "report").mkdir()
    (run / "report" / "report.md").write_text("# edgekit report\n")
    (run / "report" / "notes.txt").write_text("mine")  # a user's file in it: the folder is left alone
    pipeline.run(settings, run, progress=False)
    assert (run / "report" / "notes.txt").read_text() == "mine"
    shutil.rmtree(run / "report")
    report.build([run], tmp_path / "elsewhere")
    (run / "report").symlink_to(tmp_path / "elsewhere")  # a link: "removed" was said, and nothing removed
    pipeline.run(settings, run)
    assert (run / "report").is_symlink() and "removed" not in capsys.readouterr().err
