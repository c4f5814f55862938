"""Where the time goes against the INT8 roofline: ONNX Runtime's per-node profile of each run's final ONNX
artifacts and of its peer (the teacher's ONNX Runtime dynamic INT8) at 1 x 128 tokens on 1 thread, grouped by the
kind of work. The INT8 GEMMs' own speed is set against the measured peak (bench/headline.py's), so the ratio
they alone leave shows what removing every other op could at best reach.

The final TFLite files get the same ratio, and, where Linux `perf` can sample this process, the same split from
the CPU time per LiteRT / XNNPACK kernel (the Python interpreter has no per-op timing); without perf that table
says so and the ratio alone is kept.

    python bench/headline.py artifacts/edge-base artifacts/edge-small   # first: it builds the peers
    python bench/roofline.py artifacts/edge-base artifacts/edge-small [--rounds 5] [--runs 100]

Writes bench/results/roofline.json and bench/results/roofline.md.
"""
import json
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from tqdm import tqdm

from edgekit import cli, devices, latency, runtime
from edgekit.artifact import Artifact, write_json, write_text

import headline  # bench/headline.py: the same GEMM FLOP count and peak

GROUPS = {  # ONNX Runtime CPU kernels (after its graph fusions) -> the kind of work
    "INT8 GEMM (incl. activation quantization)": ("DynamicQuantizeMatMul", "MatMulIntegerToFloat", "MatMulInteger",
                                                  "DynamicQuantizeLinear", "QAttention", "QGemm", "QLinearMatMul"),
    "FP32 GEMM": ("MatMul", "FusedMatMul", "Gemm", "FusedGemm"),  # FusedGemm: the pooler's Gemm + Tanh
    "softmax / attention": ("Softmax", "Attention", "MultiHeadAttention"),
    "LayerNorm": ("LayerNormalization", "SkipLayerNormalization", "EmbedLayerNormalization", "SimplifiedLayerNormalization"),
    "GELU": ("Gelu", "BiasGelu", "FastGelu", "Erf", "Tanh"),
    "bias / residual adds": ("Add", "BiasAdd"),
    "layout (transpose, reshape, ...)": ("Transpose", "Reshape", "Unsqueeze", "Squeeze", "Concat", "Slice", "Expand",
                                         "Flatten", "Shape", "Gather", "GatherElements", "Range"),
}
GEMM_GROUPS = ("INT8 GEMM (incl. activation quantization)", "FP32 GEMM")
TFLITE_GROUPS = {  # LiteRT CPU kernels (XNNPACK's, and LiteRT's own for the ops it keeps) -> the kind of work
    "INT8 GEMM": r"qd8_f32_qc8w_.*gemm|qs8_qc8w_.*gemm|qd8_.*gemm",
    "activation quantization": r"pack_lh|qdu8|rminmax|f32_q[su]8_vcvt",
    "FP32 GEMM (attention)": r"f32_gemm|f32_igemm|packw_gemm",
    "softmax": r"raddstoreexp|softmax|f32_rmax",
    "GELU": r"vgelu",
    "elementwise (LayerNorm, residual, mask)": r"f32_v(add|mul|sub|sqrdiff|rsqrt|div)|f32_rsum|reciprocal",
    "layout (transpose, reshape, copy)": r"transpose|memmove|memcpy",
    "embedding lookup": r"embedding_lookup",
}
TFLITE_GEMMS = ("INT8 GEMM", "activation quantization", "FP32 GEMM (attention)")


