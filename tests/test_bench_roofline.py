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
    rounding = 0.0005 * (len(p["groups_ms"]) + 1)  # each group and p50 to 0.001 ms: a tiny model's 0.275 ms p50
    assert sum(p["groups_ms"].values()) == pytest.approx(p["p50_ms"], rel=0.01, abs=rounding), p["ops_ms"]  # had
    # groups adding up to 0.273, 0.7% off: a faster CI machine would fail a 1% bound on rounding alone
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
    close = dict(row, retained=0.96996, model="edgekit x86-onnx")  # a miss that 3 places showed as 0.970
    assert headline.verdict(headline.checks("edge-small", close)[2]).startswith("0.96996 MISSED (4e-05 short)")
    assert headline.kept(close, "retained", 0.97).startswith("0.96996 (") and \
        headline.kept(dict(close, retained=0.98409), "retained", 0.97).startswith("0.9841 (")


def test_the_peak_is_measured_before_every_round_and_each_round_is_set_against_its_own(monkeypatch):
    from edgekit.stages import bench

    calls = []

    def fake(path, **options):
        calls.append(path)
        return {"fixed": {"p50": float(len(calls))}, "sentences": {"p50": 1.0}, "peak_rss_mb": 1.0}

    monkeypatch.setattr(bench, "measure", fake)
    out = bench.measure_interleaved(["a", "b"], rounds=3, before_round=lambda: calls.append("peak"))
    assert calls == ["peak", "a", "b"] * 3 and out[1]["fixed_p50_by_round"] == [3.0, 6.0, 9.0]
    # 1 GFLOP: 2 ms at 500 GOPS is 1.0x, 3 ms at 500 is 1.5x, 3 ms at 400 is 1.2x -> the median, 1.2x
    assert roofline.headline.roofline_ratio([2.0, 3.0, 3.0], [500, 500, 400], 10 ** 9) == 1.2


def test_perf_samples_of_litert_kernels_are_grouped_by_the_kind_of_work():
    report = """# Samples: 12K of event 'cycles:P'
    50.00%  libpywrap_litert_common.so   [.] xnn_qd8_f32_qc8w_gemm_minmax_ukernel_5x64c4__asm_amd64_avx512vnni
    10.00%  libpywrap_litert_common.so   [.] xnn_f32_gemm_minmax_ukernel_7x32__avx512f_broadcast
     4.00%  libpywrap_litert_common.so   [.] xnn_f32_vadd_ukernel__avx512f_u32
     2.00%  libpywrap_litert_common.so   [.] xnn_f32_rminmax_ukernel__avx512f_u64_acc4
     1.00%  libc.so.6                    [.] __memmove_avx512_unaligned_erms
     1.00%  libpywrap_litert_common.so   [.] xnn_run_operator_with_index
    30.00%  libpython3.11.so.1.0         [.] _PyEval_EvalFrameDefault
     2.00%  libc.so.6                    [.] malloc
"""
    shares = roofline.kernel_shares(report)
    assert shares["INT8 GEMM"] == 50 and shares["FP32 GEMM (attention)"] == 10 and shares["other"] == 1
    assert shares["activation quantization"] == 2 and shares["layout (transpose, reshape, copy)"] == 1
    assert sum(shares.values()) == 68  # Python and malloc are not the model's work
    text = roofline.tflite_markdown([{"model": "tiny: edgekit x86-tflite", "p50_ms": 2.0, "roofline_ratio": 1.6,
                                      "roofline_ms": 1.25, "groups_ms": {g: 2.0 * v / 68 for g, v in shares.items()}}])
    assert "| tiny: edgekit x86-tflite | 2.00 | 1.60 | 1.25 | 1.46 | 0.14 |" in text  # (50 + 2 + 10) / 68 of 2 ms


def test_runs_of_one_recipe_are_told_apart_by_their_folder(tmp_path):
    for run, name in (("a", "edge-small"), ("b", "edge-small"), ("c", "edge-base")):
        (tmp_path / run).mkdir()
        (tmp_path / run / "manifest.json").write_text(json.dumps({"recipe": {"name": name}}))
    labels = roofline.run_labels([tmp_path / "a", tmp_path / "b", tmp_path / "c"])
    assert labels == ["edge-small (a)", "edge-small (b)", "edge-base"]


