"""Where the time goes against the INT8 roofline: ONNX Runtime's per-node profile of each run's final ONNX
artifacts and of its peer (the teacher's ONNX Runtime dynamic INT8) at 1 x 128 tokens on 1 thread, grouped by the
kind of work. The INT8 GEMMs' own speed is set against the measured peak (bench/headline.py's), so the ratio
they alone leave shows what removing every other op could at best reach.

    python bench/headline.py artifacts/edge-base artifacts/edge-small   # first: it builds the peers
    python bench/roofline.py artifacts/edge-base artifacts/edge-small [--rounds 3] [--runs 100]

Writes bench/results/roofline.json and bench/results/roofline.md.
"""
import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from edgekit.artifact import Artifact, write_json

import headline  # bench/headline.py: the same GEMM FLOP count and peak

GROUPS = {  # ONNX Runtime CPU kernels (after its graph fusions) -> the kind of work
    "INT8 GEMM (incl. activation quantization)": ("DynamicQuantizeMatMul", "MatMulIntegerToFloat", "MatMulInteger",
                                                  "DynamicQuantizeLinear", "QAttention", "QGemm", "QLinearMatMul"),
    "FP32 GEMM": ("MatMul", "FusedMatMul", "Gemm"),
    "softmax / attention": ("Softmax", "Attention", "MultiHeadAttention"),
    "LayerNorm": ("LayerNormalization", "SkipLayerNormalization", "EmbedLayerNormalization", "SimplifiedLayerNormalization"),
    "GELU": ("Gelu", "BiasGelu", "FastGelu", "Erf", "Tanh"),
    "bias / residual adds": ("Add", "BiasAdd"),
    "layout (transpose, reshape, ...)": ("Transpose", "Reshape", "Unsqueeze", "Squeeze", "Concat", "Slice", "Expand",
                                         "Flatten", "Shape", "Gather", "GatherElements", "Range"),
}
GEMM_GROUPS = ("INT8 GEMM (incl. activation quantization)", "FP32 GEMM")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", type=Path, help="finished runs (bench/headline.py already run on them)")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved timing rounds (median of their p50s)")
    ap.add_argument("--runs", dest="timed", type=int, default=100, help="timed runs per model per round")
    ap.add_argument("--out", type=Path, default=Path("bench/results/roofline.json"))
    a = ap.parse_args(argv)
    peak = headline.gemm_peak()
    print(f"INT8 GEMM peak, 1 thread: {peak['measured_gops']} GOPS", file=sys.stderr)
    todo = [m for run in a.runs for m in models(run)]
    p50 = latency([model for _, model, _ in todo], a.rounds, a.timed)
    rows = [profile(label, model, graph, peak["measured_gops"], ms) for (label, model, graph), ms in zip(todo, p50)]
    result = {"measured": time.strftime("%Y-%m-%d %H:%M"), "peak": peak, "rounds": a.rounds, "runs_per_round": a.timed,
              "rows": rows}
    write_json(a.out, result)
    a.out.with_suffix(".md").write_text(markdown(result))
    print(markdown(result))


def models(run: Path) -> list:
    """(label, ONNX file, its FP32 graph) for the peer and every final ONNX artifact of `run`."""
    manifest = json.loads((run / "manifest.json").read_text())
    name = manifest["recipe"]["name"]
    peer, teacher = run / "headline" / "teacher-int8" / "model.onnx", run / "headline" / "teacher-fp32" / "model.onnx"
    if not peer.is_file() or not teacher.is_file():
        sys.exit(f"roofline: {run} has no headline/teacher-int8 or teacher-fp32; run bench/headline.py {run} first")
    export = next(s for s in manifest["stages"] if s["name"] == "export")
    fp32 = Artifact.from_json(export["output"], run).all()["onnx"].path
    out, seen = [(f"{name}: peer (teacher ORT dynamic INT8)", peer, teacher)], set()
    for target, art in Artifact.from_json(manifest["final"], run).all().items():
        if art.kind == "onnx" and os.stat(art.path).st_ino not in seen:
            seen.add(os.stat(art.path).st_ino)
            out.append((f"{name}: edgekit {target}", Path(art.path), Path(fp32)))
    return out


def session(model: Path, profiling: bool = False, prefix: str = ""):
    """One thread, the ONNX Runtime optimizers the sidecar disables left off (as edgekit's runtime does)."""
    import onnxruntime as ort

    meta = json.loads((model.parent / "model.json").read_text())
    options = ort.SessionOptions()
    options.intra_op_num_threads = options.inter_op_num_threads = 1
    options.enable_profiling, options.profile_file_prefix = profiling, prefix
    return ort.InferenceSession(str(model), options, providers=["CPUExecutionProvider"],
                                disabled_optimizers=(meta.get("onnxruntime") or {}).get("disabled_optimizers", []))


