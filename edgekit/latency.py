"""Latency of one model file in a clean process (no torch imported for ONNX): p50/p90/p99 at a fixed
sequence length and batch size and on real sentences, and the process's memory after loading and at peak.

    python -m edgekit.latency MODEL --seq-len 128 --threads 1 --runs 50 [--batch 1] [--texts FILE]
    python -m edgekit.latency MODEL.onnx --synthetic 30522 ...   # random token ids: no tokenizer or sidecar
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


def timed(fn, runs: int, warmup: int) -> list:
    for _ in range(warmup):
        fn()
    ms = []
    for _ in range(runs):
        t = time.perf_counter()
        fn()
        ms.append((time.perf_counter() - t) * 1e3)
    return ms


def memory_mb(field: str) -> float:
    """VmRSS (now) or VmHWM (peak) of this process. VmHWM restarts at exec; ru_maxrss may carry the parent's."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        pass
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)


class Synthetic:
    """A bare ONNX Runtime session fed random token ids: for models without a tokenizer (random-weight configs)."""

    def __init__(self, path: str, threads: int, vocab: int):
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        sidecar = Path(path).with_name("model.json")
        meta = json.loads(sidecar.read_text()) if sidecar.is_file() else {}
        from edgekit.runtime import disabled_optimizers

        self.session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"],
                                            disabled_optimizers=disabled_optimizers(meta))
        self.vocab = vocab

    def fixed(self, batch: int, seq_len: int) -> dict:
        ids = np.random.default_rng(0).integers(5, self.vocab, (batch, seq_len), dtype=np.int64)
        return {"input_ids": ids, "attention_mask": np.ones_like(ids)}

    def logits(self, feed: dict):
        return self.session.run(None, feed)[0]


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m edgekit.latency")
    p.add_argument("model")
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--runs", type=int, default=50)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--texts", help="a file with one sentence per line")
    p.add_argument("--pairs", type=int, default=0, help="1: each line of --texts is a text pair, split by a tab")
    p.add_argument("--synthetic", type=int, metavar="VOCAB", help="random ids below VOCAB instead of a tokenizer")
    a = p.parse_args(argv)
    t = time.perf_counter()
    if a.synthetic:
        model = Synthetic(a.model, a.threads, a.synthetic)
        fixed = model.fixed(a.batch, a.seq_len)
    else:
        from edgekit import runtime

        model = runtime.load(a.model, threads=a.threads)
        fixed = model.encode(["the " * a.seq_len] * a.batch, max_length=a.seq_len)  # real ids, exactly seq_len
        if fixed["input_ids"].shape[1] != a.seq_len:
            raise SystemExit(f"the model accepts at most {fixed['input_ids'].shape[1]} tokens; lower --seq-len")
    load_s = time.perf_counter() - t
    rss_after_load = memory_mb("VmRSS")
    result = {"fixed": percentiles(timed(lambda: model.logits(fixed), a.runs, a.warmup))}
    texts = Path(a.texts).read_text().split("\n") if a.texts else []  # bench joins with \n only (a U+2028 stays)
    texts = [tuple((line.split("\t", 1) + [""])[:2]) for line in texts] if a.pairs else texts
    if texts:
        ms = []
        for text in texts[:a.runs]:
            t = time.perf_counter()
            model.logits(model.encode([text]))  # tokenization is part of the real path
            ms.append((time.perf_counter() - t) * 1e3)
        result["sentences"] = percentiles(ms)
    result.update(load_s=round(load_s, 3), rss_after_load_mb=rss_after_load, peak_rss_mb=memory_mb("VmHWM"),
                  seq_len=a.seq_len, batch=a.batch, threads=a.threads, runs=a.runs)
    json.dump(result, sys.stdout)


if __name__ == "__main__":
    main()
