"""The headline result: each edge recipe against its own teacher and the usual INT8 path, in one run.

For every finished run given (edge-base, edge-small): the FP32 teacher in ONNX Runtime; the teacher's ONNX
Runtime dynamic INT8, per-channel (what optimum-cli's dynamic config for this CPU does, avx512_vnni or avx2:
"the peer"; peers.peer_config); and every final artifact of the run. Per model: size; p50/p90 latency at batch 1
on 1 thread, at 128 tokens and on the real test sentences (interleaved rounds in clean processes, median over
rounds); accuracy on the rt-polarity test split and out of domain on vader-amazon (every sentence on its own, as a
device runs it); the GEMM work left at 128 tokens and the ratio of the measured latency to the INT8 roofline for
that work.

Roofline: the peak is measured, not assumed: the fastest INT8 GEMM either engine edgekit exports for runs on one
thread of this CPU, over four shapes from BERT-sized 128x384x384 to 1024x2048x2048: ONNX Runtime's u8 x s8 -> s32
MatMulInteger (MLAS) and LiteRT's dynamic-range FULLY_CONNECTED (XNNPACK, activations quantized at run time, as
edgekit's .tflite files run). Which is faster depends on the CPU and the shape (ONNX Runtime was on the
AVX512-VNNI VMs measured before; on a Sapphire Rapids core both run AMX tile kernels and each wins some shapes), and
the faster one sets the roofline for every artifact. The peak is measured again at the start of every latency round;
`x roofline` is the median over rounds of that round's p50 against that round's peak (a slow spell then moves both;
one peak taken before the runs once read 415 GOPS where the rounds after read 441-448). On VNNI and AMX CPUs the
theoretical peak (clock x INT8 multiply-adds per cycle x 2) is printed beside it. work = FLOPs of every
MatMul/Gemm in the FP32 graph with shapes inferred for 1 x 128 tokens (for a .tflite file, of its own
FULLY_CONNECTED and BATCH_MATMUL ops in the 128-token signature: its last layer may compute one row);
roofline_ms = work / the median peak. Only GEMMs count:
softmax, LayerNorm, GELU and the run-time quantization of activations are what the ratio charges the model for.

Accuracy kept comes with a 95% paired bootstrap interval (the same resampled sentences for the artifact and the
teacher): a bound inside it is one the split cannot tell apart from the artifact's own share.

    python bench/headline.py artifacts/edge-base artifacts/edge-small [--rounds 3] [--runs-per-round 50]

Writes bench/results/headline.json, docs/results.md and docs/results-pareto.png (--out, --docs: elsewhere).
"""
import functools
import json
import os
import sys
import tempfile
import time
import warnings
from dataclasses import replace
from pathlib import Path

import numpy as np

from edgekit import cli, data, devices, gate, pipeline, runtime
from edgekit.artifact import Artifact, size_mb, write_json, write_text
from edgekit.errors import EdgekitError
from edgekit.stages import bench, evaluate

import peers  # bench/peers.py: the teacher and the peer are built the same way there

TARGETS = {  # issue #9, per recipe: checked on every final artifact; a recipe meets them when one artifact meets all
    "edge-base": {"size_mb": 20.0, "speedup_vs_peer": 10.0, "retained": 0.97, "vader_retained": 0.97, "roofline": 1.5},
    "edge-small": {"size_mb": 6.0, "p50_ms": 3.0, "retained": 0.97, "vader_retained": 0.97, "roofline": 1.5},
}


