"""Fault injection: SIGKILL a small recipe at several points inside every stage, run it again, and compare
the result with an uninterrupted run of the same seed.

    python bench/faults.py [--points 0.15 0.5 0.85] [--out bench/results/faults.json]

A kill lands a given fraction of the way through a stage (timed from the reference run, counted from the
moment the run announces the stage). The re-run must exit 0, reuse what had finished, leave no partial
folder, match every file's sha256 in its manifest, and agree with the reference: the same stages, the same
non-timing metrics, and the same predictions of the final model. Prints `N kills, N resumed, M mismatches`.
"""
import json
import math
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from edgekit import assets, cli, runtime, schemas, testing
from edgekit.artifact import write_json

STAGES = ("finetune", "distill", "prune", "export", "quantize", "evaluate", "bench")
TIMING = ("latency", "load_s", "peak_rss", "seconds")  # measured, not computed: may differ between runs


def compress(recipe: Path, out: Path, kill_stage: str = None, fraction: float = 0.0, stage_seconds: float = 0.0):
    """Run edgekit compress; optionally SIGKILL it `fraction` of the way into `kill_stage`. Returns (rc, killed_in)."""
    cmd = [sys.executable, "-m", "edgekit.cli", "compress", "--recipe", str(recipe), "--out", str(out)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True)
    killed = {"stage": None}

    def watch():
        for line in proc.stderr:
            if kill_stage and line.startswith("[") and line.rstrip().endswith(f"] {kill_stage}"):
                time.sleep(fraction * stage_seconds)
                if proc.poll() is None:
                    os.killpg(proc.pid, signal.SIGKILL)
                    killed["stage"] = kill_stage
                    return

    reader = threading.Thread(target=watch, daemon=True)
    reader.start()
    rc = proc.wait()
    reader.join(timeout=5)
    return rc, killed["stage"]


def comparable(manifest: dict) -> list:
    rows = []
    for s in manifest["stages"]:
        metrics = {k: v for k, v in s["metrics"].items() if not any(t in k for t in TIMING)}
        rows.append((s["name"], metrics))
    return rows


def mismatches(reference: Path, run: Path, texts: list) -> list:
    problems = []
    manifest = json.loads((run / "manifest.json").read_text())
    schemas.validate(manifest, schemas.MANIFEST, "manifest")
    ref = json.loads((reference / "manifest.json").read_text())
    if manifest["status"] != "complete":
        problems.append(f"status {manifest['status']}")
    if list(run.glob("*.partial")):
        problems.append("a .partial folder was left behind")
    for s in manifest["stages"]:
        for rel, sha in s["files"].items():
            if assets.sha256_file(run / rel) != sha:
                problems.append(f"{rel} does not match its sha256")
    for (name_a, a), (_, b) in zip(comparable(ref), comparable(manifest)):
        for key in set(a) | set(b):
            va, vb = a.get(key), b.get(key)
            same = (math.isclose(va, vb, rel_tol=1e-3, abs_tol=1e-3) if isinstance(va, float) and isinstance(vb, float)
                    else va == vb)
            if not same:
                problems.append(f"{name_a}.{key}: {va} != {vb}")
    if [s["name"] for s in ref["stages"]] != [s["name"] for s in manifest["stages"]]:
        problems.append("different stages")
    a = runtime.load(reference / ref["final"]["path"])(texts)
    b = runtime.load(run / manifest["final"]["path"])(texts)
    if a["labels"] != b["labels"] or abs(a["probs"] - b["probs"]).max() > 1e-3:
        problems.append(f"final predictions differ (max prob diff {abs(a['probs'] - b['probs']).max():.2g})")
    return problems


def main(argv=None):
    p = cli.Parser(description=cli.description(__doc__))
    p.add_argument("--points", type=float, nargs="+", default=[0.15, 0.5, 0.85],
                   help="where to kill, as fractions of each stage's time (default 0.15 0.5 0.85)")
    p.add_argument("--out", type=Path, default=Path("bench/results/faults.json"),
                   help="the result JSON (default bench/results/faults.json)")
    a = p.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="edgekit-faults-"))
    model = testing.make_model_dir(work / "teacher")
    data = testing.make_csv(work / "reviews.csv", n=1200)  # enough work that a kill lands inside each stage
    recipe = work / "all-stages.yaml"
    recipe.write_text(testing.tiny_recipe(model, data, STAGES))
    texts = [testing.sentence(random.Random(i), i % 2) for i in range(64)]

    reference = work / "reference"
    rc, _ = compress(recipe, reference)
    assert rc == 0, "the uninterrupted reference run failed"
    seconds = {s["name"]: s["seconds"] for s in json.loads((reference / "manifest.json").read_text())["stages"]}
    print("reference stage seconds:", seconds, flush=True)

    results = []
    for stage in STAGES:
        for point in a.points:
            out = work / f"kill-{stage}-{point}"
            rc, killed_in = compress(recipe, out, stage, point, seconds[stage])
            landed = [p.name.split("-", 1)[1].removesuffix(".partial") for p in out.glob("*.partial")]
            rerun_rc, _ = compress(recipe, out)
            problems = mismatches(reference, out, texts) if rerun_rc == 0 else [f"re-run exited {rerun_rc}"]
            row = {"stage": stage, "point": point, "landed_in": landed[0] if landed else "between stages",
                   "killed": killed_in is not None and rc == -signal.SIGKILL,
                   "resumed": rerun_rc == 0, "problems": problems}
            results.append(row)
            print(f"{stage:9s} at {point:.2f}: {'killed in ' + row['landed_in'] if row['killed'] else 'finished first'}, "
                  f"re-run {'ok' if row['resumed'] else 'FAILED'}, {len(problems)} mismatches "
                  + ("; ".join(problems[:3]) if problems else ""), flush=True)
    kills = sum(r["killed"] for r in results)
    resumed = sum(r["killed"] and r["resumed"] for r in results)
    bad = sum(bool(r["problems"]) for r in results)
    a.out.parent.mkdir(parents=True, exist_ok=True)
    write_json(a.out, {"kills": kills, "resumed": resumed, "mismatches": bad, "runs": results,
                       "reference_seconds": seconds})
    print(f"{kills} kills, {resumed} resumed, {bad} mismatches")
    return 0 if bad == 0 and resumed == kills else 1


if __name__ == "__main__":
    from edgekit.cli import script

    sys.exit(script(main))
