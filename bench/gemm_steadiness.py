"""Is this core's INT8 GEMM speed steady? One GEMM called back to back for a few seconds, per engine.

bench/headline.py's roofline divides by a measured peak; on a shared VM the same GEMM can run at two speeds that
switch every fraction of a second (another tenant on the same physical core), and then a peak and a p50 measured
a second apart need not see the same machine. This times one 512x1024x1024 INT8 GEMM in ONNX Runtime
(MatMulInteger) and in LiteRT's XNNPACK (dynamic-range FULLY_CONNECTED), the same sessions the peak uses, back to
back on one thread, and reports the median GOPS of each window of consecutive calls: a steady core gives windows
within a few percent of each other; `spread` = fastest window / slowest.

    python bench/gemm_steadiness.py [--seconds 4] [--window 100]

Writes bench/results/gemm-steadiness.json and .md.
"""
import sys
import time
from pathlib import Path

import numpy as np

from edgekit import cli, devices
from edgekit.artifact import write_json, write_text

import headline  # bench/headline.py: the same GEMM sessions its peak is measured with

M, K, N = 512, 1024, 1024


def windows(run, seconds: float, window: int, ops: int) -> list:
    """Median GOPS of each `window` consecutive calls of `run`, calling it back to back for `seconds`."""
    gops, until = [], time.perf_counter() + seconds
    while time.perf_counter() < until or len(gops) < window:
        started = time.perf_counter()
        run()
        gops.append(ops / (time.perf_counter() - started) / 1e9)
    return [round(float(np.median(gops[i:i + window])), 1) for i in range(0, len(gops) - window + 1, window)]


def engines(m: int = M, k: int = K, n: int = N) -> dict:
    """{engine: a no-argument call running one m x k x n INT8 GEMM on one thread}."""
    rng = np.random.default_rng(0)
    session = headline.matmul_integer(rng.integers(-127, 128, (k, n)).astype(np.int8), m)
    feed = {"A": rng.integers(0, 256, (m, k)).astype(np.uint8)}
    out = {"onnxruntime": lambda: session.run(None, feed)}
    fc = headline.fully_connected(k, n, m)
    if fc is not None:
        out["xnnpack"] = fc
    return out


def summary(by_window: list) -> dict:
    return {"windows_gops": by_window, "min_gops": min(by_window), "max_gops": max(by_window),
            "spread": round(max(by_window) / min(by_window), 2)}


def markdown(result: dict) -> str:
    lines = ["# Is this core's INT8 GEMM speed steady?", "",
             f"Measured {result['at']} by `python bench/gemm_steadiness.py` on {result['cpu']} "
             f"({result['int8_isa'] or 'INT8 instructions unknown'}): one {result['shape']} INT8 GEMM called back "
             f"to back for {result['seconds']} s per engine on 1 thread; median GOPS per {result['window']} "
             f"consecutive calls. `spread` = fastest window / slowest: near 1.0 on a steady core.", "",
             "| engine | windows | slowest GOPS | fastest GOPS | spread | GOPS per window, in order |",
             "|---|---:|---:|---:|---:|---|"]
    for engine, s in result["engines"].items():
        lines.append(f"| {engine} | {len(s['windows_gops'])} | {s['min_gops']:.0f} | {s['max_gops']:.0f} | "
                     f"{s['spread']:.2f} | {' '.join(f'{g:.0f}' for g in s['windows_gops'])} |")
    return "\n".join(lines) + "\n"


def main(argv=None):
    p = cli.Parser(description=cli.description(__doc__))
    p.add_argument("--seconds", type=float, default=4.0, help="back-to-back calls per engine (default 4)")
    p.add_argument("--window", type=int, default=100, help="calls per window (default 100)")
    p.add_argument("--out", type=Path, default=Path("bench/results/gemm-steadiness.json"),
                   help="the result JSON, its .md beside it (default bench/results/gemm-steadiness.json)")
    a = p.parse_args(argv)
    if a.seconds <= 0 or a.window < 1:
        p.error(f"--seconds must be > 0 and --window >= 1 (got {a.seconds}, {a.window})")
    result = {"at": time.strftime("%Y-%m-%d %H:%M"), **devices.this_cpu(), "shape": f"{M}x{K}x{N}",
              "seconds": a.seconds, "window": a.window,
              "engines": {engine: summary(windows(run, a.seconds, a.window, 2 * M * K * N))
                          for engine, run in engines().items()}}
    write_json(a.out, result)
    write_text(a.out.with_suffix(".md"), markdown(result))
    print(markdown(result), file=sys.stderr)


if __name__ == "__main__":
    from edgekit.cli import script

    sys.exit(script(main))
