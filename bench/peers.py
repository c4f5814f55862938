"""edgekit's final artifact against what people do today, in one run, on this machine.

For a finished run: the FP32 teacher in ONNX Runtime; ONNX Runtime dynamic INT8 of the teacher, per-channel
(what optimum-cli's dynamic quantization for this CPU does: peer_config); and edgekit's final artifact. For
each: size MB, p50/p90 latency at batch 1 on 1 thread for sequence length 128 and for the real test sentences,
accuracy on the test split (dynamic INT8 one sentence at a time, as a device runs it: edgekit.load). Writes JSON
and a markdown table.

    python bench/peers.py artifacts/distilbert-int8 [--runs 100] [--out bench/results]
"""
import sys
from pathlib import Path

from edgekit import cli, devices, pipeline, runtime
from edgekit.artifact import Artifact, size_mb, write_json, write_text
from edgekit.stages import bench, evaluate, export, quantize


def main(argv=None):
    p = cli.Parser(description=cli.description(__doc__))
    p.add_argument("run", type=Path, help="a finished run folder (with manifest.json)")
    p.add_argument("--runs", type=int, default=100,
                   help="timed runs per model per round, and real test sentences timed (default 100)")
    p.add_argument("--seq-len", type=int, default=128, help="tokens per input for the fixed-length latency "
                                                             "(default 128)")
    p.add_argument("--rounds", type=int, default=5, help="interleaved rounds; the median over rounds is reported")
    p.add_argument("--out", type=Path, default=Path("bench/results"),
                   help="folder for peers-<recipe>-<teacher>.json and .md (default bench/results)")
    a = p.parse_args(argv)
    run = a.run.resolve()
    manifest, ctx = pipeline.context_of(run)  # accuracy on the whole test split
    recipe, splits = manifest["recipe"], ctx.splits
    work = run / "peers"
    fp32, int8 = teacher_and_peer(ctx, work)
    final = Artifact.from_json(manifest["final"], run)
    texts = sentences(splits.test[:a.runs], work)
    models = (("teacher FP32 (ONNX Runtime)", fp32), ("teacher dynamic INT8 per-channel (ORT, optimum-style)", int8),
              (f"edgekit {recipe['name']} final", final))
    latencies = bench.measure_interleaved([art.path for _, art in models], rounds=a.rounds, seq_len=a.seq_len,
                                          threads=1, runs=a.runs, warmup=10, texts=texts)
    rows = []
    for (name, art), lat in zip(models, latencies):
        hits = evaluate.correct(runtime.load(art.path), splits.test, 64, True, name)
        rows.append({"model": name, "path": str(art.path), "size_mb": size_mb(art), "accuracy": sum(hits) / len(hits),
                     "right": sum(hits),
                     "latency_ms_p50_128": lat["fixed"]["p50"], "latency_ms_p90_128": lat["fixed"]["p90"],
                     "latency_ms_p50_128_by_round": lat["fixed_p50_by_round"],
                     "latency_ms_p50_sentences": lat["sentences"]["p50"], "latency_ms_p90_sentences": lat["sentences"]["p90"],
                     "peak_rss_mb": lat["peak_rss_mb"]})
    base = rows[0]
    for r in rows:
        r["speedup_128_vs_teacher_fp32"] = round(base["latency_ms_p50_128"] / r["latency_ms_p50_128"], 2)
        r["accuracy_retained"] = r["right"] / base["right"]  # from the counts, not from rounded accuracies
    result = {"run": str(run), "recipe": recipe["name"], "teacher": recipe["teacher"], "test_examples": len(splits.test),
              **devices.this_cpu(), "threads": 1, "batch": 1, "seq_len": a.seq_len,
              "runs": a.runs, "rounds": a.rounds, "peer": peer_config(), "rows": rows}
    a.out.mkdir(parents=True, exist_ok=True)
    stem = f"peers-{recipe['name']}-{Path(recipe['teacher']).name}"
    write_json(a.out / f"{stem}.json", result)
    write_json(work / "peers.json", result)  # edgekit report plots these beside the run
    table = markdown(result)
    write_text(a.out / f"{stem}.md", table)
    print(table)


def peer_config() -> dict:
    """optimum-cli's dynamic INT8 config for this CPU: avx512_vnni (s8 weights) where the CPU has VNNI or is Arm;
    avx2 (u8 weights: s8 ones saturate in VPMADDUBSW there, and cost mpnet-base's peer 32 points) on other x86."""
    isa = devices.this_cpu()["int8_isa"] or ""
    u8 = "without VNNI" in isa
    return {"optimum_config": "avx2" if u8 else "avx512_vnni", "weights": "uint8" if u8 else "int8", "int8_isa": isa}


def teacher_and_peer(ctx, work: Path) -> tuple:
    """The run's FP32 teacher in ONNX and its plain ONNX Runtime dynamic INT8, per-channel (the optimum-cli path for
    this CPU: peer_config). The teacher is exported as transformers runs it: none of edgekit's graph rewrites."""
    fp32 = export.run(ctx.teacher, work / "teacher-fp32", ctx, format="onnx", rewrites=False)
    return fp32, quantize.run(fp32, work / "teacher-int8", ctx, mode="dynamic", per_channel=True, fuse=False,
                              weights=peer_config()["weights"])


def sentences(examples: list, work: Path) -> Path:
    """The real sentences the latency runs feed, one per line."""
    texts = work / "sentences.txt"
    texts.write_text("\n".join(t.replace("\n", " ") for t, _ in examples))
    return texts


def markdown(result: dict) -> str:
    n = result.get("seq_len", 128)  # the `_128` keys hold latencies at seq_len tokens (names kept for stored results)
    lines = [f"Teacher `{result['teacher']}`, recipe `{result['recipe']}`; {result['test_examples']} test sentences; "
             f"{result.get('cpu', 'CPU not recorded')} ({result.get('int8_isa') or 'INT8 instructions not recorded'}); "
             f"batch 1, {result['threads']} thread; latency is the median over {result['rounds']} interleaved rounds of "
             f"{result['runs']} timed runs.", "",
             f"| model | size MB | accuracy | retained | p50 ms @{n} | p90 ms @{n} | p50 ms sentences | p90 ms sentences "
             f"| speed-up @{n} |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in result["rows"]:
        lines.append(f"| {r['model']} | {r['size_mb']:.1f} | {r['accuracy']:.4f} | {r['accuracy_retained']:.4f} | "
                     f"{r['latency_ms_p50_128']:.2f} | {r['latency_ms_p90_128']:.2f} | {r['latency_ms_p50_sentences']:.2f} | "
                     f"{r['latency_ms_p90_sentences']:.2f} | {r['speedup_128_vs_teacher_fp32']:.2f}x |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    from edgekit.cli import script

    sys.exit(script(main))