@pytest.mark.parametrize("theoretical, measured", [(None, 190.0), (588.8, 190.0), (588.8, 651.7)])
def test_headline_states_the_nominal_peak_only_where_there_is_one_and_never_as_a_ceiling(theoretical, measured):
    import headline
    peak = {"measured_gops": measured, "how": "fastest MatMulInteger", "by_shape_gops": {}, "cpu": "X",
            "int8_isa": "AVX-512 VNNI", "clock_mhz": 2300.0, "theoretical_gops": theoretical}
    text = headline.markdown({"peak": peak, "at": "now", "threads": 1, "rounds": 3, "runs_per_round": 50,
                              "recipes": []}, "bench/results/headline.json")
    assert "not stated" not in text and "None" not in text
    assert ("nominal at the 2300 MHz /proc/cpuinfo reports: 588.8 GOPS (no ceiling" in text) == \
        (theoretical is not None)
    assert ("the measured peak is above it" in text) == (theoretical is not None and measured > theoretical)
    assert "theoretical" not in text
    assert "INT8 instructions: AVX-512 VNNI" in text


def test_the_xnnpack_gemm_is_a_real_int8_fully_connected():
    import headline
    from ai_edge_litert.interpreter import Interpreter
    invoke = headline.fully_connected(64, 32, 8)
    interpreter = invoke.__self__
    assert isinstance(interpreter, Interpreter)
    ops = [op["op_name"] for op in interpreter._get_ops_details()]
    assert "FULLY_CONNECTED" in ops, ops
    invoke()
    assert interpreter.get_tensor(interpreter.get_output_details()[0]["index"]).shape == (8, 32)
    assert headline.fully_connected(64, 32, 8) is invoke  # built once per process


@pytest.mark.parametrize("isa, per_cycle", [("AMX-INT8", 1024), ("AVX512-VNNI", 128), ("AVX2 without VNNI", None)])
@pytest.mark.parametrize("xnnpack_gops", [300.0, 900.0])
def test_the_faster_engine_sets_the_peak_and_amx_has_its_own_theoretical_figure(monkeypatch, isa, per_cycle,
                                                                                  xnnpack_gops):
    import headline

    def xnnpack():
        pass
    monkeypatch.setattr(headline, "fully_connected", lambda k, n, m: xnnpack)
    monkeypatch.setattr(headline, "best_gops", lambda run, ops: xnnpack_gops if run is xnnpack else 500.0)
    monkeypatch.setattr(headline.devices, "this_cpu", lambda: {"cpu": "X", "int8_isa": isa})
    peak = headline.gemm_peak()
    assert peak["measured_gops"] == max(xnnpack_gops, 500.0)
    assert peak["engine"] == ("xnnpack" if xnnpack_gops > 500 else "onnxruntime")
    assert peak["by_engine_gops"] == {"onnxruntime": 500.0, "xnnpack": xnnpack_gops}
    assert len(peak["by_shape_gops"]) == 2 * len(headline.GEMM_SHAPES)
    if per_cycle:
        assert peak["theoretical_gops"] == pytest.approx(peak["clock_mhz"] / 1e3 * per_cycle * 2, abs=0.1)
        assert f"{per_cycle} " in peak["how"] or f"x {per_cycle // 2} " in peak["how"]
    else:
        assert peak["theoretical_gops"] is None and "no nominal figure" in peak["how"]


def test_gemm_steadiness_finds_a_core_that_switches_speed(monkeypatch, tmp_path):
    import gemm_steadiness
    clock = {"t": 0.0, "calls": 0}

    def gemm():  # 1 ms per call, then 2.5 ms per call from the 300th on: a core that slows down
        clock["calls"] += 1
        clock["t"] += 1e-3 if clock["calls"] < 300 else 2.5e-3

    monkeypatch.setattr(gemm_steadiness.time, "perf_counter", lambda: clock["t"])
    by_window = gemm_steadiness.windows(gemm, seconds=1.0, window=100, ops=10**9)
    assert by_window[:2] == [1000.0, 1000.0] and by_window[-1] == 400.0, by_window
    s = gemm_steadiness.summary(by_window)
    assert s["spread"] == 2.5 and s["min_gops"] == 400.0
    monkeypatch.setattr(gemm_steadiness, "engines", lambda: {"onnxruntime": gemm})
    gemm_steadiness.main(["--seconds", "0.5", "--window", "50", "--out", str(tmp_path / "s.json")])
    saved = json.loads((tmp_path / "s.json").read_text())
    assert saved["engines"]["onnxruntime"]["spread"] == 1.0  # the slow calls keep one speed
    assert "| onnxruntime |" in (tmp_path / "s.md").read_text()