def main(argv=None):
    p = cli.Parser(description=cli.description(__doc__))
    p.add_argument("runs", nargs="*", type=Path, help="finished runs of edge-base / edge-small (or any recipe)")
    p.add_argument("--rounds", type=int, default=3, help="interleaved latency rounds (the median over them is kept)")
    p.add_argument("--runs-per-round", dest="timed", type=int, default=50,
                   help="timed runs per model per round (and real test sentences timed)")
    p.add_argument("--out", type=Path, default=Path("bench/results/headline.json"), help="the JSON result")
    p.add_argument("--docs", type=Path, default=Path("docs/results.md"),
                   help="the markdown table (its Pareto plot is written beside it as <name>-pareto.png)")
    p.add_argument("--render", action="store_true", help="redraw the docs from the stored JSON, no runs")
    a = p.parse_args(argv)
    if not a.render and not a.runs:
        p.error("give finished runs to measure (artifacts/edge-base ...), or --render to redraw the docs")
    if a.render:
        result = json.loads(a.out.read_text())
        plot(result["recipes"], pareto(a.docs))
        write_text(a.docs, markdown(result, a.out, pareto(a.docs).name))
        return
    for run in a.runs:  # a wrong folder stops here, not after the seconds the peak and the conversions take
        gate.load_manifest(run)
    peak = gemm_peak()
    print(f"INT8 GEMM peak, 1 thread: {peak['measured_gops']} GOPS measured ({peak['theoretical_gops']} theoretical)",
          file=sys.stderr)
    recipes = [measure_run(run.resolve(), a.rounds, a.timed) for run in a.runs]
    result = {"at": time.strftime("%Y-%m-%d %H:%M"), "threads": 1, "batch": 1, "seq_len": 128, "rounds": a.rounds,
              "runs_per_round": a.timed, "peak": peak, "peer": peers.peer_config(), "recipes": recipes}
    a.out.parent.mkdir(parents=True, exist_ok=True)
    write_json(a.out, result)
    a.docs.parent.mkdir(parents=True, exist_ok=True)
    plot(recipes, pareto(a.docs))
    write_text(a.docs, markdown(result, a.out, pareto(a.docs).name))
    print(a.docs.read_text())


def pareto(docs: Path) -> Path:
    """The plot beside the markdown: docs/results.md -> docs/results-pareto.png."""
    return docs.with_name(f"{docs.stem}-pareto.png")


def distinct_finals(manifest: dict, run: Path) -> list:
    """[(names joined by " = ", Artifact)] for a run's final artifacts, each file once: quantize hard-links
    identical per-target files (x86-tflite = arm64-tflite), which are measured once under all their names."""
    files = {}
    for name, art in Artifact.from_json(manifest["final"], run).all().items():
        files.setdefault(os.stat(art.path).st_ino, ([], art))[0].append(name)
    return [(" = ".join(names), art) for names, art in files.values()]


def measure_run(run: Path, rounds: int, timed: int) -> dict:
    manifest, ctx = pipeline.context_of(run)
    name = manifest["recipe"]["name"]
    print(f"{name}: {run}", file=sys.stderr)
    ctx = replace(ctx, targets=["x86"], progress=False)
    work = run / "headline"
    teacher, peer = peers.teacher_and_peer(ctx, work)
    stages = {s["name"]: s for s in manifest["stages"]}
    student_onnx = Artifact.from_json(stages["export"]["output"], run).all().get("onnx")
    models = [("teacher FP32", teacher.path, teacher.path), ("peer: teacher ORT dynamic INT8", peer.path, teacher.path)]
    for names, art in distinct_finals(manifest, run):
        models.append((f"edgekit {names}", art.path, student_onnx.path if student_onnx else None))
    texts = peers.sentences(ctx.splits.test[:timed], work)
    peaks = []
    latency = bench.measure_interleaved([path for _, path, _ in models], rounds=rounds, seq_len=128, threads=1,
                                        runs=timed, warmup=10, texts=texts,
                                        before_round=lambda: peaks.append(gemm_peak()["measured_gops"]))
    median_peak = float(np.median(peaks))
    print(f"{name}: INT8 GEMM peak by round {peaks} GOPS", file=sys.stderr)
    vader = data.out_of_domain(manifest["data"]["labels"])
    rows, right = [], []  # right: (test, vader) sentences each model gets right, for the shares kept
    for (label, path, graph), lat in zip(models, latency):
        model = runtime.load(path)
        flops = tflite_flops(path) if Path(path).suffix == ".tflite" else gemm_flops(graph) if graph else None
        test_hits = evaluate.correct(model, ctx.splits.test, 1, True, label[:30])
        vader_hits = evaluate.correct(model, vader, 1, True, label[:24] + " vader")
        right.append((sum(test_hits), sum(vader_hits)))
        rows.append({"model": label, "path": str(path), "size_mb": size_mb(Artifact(path, model.kind)),
                     "accuracy": round(sum(test_hits) / len(test_hits), 4),
                     "vader_accuracy": round(sum(vader_hits) / len(vader_hits), 4),
                     "test_correct": bits(test_hits), "vader_correct": bits(vader_hits),
                     "p50_ms": lat["fixed"]["p50"], "p90_ms": lat["fixed"]["p90"],
                     "p50_by_round": lat["fixed_p50_by_round"], "sentences_p50_ms": lat["sentences"]["p50"],
                     "sentences_p90_ms": lat["sentences"]["p90"], "peak_rss_mb": lat["peak_rss_mb"],
                     "gemm_gflop_128": round(flops / 1e9, 3) if flops else None,
                     "roofline_ms": round(flops / median_peak / 1e6, 3) if flops else None,
                     "roofline_ratio": roofline_ratio(lat["fixed_p50_by_round"], peaks, flops) if flops else None})
    base, peer_row = rows[0], rows[1]
    for r, (test_right, vader_right) in zip(rows, right):  # from the counts: a ratio of rounded accuracies read
        r["retained"] = test_right / right[0][0]  # 969 / 999 right, 0.96997, as 0.97
        r["vader_retained"] = vader_right / right[0][1]
        r["retained_ci"] = kept_interval(r["test_correct"], base["test_correct"])
        r["vader_retained_ci"] = kept_interval(r["vader_correct"], base["vader_correct"])
        r["speedup_vs_peer"] = round(peer_row["p50_ms"] / r["p50_ms"], 2)
    checked = {r["model"]: checks(name, r) for r in rows[2:]}
    return {"recipe": name, "run": str(run), "teacher": manifest["recipe"]["teacher"], "peak_gops_by_round": peaks,
            "test_examples": len(ctx.splits.test), "vader_examples": len(vader), "rows": rows, "checks": checked,
            "all_targets_met_by": [m for m, c in checked.items() if c and all(x["met"] for x in c)]}


