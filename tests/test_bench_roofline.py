"""bench/roofline.py on a tiny run: the op groups add up to the latency and the INT8 GEMMs are found."""
import json
import sys
from pathlib import Path

import pytest

from edgekit import pipeline, recipe, testing

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
import roofline  # noqa: E402  (bench/ scripts import each other by name)


def test_profile_splits_an_int8_file_into_groups_that_add_up(tmp_path):
    model_dir = testing.make_model_dir(tmp_path / "tiny")
    path = tmp_path / "tiny.yaml"
    path.write_text(testing.tiny_recipe(model_dir, testing.make_csv(tmp_path / "r.csv"), stages=("export", "quantize")))
    pipeline.run(recipe.load(str(path)), tmp_path / "run", progress=False)
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    fp32, int8 = (tmp_path / "run" / s["output"]["path"] for s in manifest["stages"])
    flops = roofline.headline.gemm_flops(fp32)
    row = roofline.profile("tiny", int8, flops, timed=5)
    p = row["profile"]
    assert sum(p["groups_ms"].values()) == pytest.approx(p["p50_ms"], rel=0.01), p["ops_ms"]
    assert p["groups_ms"]["INT8 GEMM (incl. activation quantization)"] > 0 and row["gemm_gflop_128"] > 0, p["ops_ms"]
    roofline_ms = flops / p["peak_gops"] / 1e6
    assert p["roofline_ms"] == pytest.approx(roofline_ms, abs=1e-3)
    assert p["ratio"] == pytest.approx(p["p50_ms"] / roofline_ms, rel=0.01)
    row.update(p50_ms=p["p50_ms"], roofline_ratio=p["ratio"])
    assert "| tiny |" in roofline.markdown({"measured": "now", "peak_gops_by_round": [p["peak_gops"]], "rounds": 1,
                                            "runs_per_round": 5, "rows": [row]})


def test_hard_linked_final_artifacts_are_measured_once_under_all_their_names(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "model.onnx").write_bytes(b"x")
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "model.onnx").hardlink_to(tmp_path / "a" / "model.onnx")
    (tmp_path / "c.onnx").write_bytes(b"x")  # the same bytes, another file: measured on its own
    final = {"path": "a/model.onnx", "kind": "onnx", "outputs": {
        "x86-onnx": {"path": "a/model.onnx", "kind": "onnx"}, "arm64-onnx": {"path": "b/model.onnx", "kind": "onnx"},
        "x86-tflite": {"path": "c.onnx", "kind": "onnx"}}}
    finals = roofline.headline.distinct_finals({"final": final}, tmp_path)
    assert [(names, art.path) for names, art in finals] == [
        ("x86-onnx = arm64-onnx", tmp_path / "a" / "model.onnx"), ("x86-tflite", tmp_path / "c.onnx")]


def test_kept_interval_is_paired_and_says_whether_the_bound_is_inside():
    headline = roofline.headline
    teacher = "1" * 80 + "0" * 20
    assert headline.kept_interval(teacher, teacher) == [1.0, 1.0]  # the same sentences right: no noise at all
    # 10 of the teacher's 80 lost: 0.875 kept; a paired draw keeps the interval narrow around it
    model = "1" * 70 + "0" * 30
    low, high = headline.kept_interval(model, teacher)
    assert low < 70 / 80 < high and high < 0.97, (low, high)
    assert headline.kept_interval(model, teacher) == [low, high]  # seeded: the same run renders the same
    with pytest.raises(ValueError, match="same split"):
        headline.kept_interval(model, teacher[:50])
    row = {"retained": 0.875, "retained_ci": [low, high]}
    check, = headline.checks("edge-small", row)[2:3]  # size, p50, retained: the third target
    assert check["interval"] == [low, high] and not check["met"]
    assert headline.verdict(check).endswith("bound outside)")
    near = dict(check, interval=[0.95, 0.99])  # a miss inside the noise says so
    assert headline.verdict(near).startswith("0.875 MISSED (0.0950 short)")
    assert headline.verdict(near).endswith("bound inside)")
    assert headline.verdict(dict(check, interval=None)) == "0.875 MISSED (0.0950 short)"  # results from before