def main(argv=None):
    ap = cli.Parser(description=cli.description(__doc__))
    ap.add_argument("runs", nargs="+", type=Path, help="finished runs (bench/headline.py already run on them)")
    ap.add_argument("--rounds", type=int, default=5, help="interleaved rounds (the median of their ratios is kept)")
    ap.add_argument("--runs", dest="timed", type=int, default=100, help="timed runs per model per round")
    ap.add_argument("--out", type=Path, default=Path("bench/results/roofline.json"),
                    help="the result JSON, its .md beside it (default bench/results/roofline.json)")
    a = ap.parse_args(argv)
    labels = run_labels(a.runs)
    todo = [m for run, label in zip(a.runs, labels) for m in models(run, label)]
    lite = [m for run, label in zip(a.runs, labels) for m in tflite_models(run, label)]
    sessions = [session(model) for _, model, _ in todo]
    lite_flops = [headline.tflite_flops(model) for _, model in lite]  # refuses a file without a 128-token signature
    lite_runs = [tflite_runner(model) for _, model in lite]
    flops = [headline.gemm_flops(graph) for _, _, graph in todo]
    p50s, lite_p50s, peaks = [[] for _ in todo], [[] for _ in lite], []
    for r in range(a.rounds):  # the peak is measured in every round: a slow spell on the VM hits both sides
        peaks.append(headline.gemm_peak()["measured_gops"])
        for s, out in zip(sessions, p50s):
            out.append(p50_ms(s, a.timed))
        for fn, out in zip(lite_runs, lite_p50s):
            out.append(float(np.median(latency.timed(fn, a.timed, warmup=10))))
        print(f"round {r + 1}/{a.rounds}: peak {peaks[-1]} GOPS", file=sys.stderr)
    rows = []
    for (label, model, _), f, p in zip(todo, flops, p50s):
        q = headline.ratios_by_round(p, peaks, f)  # each round's p50 against its own peak
        profiles = sorted((profile(label, model, f, a.timed) for _ in range(a.rounds)), key=lambda x: x["profile"]["ratio"])
        rows.append({**profiles[len(profiles) // 2], "p50_ms": round(float(np.median(p)), 3),  # the median profile
                     "roofline_ratio": headline.roofline_ratio(p, peaks, f), "ratio_by_round": [round(x, 2) for x in q],
                     "profiled_ratios": [x["profile"]["ratio"] for x in profiles]})
    lite_rows = []
    for (label, model), f, p in zip(lite, lite_flops, lite_p50s):
        p50, peak = float(np.median(p)), float(np.median(peaks))
        lite_rows.append({"model": label, "path": str(model), "gemm_gflop_128": round(f / 1e9, 3),
                          "p50_ms": round(p50, 3), "roofline_ms": round(f / peak / 1e6, 3),
                          "roofline_ratio": headline.roofline_ratio(p, peaks, f),
                          "groups_ms": tflite_split(model, p50, 5 * a.timed)})
    result = {"measured": time.strftime("%Y-%m-%d %H:%M"), **devices.this_cpu(),
              "json": str(a.out), "peak_gops_by_round": peaks, "rounds": a.rounds, "runs_per_round": a.timed,
              "rows": rows, "tflite_rows": lite_rows}
    write_json(a.out, result)
    write_text(a.out.with_suffix(".md"), markdown(result))
    print(markdown(result))


def run_labels(runs: list) -> list:
    """Each run's recipe name, with the run's folder name beside it where two runs share a recipe."""
    names = [json.loads((run / "manifest.json").read_text())["recipe"]["name"] for run in runs]
    return headline.run_labels(names, runs)


def models(run: Path, name: str) -> list:
    """(label, ONNX file, its FP32 graph) for the peer and every final ONNX artifact of `run`, labelled `name`."""
    manifest = json.loads((run / "manifest.json").read_text())
    peer, teacher = run / "headline" / "teacher-int8" / "model.onnx", run / "headline" / "teacher-fp32" / "model.onnx"
    if not peer.is_file() or not teacher.is_file():
        sys.exit(f"roofline: {run} has no headline/teacher-int8 or teacher-fp32; run bench/headline.py {run} first")
    export = next(s for s in manifest["stages"] if s["name"] == "export")
    fp32 = Artifact.from_json(export["output"], run).all()["onnx"].path
    return [(f"{name}: peer (teacher ORT dynamic INT8)", peer, teacher)] + [
        (f"{name}: edgekit {names}", Path(art.path), Path(fp32))
        for names, art in headline.distinct_finals(manifest, run) if art.kind == "onnx"]


def tflite_models(run: Path, name: str) -> list:
    """(label, .tflite file) for every final TFLite artifact of `run`, labelled `name` (FLOPs counted in the file)."""
    manifest = json.loads((run / "manifest.json").read_text())
    return [(f"{name}: edgekit {names}", Path(art.path))
            for names, art in headline.distinct_finals(manifest, run) if art.kind == "tflite"]


def tflite_runner(model: Path):
    """One thread, the 128-token signature, all ids 5 and no padding (timing ignores ids)."""
    from ai_edge_litert.interpreter import Interpreter

    meta = json.loads((model.parent / "model.json").read_text())  # main() checked it has one (tflite_flops)
    run = Interpreter(str(model), num_threads=1).get_signature_runner(meta["signatures"]["128"])
    feed = {meta["inputs"][0]["name"]: np.full((1, 128), 5, np.int32),
            meta["inputs"][1]["name"]: np.ones((1, 128), np.int32)}
    return lambda: run(**feed)


def tflite_split(model: Path, p50: float, runs: int) -> dict | None:
    """The p50 split by kind of work: `perf` samples a clean process running `model` (edgekit.latency) and each
    group's share of the samples in LiteRT's kernels (and the copies they call) is scaled to `p50`. None where
    perf is missing or may not sample."""
    if shutil.which("perf") is None:
        return None
    with tempfile.TemporaryDirectory() as tmp:
        recorded = subprocess.run(["perf", "record", "-q", "-F", "4000", "-o", f"{tmp}/perf.data", "--",
                                   sys.executable, "-m", "edgekit.latency", str(model), "--runs", str(runs)],
                                  capture_output=True, text=True)
        if recorded.returncode != 0:
            return None
        report = subprocess.run(["perf", "report", "-i", f"{tmp}/perf.data", "--no-children", "--sort", "dso,sym",
                                 "--stdio"], capture_output=True, text=True).stdout
    shares = kernel_shares(report)
    total = sum(shares.values())
    return {g: round(p50 * v / total, 3) for g, v in shares.items()} if total else None


def kernel_shares(report: str) -> dict:
    """`perf report --sort dso,sym --stdio` -> percent of samples per TFLITE_GROUPS group (plus `other`), counting
    LiteRT's libraries and the libc copies their ops call; Python, numpy and the tokenizer are left out."""
    shares = {g: 0.0 for g in list(TFLITE_GROUPS) + ["other"]}
    for line in report.splitlines():
        m = re.match(r"\s*([\d.]+)%\s+(\S+)\s+\[.\]\s+(.+?)\s*$", line)
        if not m or not ("litert" in m[2].lower() or re.search(r"memmove|memcpy", m[3])):
            continue
        group = next((g for g, pattern in TFLITE_GROUPS.items() if re.search(pattern, m[3])), "other")
        shares[group] += float(m[1])
    return shares


def session(model: Path, profiling: bool = False, prefix: str = ""):
    """One thread, the ONNX Runtime optimizers the sidecar disables left off (as edgekit's runtime does)."""
    import onnxruntime as ort

    meta = json.loads((model.parent / "model.json").read_text())
    options = ort.SessionOptions()
    options.intra_op_num_threads = options.inter_op_num_threads = 1
    options.enable_profiling, options.profile_file_prefix = profiling, prefix
    return ort.InferenceSession(str(model), options, providers=["CPUExecutionProvider"],
                                disabled_optimizers=runtime.disabled_optimizers(meta))


def feed(sess) -> dict:
    return {i.name: np.full((1, 128), 1 if "mask" in i.name else 5, np.int64) for i in sess.get_inputs()}  # timing ignores ids


def p50_ms(sess, timed: int) -> float:
    inputs = feed(sess)
    return float(np.median(latency.timed(lambda: sess.run(None, inputs), timed, warmup=10)))


def interleaved(measure, count: int, rounds: int, desc: str = "") -> list:
    """[p50 ms per round] for each of `count` files, `measure(i)` giving file i's p50, in `rounds` rounds whose
    order reverses every other round (a busy VM's drift falls on every file alike). `desc`: a bar over the rounds."""
    times = [[] for _ in range(count)]
    for n in tqdm(range(rounds), desc=desc, unit="round", disable=not desc):
        for i in range(count) if n % 2 == 0 else reversed(range(count)):
            times[i].append(measure(i))
    return times


def latency_fields(times: list, baseline: list, ratio_key: str) -> dict:
    """A row's p50 per round, their median, and (as `ratio_key`) the median per-round ratio to `baseline`'s."""
    return {"p50_ms_by_round": [round(t, 3) for t in times], "p50_ms": round(statistics.median(times), 3),
            ratio_key: round(statistics.median(t / b for t, b in zip(times, baseline)), 3)}


def save(out: Path, result: dict, markdown) -> None:
    """The result JSON at `out`, its `markdown(result)` beside it as .md, and printed."""
    write_json(out, result)
    text = markdown(result)
    write_text(out.with_suffix(".md"), text)
    print(text)


def profile(label: str, model: Path, flops: int, timed: int) -> dict:
    """Within a few seconds: the peak, the unprofiled p50, and the profiler's kernel time per op scaled to that
    p50 and grouped by the kind of work; so the GEMMs' share of the peak compares like with like."""
    by_op = {}
    with tempfile.TemporaryDirectory() as tmp:
        peak = headline.gemm_peak()["measured_gops"]
        p50 = p50_ms(session(model), timed)
        s = session(model, True, f"{tmp}/prof")
        inputs = feed(s)
        for _ in range(timed):
            s.run(None, inputs)
        for e in json.loads(Path(s.end_profiling()).read_text()):
            if e.get("cat") == "Node" and e["name"].endswith("_kernel_time"):
                by_op[e["args"]["op_name"]] = by_op.get(e["args"]["op_name"], 0.0) + e["dur"] / 1e3 / timed
    scale = p50 / sum(by_op.values())  # profiled kernel times -> the unprofiled run's milliseconds
    groups = {g: 0.0 for g in list(GROUPS) + ["other"]}
    for op, ms in by_op.items():
        groups[next((g for g, ops in GROUPS.items() if op in ops), "other")] += ms * scale
    roofline_ms = flops / peak / 1e6
    gemm_ms = sum(groups[g] for g in GEMM_GROUPS)
    return {"model": label, "path": str(model), "gemm_gflop_128": round(flops / 1e9, 3),
            "profile": {"peak_gops": peak, "p50_ms": round(p50, 3), "roofline_ms": round(roofline_ms, 3),
                        "gemm_ms": round(gemm_ms, 3), "gemm_gops": round(flops / gemm_ms / 1e6, 1),
                        "gemm_share_of_peak": round(flops / gemm_ms / 1e6 / peak, 3),
                        "ratio": round(p50 / roofline_ms, 2), "ratio_if_only_gemms": round(gemm_ms / roofline_ms, 2),
                        "ratio_of_the_rest": round((p50 - gemm_ms) / roofline_ms, 2),
                        "groups_ms": {g: round(v, 3) for g, v in groups.items()},
                        "ops_ms": {op: round(ms * scale, 3) for op, ms in sorted(by_op.items(), key=lambda x: -x[1])}}}


def markdown(result: dict) -> str:
    names = list(GROUPS) + ["other"]
    peaks = result["peak_gops_by_round"]
    lines = ["# Where the time goes against the INT8 roofline", "",
             f"Measured {result['measured']} by `python bench/roofline.py` on {result.get('cpu', 'this machine')} "
             f"({result.get('int8_isa') or 'INT8 instructions not recorded'}; "
             f"raw: `{result.get('json', 'bench/results/roofline.json')}`). "
             f"1 x 128 tokens, 1 thread. The INT8 GEMM peak (bench/headline.py's: the fastest INT8 GEMM ONNX Runtime "
             f"or LiteRT's XNNPACK runs here) is measured in each of {result['rounds']} interleaved rounds "
             f"({min(peaks):.0f}-{max(peaks):.0f} GOPS), so `x roofline` is the median of per-round ratios "
             f"(p50 over {result['runs_per_round']} runs against that round's peak). The split comes from ONNX "
             f"Runtime's per-node profile (kernel times after its fusions), taken within seconds of its own peak "
             f"and p50 and scaled to that p50 (ms below); of {result['rounds']} such profiles per model the one with "
             f"the median ratio is shown. `GEMMs alone` = GEMM time / roofline: the ratio left if "
             f"every other op took no time; `the rest` = the other ops' time / roofline: what stays even if the "
             f"GEMMs ran at the peak (the ratio could then be no better than 1 + the rest).", "",
             "| model | p50 ms | x roofline | profiled p50 ms | roofline ms | GEMM ms | GEMM GOPS (share of peak) | "
             "GEMMs alone | the rest |" + "".join(f" {n} |" for n in names[1:]),
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|" + "---:|" * (len(names) - 1)]
    for r in result["rows"]:
        p, g = r["profile"], r["profile"]["groups_ms"]
        lines.append(f"| {r['model']} | {r['p50_ms']:.2f} | {r['roofline_ratio']:.2f} | {p['p50_ms']:.2f} | "
                     f"{p['roofline_ms']:.2f} | {p['gemm_ms']:.2f} | {p['gemm_gops']:.0f} "
                     f"({100 * p['gemm_share_of_peak']:.0f}%) | {p['ratio_if_only_gemms']:.2f} | "
                     f"{p['ratio_of_the_rest']:.2f} |"
                     + "".join(f" {g[n]:.2f} |" for n in names[1:]))
    return "\n".join(lines) + "\n" + tflite_markdown(result.get("tflite_rows", []))


def tflite_markdown(rows: list) -> str:
    if not rows:
        return ""
    names = list(TFLITE_GROUPS) + ["other"]
    lines = ["", "## TFLite files (LiteRT, XNNPACK)", "",
             "Timed in the same rounds against the same peaks (the 128-token signature, no padding). The split is "
             "`perf`'s CPU samples per LiteRT / XNNPACK kernel in a clean process running the file, each kind's "
             "share scaled to the p50 (ms below); LayerNorm, the residual and bias adds and the attention mask "
             "run in the same elementwise kernels, so they share a column; `other` is XNNPACK's dispatch and, once per "
             "process, its weight packing. `GEMMs alone` = INT8 GEMM, its "
             "activation quantization and the FP32 attention GEMMs / roofline.", "",
             "| model | p50 ms | x roofline | roofline ms | GEMMs alone | the rest |" + "".join(f" {n} |" for n in names),
             "|---|---:|---:|---:|---:|---:|" + "---:|" * len(names)]
    for r in rows:
        g = r["groups_ms"]
        if g is None:
            lines.append(f"| {r['model']} | {r['p50_ms']:.2f} | {r['roofline_ratio']:.2f} | {r['roofline_ms']:.2f} | "
                         f"no split: perf is missing or may not sample here |" + " |" * (len(names) + 1))
            continue
        gemms = sum(g[n] for n in TFLITE_GEMMS)
        lines.append(f"| {r['model']} | {r['p50_ms']:.2f} | {r['roofline_ratio']:.2f} | {r['roofline_ms']:.2f} | "
                     f"{gemms / r['roofline_ms']:.2f} | {(r['p50_ms'] - gemms) / r['roofline_ms']:.2f} |"
                     + "".join(f" {g[n]:.2f} |" for n in names))
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    from edgekit.cli import script

    sys.exit(script(main))