def ratios_by_round(p50_by_round: list, peak_by_round: list, flops: int) -> list:
    """Each round's p50 (ms) against the roofline of that round's peak (GOPS)."""
    return [ms / (flops / peak / 1e6) for ms, peak in zip(p50_by_round, peak_by_round)]


def roofline_ratio(p50_by_round: list, peak_by_round: list, flops: int) -> float:
    """The median over rounds of ratios_by_round."""
    return round(float(np.median(ratios_by_round(p50_by_round, peak_by_round, flops))), 2)


def bits(hits: list) -> str:
    """Per-sentence correctness as a compact string ("1" right, "0" wrong), stored so --render can redo intervals."""
    return "".join("1" if h else "0" for h in hits)


def kept_interval(model: str, teacher: str) -> list:
    """evaluate.kept_interval on two stored correctness strings."""
    return evaluate.kept_interval(*([c == "1" for c in x] for x in (model, teacher)))


def checks(recipe: str, row: dict) -> list:
    """The issue's targets for this recipe on one artifact: actual, bound, met, and by how much it missed."""
    out = []
    for key, bound in TARGETS.get(recipe, {}).items():
        metric = {"roofline": "roofline_ratio"}.get(key, key)
        actual = row.get(metric)
        at_most = key in ("size_mb", "p50_ms", "roofline")
        met = actual is not None and (actual <= bound if at_most else actual >= bound)
        out.append({"target": f"{metric} {'<=' if at_most else '>='} {bound:g}", "actual": actual, "met": met,
                    "off_by": None if met or actual is None else
                    (f"{actual / bound:.2f}x the bound" if at_most else
                     f"{bound - actual:.4f} short" if round(bound - actual, 4) else f"{bound - actual:.1g} short"),
                    "interval": row.get(f"{metric}_ci")})
    return out