def feed(sess) -> dict:
    return {i.name: np.full((1, 128), 1 if "mask" in i.name else 5, np.int64) for i in sess.get_inputs()}  # timing ignores ids


def latency(paths: list, rounds: int, timed: int) -> list:
    """p50 ms at 1 x 128 per model: the median of `rounds` interleaved rounds' p50s (a noisy VM hits them all)."""
    sessions = [session(p) for p in paths]
    by_round = [[] for _ in paths]
    for _ in range(rounds):
        for s, out in zip(sessions, by_round):
            inputs, times = feed(s), []
            for i in range(timed + 10):
                started = time.perf_counter()
                s.run(None, inputs)
                if i >= 10:
                    times.append(time.perf_counter() - started)
            out.append(float(np.median(times)) * 1e3)
    return [float(np.median(r)) for r in by_round]


def profile(label: str, model: Path, graph: Path, peak_gops: float, p50: float, runs: int = 100) -> dict:
    """The profiler's kernel time per op, scaled to the unprofiled `p50`, grouped by the kind of work."""
    by_op = {}
    with tempfile.TemporaryDirectory() as tmp:
        s = session(model, True, f"{tmp}/prof")
        inputs = feed(s)
        for _ in range(runs):
            s.run(None, inputs)
        for e in json.loads(Path(s.end_profiling()).read_text()):
            if e.get("cat") == "Node" and e["name"].endswith("_kernel_time"):
                by_op[e["args"]["op_name"]] = by_op.get(e["args"]["op_name"], 0.0) + e["dur"] / 1e3 / runs
    scale = p50 / sum(by_op.values())  # profiled kernel times -> the unprofiled run's milliseconds
    groups = {g: 0.0 for g in list(GROUPS) + ["other"]}
    for op, ms in by_op.items():
        groups[next((g for g, ops in GROUPS.items() if op in ops), "other")] += ms * scale
    flops = headline.gemm_flops(graph)
    roofline_ms = flops / peak_gops / 1e6
    gemm_ms = sum(groups[g] for g in GEMM_GROUPS)
    return {"model": label, "path": str(model), "p50_ms": round(p50, 3), "gemm_gflop_128": round(flops / 1e9, 3),
            "roofline_ms": round(roofline_ms, 3), "roofline_ratio": round(p50 / roofline_ms, 2),
            "gemm_ms": round(gemm_ms, 3), "gemm_gops": round(flops / gemm_ms / 1e6, 1),
            "gemm_share_of_peak": round(flops / gemm_ms / 1e6 / peak_gops, 3),
            "ratio_if_only_gemms": round(gemm_ms / roofline_ms, 2),
            "groups_ms": {g: round(v, 3) for g, v in groups.items()},
            "ops_ms": {op: round(ms * scale, 3) for op, ms in sorted(by_op.items(), key=lambda x: -x[1])}}


def markdown(result: dict) -> str:
    peak = result["peak"]
    names = list(GROUPS) + ["other"]
    lines = ["# Where the time goes against the INT8 roofline", "",
             f"Measured {result['measured']} by `python bench/roofline.py` (raw: `bench/results/roofline.json`). "
             f"1 x 128 tokens, 1 thread; p50: the median of {result['rounds']} interleaved rounds of "
             f"{result['runs_per_round']} unprofiled runs; the split is ONNX "
             f"Runtime's per-node profile (kernel times after its fusions), scaled to that p50. Peak: "
             f"{peak['measured_gops']} GOPS measured (bench/headline.py's INT8 GEMM peak). `GEMMs alone` = GEMM "
             f"time / roofline: the ratio left if every other op took no time.", "",
             "| model | p50 ms | roofline ms | x roofline | GEMM ms | GEMM GOPS (share of peak) | GEMMs alone |"
             + "".join(f" {n} |" for n in names[1:]),
             "|---|---:|---:|---:|---:|---:|---:|" + "---:|" * (len(names) - 1)]
    for r in result["rows"]:
        g = r["groups_ms"]
        lines.append(f"| {r['model']} | {r['p50_ms']:.2f} | {r['roofline_ms']:.2f} | {r['roofline_ratio']:.2f} | "
                     f"{r['gemm_ms']:.2f} | {r['gemm_gops']:.0f} ({100 * r['gemm_share_of_peak']:.0f}%) | "
                     f"{r['ratio_if_only_gemms']:.2f} |" + "".join(f" {g[n]:.2f} |" for n in names[1:]))
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
