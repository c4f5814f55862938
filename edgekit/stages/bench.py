"""bench: latency percentiles at a fixed sequence length and on real test sentences, batch 1, and peak
memory, measured in a separate clean process on this machine."""
import json
import subprocess
import sys
from pathlib import Path

from edgekit import devices
from edgekit.artifact import Artifact, size_mb
from edgekit.errors import EdgekitError


LIMITS = {"seq_len": "[2, 512]", "threads": "[1, inf)", "runs": "[1, inf)", "warmup": "[0, inf)"}  # runs, not a share


def run(artifact: Artifact, out_dir: Path, ctx, *, seq_len: int = 128, threads: int = 1, runs: int = 50,
        warmup: int = 10) -> Artifact:
    out_dir.mkdir(parents=True, exist_ok=True)
    texts = out_dir / "sentences.txt"
    texts.write_text("\n".join("\t".join(s.replace("\n", " ").replace("\t", " ") for s in t) if ctx.splits.pairs
                               else t.replace("\n", " ") for t, _ in ctx.splits.test[:runs]))  # a pair: tab between
    try:  # which CPU measured: INT8 latencies compare only between CPUs with the same INT8 instructions
        where = {f"bench_{k}": v for k, v in devices.this_cpu().items()}
    except EdgekitError:  # a wheel install without device_bench: the latency, without the CPU's name
        where = {}
    measured, results = {}, {}
    for name, a in artifact.all().items():  # every target's artifact, when there are several
        file = Path(a.path).stat()  # one file under two targets' names (quantize hard-links a shared one): timed
        key = (file.st_dev, file.st_ino)  # once, so it has one latency and one verdict, not two runs' noise
        if key not in results:
            results[key] = measure(a.path, seq_len=seq_len, threads=threads, runs=runs, warmup=warmup, texts=texts,
                                   **({"pairs": 1} if ctx.splits.pairs else {}))
        result = results[key]
        measured[name] = {"latency_ms_p50": result["fixed"]["p50"], "latency_ms_p90": result["fixed"]["p90"],
                          "latency_ms_p99": result["fixed"]["p99"], "sentence_latency_ms_p50": result["sentences"]["p50"],
                          "peak_rss_mb": result["peak_rss_mb"], "load_s": result["load_s"], "bench_seq_len": seq_len,
                          "bench_threads": threads, **where, "size_mb": size_mb(a), "raw": result}
    (out_dir / "latency.json").write_text(json.dumps({n: m.pop("raw") for n, m in measured.items()}, indent=2))
    outputs = {name: Artifact(a.path, a.kind, {**a.metrics, **measured[name]}) for name, a in artifact.outputs.items()}
    return Artifact(artifact.path, artifact.kind, {**artifact.metrics, **next(iter(measured.values()))}, outputs)


def measure(model_path, **options) -> dict:
    cmd = [sys.executable, "-m", "edgekit.latency", str(model_path)]
    for key, value in options.items():
        cmd += [f"--{key.replace('_', '-')}", str(value)]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise EdgekitError(f"latency measurement of {model_path} failed: {last}")
    return json.loads(done.stdout)


def measure_interleaved(model_paths: list, rounds: int = 5, before_round=None, **options) -> list:
    """Measure several models in alternation, `rounds` times, and keep the median of each metric over rounds:
    a busy neighbour or a frequency change then hits every model alike instead of one of them. `before_round`
    (no arguments) runs at the start of every round: a reference measured under the same conditions."""
    import statistics

    runs = [[] for _ in model_paths]
    for _ in range(rounds):
        if before_round is not None:
            before_round()
        for i, path in enumerate(model_paths):
            runs[i].append(measure(path, **options))
    merged = []
    for results in runs:
        out = dict(results[0])
        for part in ("fixed", "sentences"):
            if part in out:
                out[part] = {k: round(statistics.median(r[part][k] for r in results), 3) for k in out[part]}
        out["fixed_p50_by_round"] = [r["fixed"]["p50"] for r in results]
        out["peak_rss_mb"] = max(r["peak_rss_mb"] for r in results)
        merged.append(out)
    return merged