def gemm_flops(onnx_path) -> int:
    """2 * M * N * K summed over the MatMul / Gemm nodes of an FP32 graph, shapes inferred for 1 x 128 tokens."""
    import onnx

    from edgekit.stages.export import infer_shapes

    model = onnx.load(str(onnx_path))
    for graph_input in model.graph.input:
        for dim, value in zip(graph_input.type.tensor_type.shape.dim, (1, 128)):
            dim.ClearField("dim_param")
            dim.dim_value = value
    model = infer_shapes(model)
    shapes = {v.name: [d.dim_value for d in v.type.tensor_type.shape.dim]
              for v in list(model.graph.value_info) + list(model.graph.input) + list(model.graph.output)}
    shapes.update({t.name: list(t.dims) for t in model.graph.initializer})
    total = 0
    for node in model.graph.node:
        if node.op_type in ("MatMul", "Gemm"):
            a, y = shapes[node.input[0]], shapes[node.output[0]]
            trans_a = any(at.name == "transA" and at.i for at in node.attribute)
            total += 2 * int(np.prod(y)) * (a[-2] if trans_a else a[-1])
    return total


def tflite_flops(path, signature: str = "seq128") -> int:
    """2 * M * N * K summed over the FULLY_CONNECTED and BATCH_MATMUL ops of one signature of a .tflite file: the
    work the file itself does (its export may drop rows the classifier never reads, which the ONNX graph keeps)."""
    from ai_edge_litert import schema_py_generated as schema

    model = schema.ModelT.InitFromPackedBuf(Path(path).read_bytes(), 0)
    graph = next((g for g in model.subgraphs if (g.name or b"").decode() == signature), None)
    if graph is None:  # the last signature would count another length's work under a "@128" label
        raise EdgekitError(f"{path} has no signature {signature} (it has "
                           f"{', '.join((g.name or b'?').decode() for g in model.subgraphs)}); export with max_length 128 "
                           f"or more to measure it at 128 tokens")
    ops = schema.BuiltinOperator
    total = 0
    for op in graph.operators:
        code = model.operatorCodes[op.opcodeIndex]
        kind = max(code.builtinCode, code.deprecatedBuiltinCode)
        if kind not in (ops.FULLY_CONNECTED, ops.BATCH_MATMUL):
            continue
        a, y = graph.tensors[op.inputs[0]].shape, graph.tensors[op.outputs[0]].shape
        adj_x = kind == ops.BATCH_MATMUL and op.builtinOptions is not None and op.builtinOptions.adjX
        total += 2 * int(np.prod(y)) * int(a[-2] if adj_x else a[-1])
    return total


def matmul_integer(weights: np.ndarray, m: int):
    """A one-thread ONNX Runtime session of one u8 [m, k] x s8 `weights` [k, n] -> s32 MatMulInteger (input `A`)."""
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    k, n = weights.shape
    graph = helper.make_graph([helper.make_node("MatMulInteger", ["A", "B"], ["Y"])], "gemm",
                              [helper.make_tensor_value_info("A", TensorProto.UINT8, [m, k])],
                              [helper.make_tensor_value_info("Y", TensorProto.INT32, [m, n])],
                              [numpy_helper.from_array(weights, "B")])
    options = ort.SessionOptions()
    options.intra_op_num_threads = options.inter_op_num_threads = 1
    return ort.InferenceSession(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
                                .SerializeToString(), options, providers=["CPUExecutionProvider"])


GEMM_SHAPES = ((128, 384, 384), (128, 384, 1536), (512, 1024, 1024), (1024, 2048, 2048))  # M x K x N
MACS_PER_CYCLE = {  # u8 x s8 multiply-adds per cycle and core: (what, how many)
    "AMX-INT8": ("1024 AMX tile multiply-adds", 1024),  # TDPBUSD: 16x64 by 64x16 bytes in 16 cycles
    "AVX512-VNNI": ("2 vector ports x 64 AVX512-VNNI multiply-adds", 128),
    "AVX-VNNI": ("2 vector ports x 32 AVX-VNNI multiply-adds", 64),
}


