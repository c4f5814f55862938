"""What edgekit's `deberta_attention` export rewrite buys: DeBERTa-v3 shapes (random weights) exported to ONNX and
TFLite as transformers writes them (`export.rewrites: false`) and with the rewrites, each in FP32 and dynamic INT8,
set side by side in one run on this machine.

For each shape and file: size, the largest logit difference from the plain FP32 file of the same format on random
ids (ONNX: 16, 64 and 128 tokens with a padded row; TFLite: its 128-token signature; the rewrite is exact up to
float rounding: FP32 should read about 1e-5), and p50 at 1 x 128 tokens on 1 thread over interleaved rounds (the
order reversed every other round), as a ratio to the plain file of the same format and precision in the same round.

    python bench/deberta_export.py [--shapes xsmall small] [--formats onnx tflite] [--rounds 5]
                                   [--runs-per-round 50] [--vocab 128100]

Writes bench/results/deberta-export.json and .md (or --out PATH.json and PATH.md).
"""
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from tqdm import tqdm

from edgekit import cli, devices, families, latency, native, testing
from edgekit.stages import export, quantize

import roofline  # bench/roofline.py: the timing session and p50

SHAPES = {"xsmall": {"num_hidden_layers": 12, "hidden_size": 384, "num_attention_heads": 6, "intermediate_size": 1536},
          "small": {"num_hidden_layers": 6, "hidden_size": 768, "num_attention_heads": 12, "intermediate_size": 3072}}
V3 = {"max_position_embeddings": 512, "relative_attention": True, "position_buckets": 256, "norm_rel_ebd": "layer_norm",
      "share_att_key": True, "pos_att_type": ["p2c", "c2p"], "layer_norm_eps": 1e-7, "pad_token_id": 0,
      "max_relative_positions": -1, "position_biased_input": False, "type_vocab_size": 0, "num_labels": 2}


def build(shape: str, vocab: int):
    import torch
    from transformers import AutoConfig, AutoModelForSequenceClassification

    torch.manual_seed(0)
    config = AutoConfig.for_model("deberta-v2", vocab_size=vocab, **SHAPES[shape], **V3)
    with families.quiet_transformers():
        model = AutoModelForSequenceClassification.from_config(config).eval()
    with torch.no_grad():  # wider than transformers' init (std 0.02), whose logits hardly vary with the input
        for name, weight in model.named_parameters():
            if "LayerNorm" not in name:
                weight.normal_(0.0, 2.0 / weight.shape[-1] ** 0.5 if weight.dim() > 1 else 0.1)
    return model


def files(shape: str, fmt: str, vocab: int, work: Path) -> dict:
    """{plain|rewritten: {fp32|int8: file}} of one shape and format, with their model.json and tokenizer.json."""
    model, tokenizer = build(shape, vocab), testing.tiny_unigram("deberta-v2")
    out, name_of = {}, {"onnx": "model.onnx", "tflite": "model.tflite"}[fmt]
    for name, rewrites in (("plain", False), ("rewritten", True)):
        folder = work / shape / fmt / name
        with native.hidden_output():  # TensorFlow's banners
            fp32 = export.export_one(model, tokenizer, folder / "fp32", fmt, "x86", "torchscript", 17, [128], 128,
                                     "bench", rewrites).path
        int8 = folder / "int8" / name_of
        int8.parent.mkdir()
        for side in ("model.json", "tokenizer.json"):
            shutil.copy(fp32.parent / side, int8.parent / side)
        with quantize.quiet(), native.hidden_output():  # the quantizers' logs of each tensor they leave float
            if fmt == "onnx":
                quantize.int8_dynamic(fp32, int8)
            else:
                quantize.tflite_quantize(fp32, int8, "dynamic", [], json.loads((fp32.parent / "model.json").read_text()))
        out[name] = {"fp32": fp32, "int8": int8}
    return out


def runner(path: Path):
    """logits(ids, mask) of an .onnx (one session, 1 thread) or .tflite file (its 128-token signature)."""
    if path.suffix == ".onnx":
        sess = roofline.session(path)
        return lambda ids, mask: sess.run(None, {"input_ids": ids, "attention_mask": mask})[0]
    from ai_edge_litert.interpreter import Interpreter

    run = Interpreter(str(path), num_threads=1).get_signature_runner("seq128")
    return lambda ids, mask: next(iter(run(args_0=ids.astype(np.int32), args_1=mask.astype(np.int32)).values()))


