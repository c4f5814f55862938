"""Pruning against the unpruned model, in one run, on this machine.

From a finished run's fine-tuned teacher (minilm-l6 on rt-polarity): prune half the heads and half the FFN
neurons (gradient importance, iterative, KD recovery), then also prune the vocabulary to the tokens of the
training set. For each: accuracy on the test split, FP32 ONNX latency at sequence length 128 (batch 1,
1 thread), INT8 ONNX size; and how many test tokens fall outside the kept vocabulary.

    python bench/prune.py artifacts/distilbert-int8 [--recover-epochs 1] [--out bench/results]
"""
import sys
from pathlib import Path

from edgekit import cli, data, families, pipeline, report, runtime
from edgekit.artifact import Artifact, size_mb, write_json, write_text
from edgekit.stages import bench, evaluate, export, prune, quantize


def measure(name: str, hf: Artifact, work: Path, ctx) -> dict:
    fp32 = export.run(hf, work / name / "fp32", ctx)
    int8 = quantize.run(fp32, work / name / "int8", ctx)
    return {"model": name, "params": fp32.metrics["params"], "fp32_size_mb": size_mb(fp32), "int8_size_mb": size_mb(int8),
            "fp32_path": str(fp32.path),
            "accuracy_fp32": evaluate.accuracy(runtime.load(fp32.path), ctx.splits.test, 64, True, name),
            "accuracy_int8": evaluate.accuracy(runtime.load(int8.path), ctx.splits.test, 64, True, name + " int8")}


def main(argv=None):
    p = cli.Parser(description=cli.description(__doc__))
    p.add_argument("run", type=Path, help="a finished run folder whose teacher is pruned (artifacts/distilbert-int8)")
    p.add_argument("--heads-keep", type=float, default=0.5, help="fraction of attention heads kept (default 0.5)")
    p.add_argument("--ffn-keep", type=float, default=0.5, help="fraction of FFN neurons kept (default 0.5)")
    p.add_argument("--steps", type=int, default=2, help="pruning steps, each followed by recovery (default 2)")
    p.add_argument("--recover-epochs", type=float, default=1.0,
                   help="knowledge-distillation recovery epochs (default 1)")
    p.add_argument("--out", type=Path, default=Path("bench/results"),
                   help="folder for prune.json, prune.md and prune-heads.png (default bench/results)")
    a = p.parse_args(argv)
    run = a.run.resolve()
    manifest, ctx = pipeline.context_of(run)
    if manifest["recipe"]["max_length"] < 128:  # said now, not after the pruning and exports it would take
        p.error(f"{a.run} was made with max_length {manifest['recipe']['max_length']}; this benchmark times 128 "
                f"tokens: give a run made with max_length >= 128")
    recipe, splits, teacher = manifest["recipe"], ctx.splits, ctx.teacher
    work = run / "bench-prune"
    settings = dict(heads_keep=a.heads_keep, ffn_keep=a.ffn_keep, steps=a.steps, recover_epochs=a.recover_epochs,
                    lr=1e-4, importance="gradient")
    pruned = prune.run(teacher, work / "pruned", ctx, **settings)
    vocab = prune.run(pruned, work / "pruned-vocab", ctx, vocab=True)
    rows = [measure("teacher", teacher, work, ctx), measure("heads+ffn pruned", pruned, work, ctx),
            measure("heads+ffn+vocab pruned", vocab, work, ctx)]
    latencies = bench.measure_interleaved([r["fp32_path"] for r in rows], rounds=5, seq_len=128, threads=1, runs=50,
                                          warmup=10)
    for r, lat in zip(rows, latencies):
        r["fp32_latency_ms_p50_128"] = lat["fixed"]["p50"]
    tok = families.load_tokenizer(teacher.path)
    kept = {i for ids, _ in data.encode(tok, splits.train, recipe["max_length"]) for i in ids}  # what prune kept
    test_ids = [i for ids, _ in data.encode(tok, splits.test, recipe["max_length"]) for i in ids]
    unseen = sum(i not in kept and i != tok.unk_token_id for i in test_ids) / len(test_ids)
    base, cut, small = rows
    result = {"run": str(run), "settings": settings, "heads_kept": pruned.metrics["heads_kept"],
              "ffn_kept": pruned.metrics["ffn_kept"], "vocab_kept": vocab.metrics["vocab_kept"],
              "test_tokens_outside_kept_vocab": round(unseen, 4), "rows": rows,
              "speedup_fp32_128": round(base["fp32_latency_ms_p50_128"] / cut["fp32_latency_ms_p50_128"], 2),
              "accuracy_kept_fp32": round(cut["accuracy_fp32"] / base["accuracy_fp32"], 4),
              "vocab_int8_size_cut": round(1 - small["int8_size_mb"] / cut["int8_size_mb"], 4),
              "vocab_int8_accuracy_points_lost": round(100 * (cut["accuracy_int8"] - small["accuracy_int8"]), 2)}
    a.out.mkdir(parents=True, exist_ok=True)
    write_json(a.out / "prune.json", result)
    report.plot_heads(pruned.metrics["heads_kept"], a.out / "prune-heads.png")
    lines = ["| model | params | FP32 MB | INT8 MB | FP32 p50 ms @128 | accuracy FP32 | accuracy INT8 |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    lines += [f"| {r['model']} | {r['params'] / 1e6:.1f}M | {r['fp32_size_mb']:.1f} | {r['int8_size_mb']:.1f} | "
              f"{r['fp32_latency_ms_p50_128']:.2f} | {r['accuracy_fp32']:.4f} | {r['accuracy_int8']:.4f} |" for r in rows]
    lines += ["", f"speed-up (FP32, 128 tokens): {result['speedup_fp32_128']}x; accuracy kept: "
              f"{result['accuracy_kept_fp32']:.1%}; vocabulary pruning: INT8 size -{result['vocab_int8_size_cut']:.1%}, "
              f"{result['vocab_int8_accuracy_points_lost']} points lost, {result['test_tokens_outside_kept_vocab']:.2%} "
              f"of test tokens outside the kept vocabulary ({result['vocab_kept']} tokens kept)"]
    write_text(a.out / "prune.md", "\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    from edgekit.cli import script

    sys.exit(script(main))
