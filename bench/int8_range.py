"""Full-range against 7-bit INT8 weights on this CPU, in one run.

x86 CPUs without VNNI multiply u8 x s8 with VPMADDUBSW, whose pairwise 16-bit sums saturate (255 x 127 x 2 >
32767); ONNX Runtime's quantization guide advises 7-bit weights (`reduce_range`) there, and edgekit's `x86-avx2`
target follows it. This measures both sides on the CPU it runs on:
- a probe: u8 x s8 MatMulInteger with 255 x 127 inputs, exact or saturated here;
- for each finished run's FP32 ONNX export: ONNX Runtime dynamic INT8, per-tensor and per-channel weights, full
  range and reduce_range; accuracy on the validation and test splits together and agreement with FP32, every
  sentence on its own (batch 1, as a device runs it).

    python bench/int8_range.py artifacts/distilbert-int8 artifacts/edge-small

Writes bench/results/int8-range.json and .md.
"""
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from edgekit import cli, devices, pipeline, runtime
from edgekit.artifact import Artifact, write_json, write_text
from edgekit.stages import quantize

import headline  # bench/headline.py: the same one-node MatMulInteger session its peak is measured with

VARIANTS = [(pc, rr) for pc in (False, True) for rr in (False, True)]


def main(argv=None):
    p = cli.Parser(description=cli.description(__doc__))
    p.add_argument("runs", type=Path, nargs="+", help="finished run folders with an ONNX export stage")
    p.add_argument("--out", type=Path, default=Path("bench/results"),
                   help="folder for int8-range.json and .md (default bench/results)")
    a = p.parse_args(argv)
    result = {"at": time.strftime("%Y-%m-%d %H:%M"), **devices.this_cpu(),
              "probe": saturation_probe(), "runs": [measure(run.resolve()) for run in a.runs]}
    a.out.mkdir(parents=True, exist_ok=True)
    write_json(a.out / "int8-range.json", result)
    write_text(a.out / "int8-range.md", markdown(result))
    print(markdown(result))


def saturation_probe() -> dict:
    """u8 x s8 -> s32 MatMulInteger (16 x 64 x 16) of 255s and 127s: exact is 64 x 255 x 127; saturating VPMADDUBSW
    pairs give 32 x 32767."""
    m, k, n = 16, 64, 16
    session = headline.matmul_integer(np.full((k, n), 127, np.int8), m)
    got = int(session.run(None, {"A": np.full((m, k), 255, np.uint8)})[0][0, 0])
    return {"exact": k * 255 * 127, "got": got, "saturates": got != k * 255 * 127}


def fp32_export(run: Path, manifest: dict) -> Path:
    for stage in manifest["stages"]:
        if stage["name"] == "export":
            for art in Artifact.from_json(stage["output"], run).all().values():
                if art.kind == "onnx":
                    return Path(art.path)
    sys.exit(f"int8_range: {run} has no ONNX export stage; give a run whose recipe exports ONNX")


def measure(run: Path) -> dict:
    manifest, ctx = pipeline.context_of(run)
    source = fp32_export(run, manifest)
    examples = ctx.splits.validation + ctx.splits.test
    gold = np.array([label for _, label in examples])
    reference = logits(source, examples)
    rows = [{"model": "FP32", "accuracy": round(float(np.mean(reference.argmax(-1) == gold)), 4)}]
    with tempfile.TemporaryDirectory() as tmp:
        for per_channel, reduce_range in VARIANTS:
            folder = Path(tmp) / f"pc{int(per_channel)}-rr{int(reduce_range)}"
            folder.mkdir()
            for name in ("model.json", "tokenizer.json"):
                shutil.copy(source.parent / name, folder / name)
            quantize.int8_dynamic(source, folder / "model.onnx", per_channel=per_channel, reduce_range=reduce_range)
            out = logits(folder / "model.onnx", examples)
            rows.append({"model": f"INT8 {'per-channel' if per_channel else 'per-tensor'}, "
                                  f"{'7-bit (reduce_range)' if reduce_range else 'full-range'} weights",
                         "per_channel": per_channel, "reduce_range": reduce_range,
                         "accuracy": round(float(np.mean(out.argmax(-1) == gold)), 4),
                         "agreement_with_fp32": round(float(np.mean(out.argmax(-1) == reference.argmax(-1))), 4),
                         "mean_abs_logit_diff": round(float(np.abs(out - reference).mean()), 4)})
    return {"run": run.name, "fp32": str(source), "examples": len(examples), "rows": rows}


def logits(path: Path, examples: list) -> np.ndarray:
    model = runtime.load(path)
    return np.concatenate([model.logits(model.encode([text])) for text, _ in examples])


def markdown(result: dict) -> str:
    probe = result["probe"]
    lines = ["# INT8 weights: full range against 7 bits (reduce_range) on this CPU", "",
             f"Measured {result['at']} by `python bench/int8_range.py` on {result['cpu']} "
             f"({result['int8_isa'] or 'INT8 instructions unknown'}). Probe: u8 x s8 MatMulInteger of 255s and 127s "
             f"gave {probe['got']} (exact {probe['exact']}): "
             f"{'the u8 x s8 products saturate here' if probe['saturates'] else 'exact here'}. "
             "Dynamic INT8 of each run's FP32 export (ONNX Runtime), every sentence on its own; agreement = share of "
             "sentences whose label equals FP32's.", ""]
    for r in result["runs"]:
        lines += [f"## {r['run']} ({r['examples']} sentences: validation + test)", "",
                  "| model | accuracy | agreement with FP32 | mean abs logit diff |", "|---|---:|---:|---:|"]
        lines += [f"| {row['model']} | {row['accuracy']:.4f} | {row.get('agreement_with_fp32', 1.0):.4f} | "
                  f"{row.get('mean_abs_logit_diff', 0.0):.4f} |" for row in r["rows"]]
        lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    from edgekit.cli import script

    sys.exit(script(main))