def test_gemm_steadiness_refuses_an_empty_measurement(capsys):
    import gemm_steadiness
    with pytest.raises(SystemExit) as e:
        gemm_steadiness.main(["--seconds", "0"])
    assert e.value.code == 2 and "--seconds must be > 0" in capsys.readouterr().err


def test_the_pareto_plot_draws_a_stored_headline_run(tmp_path):
    import headline
    stored = json.loads((Path(headline.__file__).parent / "results" / "headline-spr-amx-edge-small.json").read_text())
    headline.plot(stored["recipes"], tmp_path / "p.png")
    assert (tmp_path / "p.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_pareto_plot_draws_each_recipes_accuracy_target(tmp_path, monkeypatch):
    import headline
    from matplotlib.axes import Axes
    stored = json.loads((Path(headline.__file__).parent / "results" / "headline-spr-amx.json").read_text())
    drawn, axhline = [], Axes.axhline
    monkeypatch.setattr(Axes, "axhline", lambda self, y=0, *a, **k: drawn.append(y) or axhline(self, y, *a, **k))
    headline.plot(stored["recipes"], tmp_path / "p.png")
    teachers = [r["rows"][0]["accuracy"] for r in stored["recipes"]]
    assert len(teachers) == 2 and drawn == pytest.approx([0.97 * t for t in teachers])


def test_kept_interval_of_a_large_split_draws_in_parts_to_the_same_interval():
    """2000 draws x every example at once: a 100k-sentence test split took 1.7 GB for this interval alone."""
    import tracemalloc

    import numpy as np

    from edgekit.stages import evaluate

    rng = np.random.default_rng(1)
    teacher = rng.random(3000) < 0.85
    model = teacher & (rng.random(3000) < 0.97)
    index = np.random.default_rng(0).integers(0, 3000, (2000, 3000))  # the whole draw at once, as it was made
    ratio = model[index].sum(1) / np.maximum(teacher[index].sum(1), 1)
    assert evaluate.kept_interval(model, teacher) == [round(float(q), 4) for q in np.percentile(ratio, [2.5, 97.5])]
    big = rng.random(40_000) < 0.9
    tracemalloc.start()
    evaluate.kept_interval(big, big)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 100e6, peak  # was 2000 x 40k x 8 bytes = 640 MB


def test_the_bench_stage_keeps_each_percentile_under_its_own_name(tmp_path, monkeypatch):
    """latency_ms_p90 is the fixed-length run's p90 (not its p99); the peak RSS over rounds is the largest."""
    from edgekit import devices
    from edgekit.artifact import Artifact
    from edgekit.stages import bench

    def fake(path, **options):
        return {"fixed": {"p50": 1.0, "p90": 2.0, "p99": 3.0}, "sentences": {"p50": 4.0}, "peak_rss_mb": 5.0,
                "load_s": 0.1}

    monkeypatch.setattr(bench, "measure", fake)
    monkeypatch.setattr(devices, "this_cpu", lambda: {"cpu": "test", "int8_isa": None})
    (tmp_path / "model.onnx").write_bytes(b"\0" * 1000)
    splits = type("Splits", (), {"test": [("a", 0), ("b", 1)], "pairs": False})
    m = bench.run(Artifact(tmp_path / "model.onnx", "onnx"), tmp_path / "bench", type("Ctx", (), {"splits": splits}),
                  runs=2).metrics
    assert (m["latency_ms_p50"], m["latency_ms_p90"], m["latency_ms_p99"]) == (1.0, 2.0, 3.0)
    rss = iter([1.0, 7.0, 3.0])
    monkeypatch.setattr(bench, "measure", lambda path, **o: {**fake(path), "peak_rss_mb": next(rss)})
    assert bench.measure_interleaved(["a"], rounds=3)[0]["peak_rss_mb"] == 7.0