@functools.cache
def fully_connected(k: int, n: int, m: int):
    """`invoke` of a one-thread LiteRT interpreter running one dynamic-range INT8 FULLY_CONNECTED, [m, k] x [k, n],
    as edgekit's .tflite files run their Linear layers (XNNPACK's qd8-f32-qc8w GEMM: int8 weights, activations
    quantized per row at run time); None without litert-torch. Built once per process: converting takes seconds."""
    try:
        import litert_torch
        import torch
        from ai_edge_litert.interpreter import Interpreter
        from ai_edge_quantizer import quantizer, recipe
    except ImportError:
        return None
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as tmp, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        litert_torch.convert(torch.nn.Linear(k, n, bias=False).eval(), (torch.randn(m, k),)).export(f"{tmp}/fp32")
        quantizer.Quantizer(f"{tmp}/fp32", recipe.dynamic_wi8_afp32()).quantize().export_model(f"{tmp}/int8")
        interpreter = Interpreter(model_content=Path(f"{tmp}/int8").read_bytes(), num_threads=1)
    interpreter.allocate_tensors()
    interpreter.set_tensor(interpreter.get_input_details()[0]["index"],
                           np.random.default_rng(0).standard_normal((m, k)).astype(np.float32))
    return interpreter.invoke


def best_gops(run, ops: int) -> float:
    """GOPS of the fastest of 20 timed calls of `run` (after 5 warm-up calls)."""
    times = []
    for i in range(25):
        started = time.perf_counter()
        run()
        if i >= 5:
            times.append(time.perf_counter() - started)
    return round(ops / min(times) / 1e9, 1)


def gemm_peak() -> dict:
    """The fastest INT8 GEMM either engine edgekit exports for runs on one thread here (GOPS): ONNX Runtime's
    u8 x s8 MatMulInteger (MLAS) and LiteRT's dynamic-range FULLY_CONNECTED (XNNPACK); whichever is faster on this
    CPU sets the roofline for every artifact. With a nominal figure for the CPU's INT8 instructions at the clock
    /proc/cpuinfo reports, which is no ceiling: that is often the base clock, and boosting cores measure past it."""
    rng, best, by_engine = np.random.default_rng(0), {}, {}
    for m, k, n in GEMM_SHAPES:
        session = matmul_integer(rng.integers(-127, 128, (k, n)).astype(np.int8), m)
        feed = {"A": rng.integers(0, 256, (m, k)).astype(np.uint8)}
        best[f"onnxruntime {m}x{k}x{n}"] = best_gops(lambda: session.run(None, feed), 2 * m * k * n)
        fc = fully_connected(k, n, m)
        if fc is not None:
            best[f"xnnpack {m}x{k}x{n}"] = best_gops(fc, 2 * m * k * n)
    for key, gops in best.items():
        engine = key.split()[0]
        by_engine[engine] = max(by_engine.get(engine, 0.0), gops)
    mhz = max((float(line.split(":")[1]) for line in Path("/proc/cpuinfo").read_text().splitlines()
               if line.startswith("cpu MHz")), default=0.0)
    cpu = devices.this_cpu()
    what, per_cycle = MACS_PER_CYCLE.get(cpu["int8_isa"], (None, None))
    engines = " vs ".join(f"{e} {g}" for e, g in by_engine.items())
    return {"measured_gops": max(best.values()), "engine": max(by_engine, key=by_engine.get),
            "by_engine_gops": by_engine, "by_shape_gops": best, "clock_mhz": mhz, **cpu,
            "theoretical_gops": round(mhz / 1e3 * per_cycle * 2, 1) if per_cycle else None,
            "how": f"fastest of ONNX Runtime's u8 x s8 MatMulInteger (MLAS) and LiteRT's dynamic-range FULLY_CONNECTED "
                   f"(XNNPACK) over {len(GEMM_SHAPES)} shapes, 1 thread, best of 20 runs per shape ({engines} GOPS"
                   f"{'' if 'xnnpack' in by_engine else '; XNNPACK not measured: litert-torch is not installed'}); " +
                   (f"nominal = the clock /proc/cpuinfo reports x {what} per cycle x 2 ops, not a ceiling: a core "
                    f"that boosts past that clock measures more"
                    if per_cycle else
                    f"no nominal figure: {cpu['int8_isa'] or 'this CPU'} has no one-instruction INT8 multiply-add")}


def run_labels(names: list, runs: list) -> list:
    """Each run's recipe name, with as much of its folder's path as tells it from the other runs of that recipe
    beside it (two CI jobs' .../edge-small read alike by folder name)."""
    from edgekit.report import unique_names

    out = []
    for name, run in zip(names, runs):
        same = [str(r) for n, r in zip(names, runs) if n == name]
        out.append(name if len(same) == 1 else f"{name} ({unique_names(same)[same.index(str(run))]})")
    return out


