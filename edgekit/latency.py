"""Latency of one model file in a clean process (no torch imported for ONNX): p50/p90/p99 at a fixed
sequence length and on real sentences, batch 1, and the process's peak RSS.

    python -m edgekit.latency MODEL --seq-len 128 --threads 1 --runs 50 [--texts FILE]
"""
import argparse
import json
import resource
import sys
import time
from pathlib import Path

import numpy as np


def percentiles(ms: list) -> dict:
    a = np.array(ms)
    return {"p50": round(float(np.percentile(a, 50)), 3), "p90": round(float(np.percentile(a, 90)), 3),
            "p99": round(float(np.percentile(a, 99)), 3)}


def measure(model, seq_len: int, runs: int, warmup: int, texts: list) -> dict:
    fixed = model.encode(["the " * seq_len], max_length=seq_len)  # real token ids, exactly seq_len of them
    if fixed["input_ids"].shape[1] != seq_len:
        raise SystemExit(f"the model accepts at most {fixed['input_ids'].shape[1]} tokens; lower --seq-len")
    for _ in range(warmup):
        model.logits(fixed)
    ms = []
    for _ in range(runs):
        t = time.perf_counter()
        model.logits(fixed)
        ms.append((time.perf_counter() - t) * 1e3)
    result = {"fixed": percentiles(ms)}
    if texts:
        ms = []
        for text in texts[:runs]:
            t = time.perf_counter()
            model.logits(model.encode([text]))  # tokenization is part of the real path
            ms.append((time.perf_counter() - t) * 1e3)
        result["sentences"] = percentiles(ms)
    return result


def peak_rss_mb() -> float:
    """This process's peak resident memory. VmHWM restarts at exec; ru_maxrss may carry the parent's peak."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        pass
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m edgekit.latency")
    p.add_argument("model")
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--runs", type=int, default=50)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--texts", help="a file with one sentence per line")
    a = p.parse_args(argv)
    from edgekit import runtime

    t = time.perf_counter()
    model = runtime.load(a.model, threads=a.threads)
    load_s = time.perf_counter() - t
    texts = Path(a.texts).read_text().splitlines() if a.texts else []
    result = measure(model, a.seq_len, a.runs, a.warmup, texts)
    result.update(load_s=round(load_s, 3), peak_rss_mb=peak_rss_mb(),
                  seq_len=a.seq_len, threads=a.threads, runs=a.runs)
    json.dump(result, sys.stdout)


if __name__ == "__main__":
    main()