def largest_difference(reference: Path, candidate: Path, vocab: int) -> float:
    a, b = runner(reference), runner(candidate)
    rng, diff = np.random.default_rng(0), 0.0
    for length in (16, 64, 128) if reference.suffix == ".onnx" else (128,):
        ids = rng.integers(5, vocab, (2, length))
        mask = np.ones_like(ids)
        mask[1, length // 2:] = 0  # a padded row
        for row in range(2):  # TFLite signatures take batch 1
            diff = max(diff, float(np.abs(a(ids[row:row + 1], mask[row:row + 1]) -
                                          b(ids[row:row + 1], mask[row:row + 1])).max()))
    return diff


def p50_ms(path: Path, timed: int) -> float:
    logits = runner(path)
    ids, mask = np.full((1, 128), 5, np.int64), np.ones((1, 128), np.int64)
    return float(np.median(latency.timed(lambda: logits(ids, mask), timed, warmup=5)))


def main(argv=None):
    p = cli.Parser(description=cli.description(__doc__))
    p.add_argument("--shapes", nargs="+", choices=sorted(SHAPES), default=["xsmall", "small"],
                   help="DeBERTa-v3 shapes: xsmall (12 x 384), small (6 x 768); default both")
    p.add_argument("--formats", nargs="+", choices=["onnx", "tflite"], default=["onnx", "tflite"],
                   help="export formats (default both)")
    p.add_argument("--rounds", type=int, default=5, help="interleaved latency rounds (default 5)")
    p.add_argument("--runs-per-round", dest="timed", type=int, default=50,
                   help="timed runs per file per round (default 50)")
    p.add_argument("--vocab", type=int, default=128100,
                   help="vocabulary rows (default 128100, v3's); latency does not depend on it, size does")
    p.add_argument("--out", type=Path, default=Path("bench/results/deberta-export.json"),
                   help="the result JSON, its .md beside it (default bench/results/deberta-export.json)")
    args = p.parse_args(argv)
    if args.rounds < 1 or args.timed < 1 or args.vocab < 100:
        sys.exit("bench/deberta_export.py: give --rounds >= 1, --runs-per-round >= 1 and --vocab >= 100")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for shape, fmt in tqdm([(s, f) for s in args.shapes for f in args.formats], desc="export", unit="file set"):
            made = files(shape, fmt, args.vocab, Path(tmp))
            for precision in ("fp32", "int8"):
                paths = [made["plain"][precision], made["rewritten"][precision]]
                times = roofline.interleaved(lambda i: p50_ms(paths[i], args.timed), 2, args.rounds)
                for i, name in enumerate(("plain", "rewritten")):
                    rows.append({"shape": shape, "format": fmt, "export": name, "precision": precision,
                                 "size_mb": round(paths[i].stat().st_size / 1e6, 3),
                                 "max_abs_diff_vs_plain_fp32": round(largest_difference(
                                     made["plain"]["fp32"], paths[i], args.vocab), 6),
                                 **roofline.latency_fields(times[i], times[0], "ratio_to_plain")})
    roofline.save(args.out, {"measured": time.strftime("%Y-%m-%d %H:%M"), **devices.this_cpu(), "rounds": args.rounds,
                             "runs_per_round": args.timed, "vocab": args.vocab, "rows": rows, "json": str(args.out)},
                  markdown)


def markdown(result: dict) -> str:
    lines = ["# DeBERTa-v3 exports: plain and with `deberta_attention`", "",
             f"Measured {result['measured']} by `python bench/deberta_export.py` on {result['cpu']} "
             f"({result['int8_isa'] or 'INT8 instructions not recorded'}; raw: `{result['json']}`). Random weights, "
             f"{result['vocab']} vocabulary rows. p50: 1 x 128 tokens, 1 thread, median of {result['rounds']} "
             f"interleaved rounds of {result['runs_per_round']} runs; `x plain`: the median per-round ratio to the "
             f"plain file of the same format and precision; `max diff`: the largest logit difference from the plain "
             f"FP32 file of the same format.",
             "", "| shape | format | export | precision | MB | max diff | p50 ms (rounds' range) | x plain |",
             "|---|---|---|---|---:|---:|---|---:|"]
    for r in result["rows"]:
        times = r["p50_ms_by_round"]
        lines.append(f"| {r['shape']} | {r['format']} | {r['export']} | {r['precision']} | {r['size_mb']:.1f} "
                     f"| {r['max_abs_diff_vs_plain_fp32']:.2g} | {r['p50_ms']:.2f} ({min(times):.2f}-{max(times):.2f}) "
                     f"| {r['ratio_to_plain']:.2f} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    from edgekit.cli import script

    sys.exit(script(main))
