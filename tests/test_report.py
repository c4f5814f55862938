import re

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


def test_size_breakdown_adds_up_and_shrinks_with_int8(pruned_run):
    fp32 = report.breakdown(pruned_run / "03-export" / "model.onnx")
    int8 = report.breakdown(pruned_run / "04-quantize" / "model.onnx")
    hf = report.breakdown(pruned_run / "02-prune" / "model")
    assert fp32["embeddings"] > 0 and fp32["attention"] > 0 and fp32["ffn"] > 0
    assert sum(fp32.values()) == pytest.approx((pruned_run / "03-export" / "model.onnx").stat().st_size / 1e6, rel=0.1)
    assert int8["attention"] < fp32["attention"] and int8["ffn"] < fp32["ffn"]
    assert hf["attention"] == pytest.approx(fp32["attention"], rel=0.1)


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
