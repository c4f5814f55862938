"""Every quantization edgekit offers, on one fine-tuned model, in one run: size, accuracy and latency per format.

The model is the fine-tuned teacher of a finished run (minilm-l6 on rt-polarity for distilbert-int8). It is
exported FP32 to ONNX, TFLite (buckets 32/64/128, and a fixed-128 copy) and TorchScript, then quantized in each
mode. Latency: batch 1, 1 thread, p50 at 128 tokens and on real test sentences, the median over interleaved
rounds in clean processes. Accuracy: the whole test split. Checks the targets of the quantize/export issue:

- ONNX INT8 >= 2.2x faster than ONNX FP32 at 128 tokens, accuracy drop <= 0.5 points;
- TFLite INT8 >= 2.5x faster than TFLite FP32;
- each format's INT8 artifact <= 26% of its FP32 size;
- bucketed TFLite >= 2x faster than fixed-128 TFLite on the real (short) test sentences.

    python bench/quantize.py artifacts/distilbert-int8 [--rounds 3] [--runs 50] [--out bench/results]
"""
import json
import sys
from dataclasses import replace
from pathlib import Path

from edgekit import cli, pipeline, runtime
from edgekit.artifact import Artifact, size_mb, write_json, write_text
from edgekit.stages import bench, evaluate, export, quantize

VARIANTS = (  # (name, format, quantize settings or None for FP32)
    ("ONNX FP32", "onnx", None),
    ("ONNX dynamic INT8 per-channel (edgekit default)", "onnx", {"mode": "dynamic"}),
    ("ONNX dynamic INT8 per-tensor", "onnx", {"mode": "dynamic", "per_channel": False}),
    ("ONNX dynamic INT8 on the ORT-fused graph (fuse: true)", "onnx", {"mode": "dynamic", "fuse": True}),
    ("ONNX static INT8 QDQ (minmax, 128 sentences)", "onnx", {"mode": "static"}),
    ("ONNX dynamic INT8, max_accuracy_drop 0.004 (validation)", "onnx", {"mode": "dynamic", "max_accuracy_drop": 0.004}),
    ("ONNX FP16", "onnx", {"mode": "fp16"}),
    ("TFLite FP32 (buckets 32/64/128)", "tflite", None),
    ("TFLite dynamic-range INT8", "tflite", {"mode": "dynamic"}),
    ("TFLite full-integer INT8 (128 sentences)", "tflite", {"mode": "static"}),
    ("TFLite FP16 weights", "tflite", {"mode": "fp16"}),
    ("TorchScript FP32", "torchscript", None),
    ("TorchScript dynamic INT8", "torchscript", {"mode": "dynamic"}),
)


