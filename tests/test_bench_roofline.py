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
    p50 = roofline.latency([int8], rounds=1, timed=5)[0]
    row = roofline.profile("tiny", int8, fp32, peak_gops=100.0, p50=p50, runs=5)
    assert sum(row["groups_ms"].values()) == pytest.approx(p50, rel=0.01), row["ops_ms"]
    assert row["groups_ms"]["INT8 GEMM (incl. activation quantization)"] > 0 and row["gemm_gflop_128"] > 0, row["ops_ms"]
    assert row["roofline_ratio"] == pytest.approx(p50 / row["roofline_ms"], rel=0.01)
    assert "| tiny |" in roofline.markdown({"measured": "now", "peak": {"measured_gops": 100.0}, "rounds": 1,
                                            "runs_per_round": 5, "rows": [row]})