def plot(recipes: list, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    fig, ax = plt.subplots(figsize=(8, 5))
    labels = run_labels([r["recipe"] for r in recipes], [r["run"] for r in recipes])
    bounds, said = set(), set()  # two runs of one teacher: its teacher and peer are labelled once
    for i, (recipe, label) in enumerate(zip(recipes, labels)):  # a fifth run had no colour, and no points
        colour = plt.cm.tab10(i % 10)
        ax.scatter([], [], s=40, color=colour, label=label)
        for r in recipe["rows"]:
            ours = r["model"].startswith("edgekit")
            ax.scatter(r["p50_ms"], r["accuracy"], s=20 + 3 * r["size_mb"], color=colour, alpha=0.7,
                       marker="o" if ours else "s")
            name = "edgekit (ONNX, TFLite)" if ours else r["model"].split(":")[0]
            text = f"{name}, {r['size_mb']:.1f} MB"
            if ours and r is next(x for x in recipe["rows"] if x["model"].startswith("edgekit")) or \
                    not ours and (text, recipe["teacher"]) not in said:
                said.add((text, recipe["teacher"]))
                # teacher and peer sit side by side: the peer's label above to its left, the teacher's below it
                xytext, ha = ((6, -10), "left") if ours else \
                    ((-8, 6), "right") if name == "peer" else ((0, -20), "center")
                ax.annotate(text, (r["p50_ms"], r["accuracy"]), fontsize=8,
                            xytext=xytext, ha=ha, textcoords="offset points")
        bound = TARGETS.get(recipe["recipe"], {}).get("retained")
        if bound:  # the accuracy target as a line: how far below it an artifact sits shows at a glance
            ax.axhline(bound * recipe["rows"][0]["accuracy"], color=colour, linestyle=":", linewidth=1)
            bounds.add(bound)
    for bound in sorted(bounds):
        ax.plot([], [], color="grey", linestyle=":", linewidth=1, label=f"target: {bound:.0%} of the teacher")
    ax.legend(loc="lower right")
    ax.set_xscale("log")
    ax.xaxis.set_major_locator(LogLocator(subs=(1, 2, 5)))  # 1 2 5 10 20 50 ms, not overlapping 3x10^0 labels
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel("p50 latency at 128 tokens, batch 1, 1 thread (ms, log)")
    ax.set_ylabel("accuracy, rt-polarity test")
    ax.set_title("Accuracy against latency (marker area ~ size; squares: teacher and peer)")
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def peer_text(peer: dict | None) -> str:
    if not peer:  # results from before the peer followed the CPU
        return "optimum-cli's avx512_vnni dynamic config"
    return f"optimum-cli's {peer['optimum_config']} dynamic config for this CPU: {peer['weights']} weights"


def kept(row: dict, key: str, bound: float = None) -> str:
    """A share kept, with its 95% interval where the run stored one (the teacher's own row has none); next to a
    target, never rounded onto its other side."""
    ci = row.get(f"{key}_ci")
    shown = gate.faithful(row[key], lambda v: v >= bound) if bound else f"{row[key]:.4f}"
    return shown + (f" ({ci[0]:.4f}-{ci[1]:.4f})" if ci and row["model"] != "teacher FP32" else "")


def verdict(check: dict) -> str:
    """One cell of the targets table: the value, met or by how much it missed, and where a 95% interval was
    measured whether the bound lies inside it (the split cannot tell the artifact from one on the bound)."""
    word = "met" if check["met"] else f"MISSED ({check['off_by']})" if check["off_by"] else "n/a"
    bound, at_most = float(check["target"].split()[-1]), " <= " in check["target"]
    actual = "n/a" if check["actual"] is None else \
        gate.faithful(check["actual"], lambda v: v <= bound if at_most else v >= bound)
    return f"{actual} {word}{gate.interval_note(check.get('interval'), bound)}"


def fmt_peaks(peaks) -> str:
    return f"{min(peaks):.0f}-{max(peaks):.0f} GOPS" if peaks else "not stored"


def markdown(result: dict, json_path: Path, plot_name: str = "results-pareto.png") -> str:
    peak = result["peak"]
    theoretical = (f", nominal at the {peak['clock_mhz']:.0f} MHz /proc/cpuinfo reports: {peak['theoretical_gops']} "
                   f"GOPS (no ceiling{': the measured peak is above it' if nominal < peak['measured_gops'] else ''})"
                   if (nominal := peak.get("theoretical_gops")) else "")
    roofline = Path(json_path).name.replace("headline", "roofline").replace(".json", ".md")  # written beside it
    lines = ["# Results: edgekit's edge recipes against their teachers and the usual INT8 path", "",
             f"Measured {result['at']} on this machine by `python bench/headline.py` (raw numbers: `{json_path}`). "
             f"Batch 1, {result['threads']} thread; latency is the median over {result['rounds']} interleaved rounds of "
             f"{result['runs_per_round']} runs, each model in a clean process. Accuracy: every sentence on its own "
             f"(as a device runs it); `kept` = accuracy / the FP32 teacher's, in parentheses its 95% paired bootstrap "
             f"interval over the split's sentences where measured. The peer is the teacher through ONNX Runtime "
             f"dynamic INT8, per-channel "
             f"({peer_text(result.get('peer'))}), run with the same session settings as edgekit's.", "",
             f"INT8 roofline: peak {peak['measured_gops']} GOPS before the runs ({peak['how']}; by shape: "
             f"{', '.join(f'{k} {v}' for k, v in peak['by_shape_gops'].items())}"
             f"); CPU: {peak.get('cpu', '?')}, INT8 instructions: "
             f"{peak.get('int8_isa') or '?'}{theoretical}. "
             f"Measured again before every latency round (per recipe: "
             f"{'; '.join(str(r['recipe']) + ' ' + fmt_peaks(r.get('peak_gops_by_round')) for r in result['recipes'])}); "
             f"`x roofline` = the median over rounds of p50 / (GEMM FLOPs at 128 tokens / that round's peak), "
             f"`roofline ms` uses the median peak (results stored before this used the single peak). "
             f"Where the time goes, op group by op group, and "
             f"the ratio the GEMMs alone leave: [bench/results/{roofline}](../bench/results/{roofline}) "
             f"(`python bench/roofline.py`).", "", f"![Pareto]({plot_name})", ""]
    for recipe in result["recipes"]:
        lines += [f"## {recipe['recipe']} (run `{Path(recipe['run']).name}`, teacher `{recipe['teacher']}`; "
                  f"{recipe['test_examples']} test sentences, "
                  f"{recipe['vader_examples']} vader-amazon)", "",
                  "| model | MB | accuracy | kept | vader-amazon | kept | p50 ms @128 | p90 ms @128 | p50 ms sentences "
                  "| x vs peer | GFLOP @128 | roofline ms | x roofline |",
                  "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for r in recipe["rows"]:
            def num(v, spec):
                return "n/a" if v is None else format(v, spec)
            bounds = TARGETS.get(recipe["recipe"], {})
            lines.append(f"| {r['model']} | {r['size_mb']:.1f} | {r['accuracy']:.4f} | "
                         f"{kept(r, 'retained', bounds.get('retained'))} | {r['vader_accuracy']:.4f} | "
                         f"{kept(r, 'vader_retained', bounds.get('vader_retained'))} | {r['p50_ms']:.2f} | "
                         f"{r['p90_ms']:.2f} | "
                         f"{r['sentences_p50_ms']:.2f} | {r['speedup_vs_peer']:.2f} | {num(r['gemm_gflop_128'], '.3f')} | "
                         f"{num(r['roofline_ms'], '.2f')} | {num(r['roofline_ratio'], '.2f')} |")
        targets = [c["target"] for c in next(iter(recipe["checks"].values()), [])]
        if targets:
            lines += ["", "| artifact | " + " | ".join(targets) + " |", "|---|" + "---|" * len(targets)]
            for artifact, found in recipe["checks"].items():
                lines.append(f"| {artifact} | " + " | ".join(verdict(c) for c in found) + " |")
            met = recipe["all_targets_met_by"]
            lines += ["", f"All targets at once: {'met by ' + ', '.join(met) if met else 'not met by any artifact'}."]
        lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    from edgekit.cli import script

    sys.exit(script(main))