def main(argv=None):
    p = cli.Parser(description=cli.description(__doc__))
    p.add_argument("run", type=Path, help="a finished run folder whose first stage is finetune")
    p.add_argument("--runs", type=int, default=50,
                   help="timed runs per model per round, and real test sentences timed (default 50)")
    p.add_argument("--rounds", type=int, default=3, help="interleaved latency rounds (the median is kept; default 3)")
    p.add_argument("--out", type=Path, default=Path("bench/results"),
                   help="folder for quantize.json and .md (default bench/results)")
    p.add_argument("--reuse", action="store_true", help="reuse the FP32 exports a previous run left in RUN/bench-quantize")
    p.add_argument("--render", action="store_true", help="recompute ratios and checks from OUT/quantize.json, no runs")
    a = p.parse_args(argv)
    if a.render:
        return write(summarize(json.loads((a.out / "quantize.json").read_text())), a.out)
    run = a.run.resolve()
    manifest, ctx = pipeline.context_of(run)
    if manifest["recipe"]["max_length"] < 128:  # said now, not after the pruning and exports it would take
        p.error(f"{a.run} was made with max_length {manifest['recipe']['max_length']}; this benchmark times 128 "
                f"tokens: give a run made with max_length >= 128")
    work = run / "bench-quantize"
    fp32 = {f: exported(ctx, work / f"fp32-{f}", f, a.reuse) for f in ("onnx", "tflite", "torchscript")}
    fixed = exported(ctx, work / "fp32-tflite-fixed128", "tflite", a.reuse, buckets=[128])
    models = []
    for name, fmt, settings in VARIANTS:
        if settings is None:
            models.append((name, fmt, fp32[fmt]))
            continue
        slug = f"{fmt}-{settings['mode']}" + "".join(f"-{k}" for k in settings if k != "mode")
        print(f"quantize: {name}", file=sys.stderr, flush=True)
        models.append((name, fmt, quantize.run(fp32[fmt], work / slug, replace(ctx, targets=["x86"]), **settings)))
    models.append(("TFLite FP32 fixed at 128 tokens", "tflite", fixed))
    texts = work / "sentences.txt"
    texts.write_text("\n".join(t.replace("\n", " ") for t, _ in ctx.splits.test[:a.runs]))
    latencies = bench.measure_interleaved([m.path for _, _, m in models], rounds=a.rounds, seq_len=128, threads=1,
                                          runs=a.runs, warmup=5, texts=texts)
    rows = []
    for (name, fmt, m), lat in zip(models, latencies):
        acc = evaluate.accuracy(runtime.load(m.path), ctx.splits.test, 1, True, name[:40])
        rows.append({"model": name, "format": fmt, "path": str(m.path), "size_mb": size_mb(m), "accuracy": acc,
                     "quantization": m.metrics.get("quantization"), "label_agreement_vs_fp32": m.metrics.get("label_agreement"),
                     "latency_ms_p50_128": lat["fixed"]["p50"], "latency_ms_p90_128": lat["fixed"]["p90"],
                     "latency_ms_p50_sentences": lat["sentences"]["p50"], "p50_128_by_round": lat["fixed_p50_by_round"]})
    result = {"run": str(run), "model": f"{manifest['recipe']['teacher']} fine-tuned ({inside(ctx.teacher.path, run)})",
              "test_examples": len(ctx.splits.test), "threads": 1, "batch": 1, "runs": a.runs, "rounds": a.rounds,
              "rows": rows}
    write(summarize(result), a.out)


