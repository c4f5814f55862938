"""Which pruned width meets the latency target: runs of one recipe that differ only in the prune stage's heads,
FFN neurons and hidden width (each re-run from the same distilled student), set side by side in one run on this
machine.

For each run: heads x FFN neurons per layer and the residual stream's width, GEMM GFLOP at 128 tokens, the pruned
model's FP32 accuracy on the validation split (what a choice between widths may be made on), on test and on
vader-amazon, the INT8 x86 ONNX file's accuracy kept on test (the run's own evaluate stage), and its p50 at 1 x 128
tokens on 1 thread in interleaved rounds (the order reversed every other round), as a ratio to the first run's p50
in the same round.

    python bench/shapes.py artifacts/es-aug-h3f384 artifacts/es-r-3x256 ... [--rounds 7] [--runs-per-round 200]

Writes bench/results/shapes.json and .md (or --out PATH.json and PATH.md).
"""
import json
import sys
import time
from pathlib import Path

from tqdm import tqdm

from edgekit import cli, data, devices, runtime
from edgekit.errors import EdgekitError
from edgekit.stages.evaluate import accuracy

import headline  # bench/headline.py: GEMM FLOPs
import roofline  # bench/roofline.py: the timing session and p50

FINAL = "05-quantize/x86-onnx/model.onnx"


def describe(run: Path, splits, ood: list) -> dict:
    for part in ("03-prune/model/config.json", "04-export/onnx/model.onnx", FINAL, "06-evaluate/metrics.json"):
        if not (run / part).is_file():
            raise EdgekitError(f"{run}: no {part}; give run folders whose prune, export, quantize and evaluate "
                               f"stages have finished")
    config = json.loads((run / "03-prune/model/config.json").read_text())
    shapes = config["edgekit_shapes"]
    kept = json.loads((run / "06-evaluate/metrics.json").read_text())["x86-onnx"]
    model = runtime.load(run / "03-prune/model")
    fp32 = {k: accuracy(model, ex, 64, False, k) for k, ex in
            (("validation", splits.validation), ("test", splits.test), ("vader_amazon", ood))}
    return {"run": str(run), "heads": shapes["heads"], "ffn": shapes["ffn"],
            "hidden": shapes.get("hidden", config["hidden_size"]),
            "gemm_gflop_128": round(headline.gemm_flops(run / "04-export/onnx/model.onnx") / 1e9, 3),
            "fp32": fp32, "int8_test": kept["accuracy"], "kept_test": kept["accuracy_retained"],
            "kept_test_interval": kept["accuracy_retained_interval"]}


def main(argv=None):
    p = cli.Parser(description=cli.description(__doc__))
    p.add_argument("runs", nargs="+", type=Path, help="run folders; the first is the baseline of the ratios")
    p.add_argument("--rounds", type=int, default=7, help="interleaved latency rounds, the order reversed every other "
                                                        "one (default 7)")
    p.add_argument("--runs-per-round", dest="timed", type=int, default=200,
                   help="timed runs per model per round (default 200)")
    p.add_argument("--out", type=Path, default=Path("bench/results/shapes.json"),
                   help="the result JSON, its .md beside it (default bench/results/shapes.json)")
    args = p.parse_args(argv)
    if len(args.runs) < 2 or args.rounds < 1 or args.timed < 1:
        sys.exit("bench/shapes.py: give at least two run folders, --rounds >= 1 and --runs-per-round >= 1")
    try:
        splits = data.load("rt-polarity")
        ood = data.out_of_domain(splits.labels)
        rows = [describe(r, splits, ood) for r in tqdm(args.runs, desc="accuracy", unit="run")]
    except EdgekitError as e:
        sys.exit(f"bench/shapes.py: {e}")
    p50 = roofline.interleaved(lambda i: roofline.p50_ms(roofline.session(Path(rows[i]["run"]) / FINAL), args.timed),
                               len(rows), args.rounds, desc="rounds")
    for row, times in zip(rows, p50):
        row.update(roofline.latency_fields(times, p50[0], "ratio_to_first"))
    roofline.save(args.out, {"measured": time.strftime("%Y-%m-%d %H:%M"), **devices.this_cpu(), "rounds": args.rounds,
                             "runs_per_round": args.timed, "rows": rows, "json": str(args.out)}, markdown)


def markdown(result: dict) -> str:
    lines = ["# Pruned widths side by side", "",
             f"Measured {result['measured']} by `python bench/shapes.py` on {result['cpu']} "
             f"({result['int8_isa'] or 'INT8 instructions not recorded'}; raw: `{result['json']}`). FP32 columns: "
             f"the pruned model before export; `INT8 test (kept)`: the run's x86 ONNX file in its evaluate stage. "
             f"p50: 1 x 128 tokens, 1 thread, median of {result['rounds']} interleaved rounds of "
             f"{result['runs_per_round']} runs; `x first`: the median per-round ratio to the first row.", "",
             "| run | heads x FFN | hidden | GEMM GFLOP | validation FP32 | test FP32 | vader-amazon FP32 "
             "| INT8 test (kept) | p50 ms (rounds' range) | x first |",
             "|---|---|---:|---:|---:|---:|---:|---|---|---:|"]
    for r in result["rows"]:
        shape = f"{r['heads'][0]} x {r['ffn'][0]}" if len(set(r["heads"])) == len(set(r["ffn"])) == 1 \
            else f"{r['heads']} x {r['ffn']}"
        times = r["p50_ms_by_round"]
        lines.append(f"| {Path(r['run']).name} | {shape} | {r.get('hidden', '?')} | {r['gemm_gflop_128']:.3f} "
                     f"| {r['fp32']['validation']:.4f} | {r['fp32']['test']:.4f} | {r['fp32']['vader_amazon']:.4f} "
                     f"| {r['int8_test']:.4f} "
                     f"({r['kept_test']:.1%}) | {r['p50_ms']:.2f} ({min(times):.2f}-{max(times):.2f}) "
                     f"| {r['ratio_to_first']:.2f} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    from edgekit.cli import script

    sys.exit(script(main))
