"""bench/int8_range.py: the saturation probe matches what the CPU's INT8 instructions predict, and a tiny run's
export is quantized four ways and scored against its FP32 file."""
import sys
from pathlib import Path

from edgekit import devices, pipeline, recipe, testing

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
import int8_range  # noqa: E402  (bench/ scripts import each other by name)


def test_the_probe_saturates_exactly_where_the_cpu_has_no_vnni():
    isa = devices.runner_module().int8_isa()
    probe = int8_range.saturation_probe()
    assert probe["exact"] == 64 * 255 * 127
    if isa in ("AVX2 without VNNI", "AVX-512 without VNNI"):
        assert probe["saturates"] and probe["got"] == 32 * 32767, probe  # VPMADDUBSW's saturated pairs
    elif isa in ("AVX512-VNNI", "AVX-VNNI", "AMX-INT8"):
        assert not probe["saturates"], probe


def test_a_run_is_scored_in_four_int8_variants_against_its_fp32_export(tmp_path):
    model_dir = testing.make_model_dir(tmp_path / "tiny")
    path = tmp_path / "tiny.yaml"
    path.write_text(testing.tiny_recipe(model_dir, testing.make_csv(tmp_path / "r.csv"), stages=("export",)))
    pipeline.run(recipe.load(str(path)), tmp_path / "run", progress=False)
    r = int8_range.measure(tmp_path / "run")
    fp32, variants = r["rows"][0], r["rows"][1:]
    assert fp32["model"] == "FP32" and r["examples"] > 0
    assert [(v["per_channel"], v["reduce_range"]) for v in variants] == int8_range.VARIANTS
    assert all(0 <= v["accuracy"] <= 1 and 0 <= v["agreement_with_fp32"] <= 1 and v["mean_abs_logit_diff"] > 0
               for v in variants), variants  # quantized: never bit-identical to FP32
    table = int8_range.markdown({"at": "now", "cpu": "x", "int8_isa": "", "probe": int8_range.saturation_probe(),
                                 "runs": [r]})
    assert table.count("| INT8 per-") == 4 and "| FP32 | " in table