def summarize(result: dict) -> dict:
    """Ratios and checks from the stored measurements. A speed-up is the median over rounds of the per-round
    ratio (FP32 and INT8 measured back to back in each round): this VM's speed drifts by up to 35% between
    rounds, which moves both models of a round alike."""
    import statistics

    rows = result["rows"]
    by = {r["model"]: r for r in rows}
    for r in rows:
        base = by[next(n for n, f, s in VARIANTS if f == r["format"] and s is None)]
        r["speedup_by_round"] = [round(b / x, 2) for b, x in zip(base["p50_128_by_round"], r["p50_128_by_round"])]
        r["speedup_vs_fp32_same_format"] = round(statistics.median(r["speedup_by_round"]), 2)
        r["size_vs_fp32"] = round(r["size_mb"] / base["size_mb"], 4)
        r["accuracy_drop_points"] = round(100 * (base["accuracy"] - r["accuracy"]), 2)
    onnx8, tfl8 = by[VARIANTS[1][0]], by[VARIANTS[8][0]]
    tfl_fp32, tfl_fixed = by[VARIANTS[7][0]], by["TFLite FP32 fixed at 128 tokens"]
    int8_rows = [onnx8, tfl8, by[VARIANTS[12][0]]]
    aware, static = by[VARIANTS[5][0]], by[VARIANTS[4][0]]
    tensor8 = by[VARIANTS[2][0]]
    checks = [
        ("ONNX INT8 per-channel speed-up vs ONNX FP32 @128", onnx8["speedup_vs_fp32_same_format"], ">=", 2.2),
        ("ONNX INT8 per-channel accuracy drop (points)", onnx8["accuracy_drop_points"], "<=", 0.5),
        ("ONNX INT8 per-tensor speed-up vs ONNX FP32 @128", tensor8["speedup_vs_fp32_same_format"], ">=", 2.2),
        ("ONNX INT8 per-tensor accuracy drop (points)", tensor8["accuracy_drop_points"], "<=", 0.5),
        ("ONNX static INT8 speed-up vs ONNX FP32 @128", static["speedup_vs_fp32_same_format"], ">=", 2.2),
        ("ONNX static INT8 accuracy drop (points)", static["accuracy_drop_points"], "<=", 0.5),
        ("ONNX accuracy-aware INT8 speed-up vs ONNX FP32 @128", aware["speedup_vs_fp32_same_format"], ">=", 2.2),
        ("ONNX accuracy-aware INT8 accuracy drop (points)", aware["accuracy_drop_points"], "<=", 0.5),
        ("TFLite INT8 speed-up vs TFLite FP32 @128", tfl8["speedup_vs_fp32_same_format"], ">=", 2.5),
        *[(f"{r['model']}: size vs its FP32", r["size_vs_fp32"], "<=", 0.26) for r in int8_rows],
        ("bucketed TFLite vs fixed-128 on real sentences",
         round(tfl_fixed["latency_ms_p50_sentences"] / tfl_fp32["latency_ms_p50_sentences"], 2), ">=", 2.0),
    ]
    result["checks"] = [{"check": c, "actual": v, "op": op, "target": t, "met": v >= t if op == ">=" else v <= t}
                        for c, v, op, t in checks]
    return result


def write(result: dict, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "quantize.json", result)
    table = markdown(result)
    write_text(out / "quantize.md", table)
    print(table)


def exported(ctx, folder: Path, fmt: str, reuse: bool, **options):
    """The FP32 export (checked against PyTorch), or with --reuse the one a previous run of this script left."""
    path = folder / quantize.FILES[fmt]
    if reuse and path.is_file() and (folder / "model.json").is_file():
        return Artifact(path, fmt, {"params": None})
    return export.run(ctx.teacher, folder, ctx, format=fmt, **options)


def markdown(result: dict) -> str:
    lines = [f"Model: {result['model']}; {result['test_examples']} test sentences; batch 1, 1 thread; latency is the "
             f"median over {result['rounds']} interleaved rounds of {result['runs']} runs; speed-up: the median of the per-round "
             f"ratios.", "",
             "| artifact | size MB | vs FP32 size | accuracy | drop (pts) | p50 ms @128 | p90 ms @128 | p50 ms sentences "
             "| speed-up vs FP32 | per round |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in result["rows"]:
        lines.append(f"| {r['model']} | {r['size_mb']:.1f} | {r['size_vs_fp32']:.1%} | {r['accuracy']:.4f} | "
                     f"{r['accuracy_drop_points']:.2f} | {r['latency_ms_p50_128']:.2f} | {r['latency_ms_p90_128']:.2f} | "
                     f"{r['latency_ms_p50_sentences']:.2f} | {r['speedup_vs_fp32_same_format']:.2f}x | "
                     f"{' '.join(f'{x:.2f}' for x in r['speedup_by_round'])} |")
    lines += ["", "| target | actual | bound | met |", "|---|---:|---:|---|"]
    lines += [f"| {c['check']} | {c['actual']:g} | {c['op']} {c['target']:g} | {'yes' if c['met'] else 'NO'} |"
              for c in result["checks"]]
    return "\n".join(lines) + "\n"


def inside(path, run: Path) -> str:
    """A path in the run as RUN-NAME/..., not this machine's absolute path (the markdown is committed)."""
    try:
        return str(Path(run.name) / Path(path).relative_to(run))
    except ValueError:
        return str(path)


if __name__ == "__main__":
    from edgekit.cli import script

    sys.exit(script(main))

