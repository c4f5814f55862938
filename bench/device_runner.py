"""device_bench targets, measured on a finished run (e.g. artifacts/distilbert-int8):

1. runner start-up plus one inference (a fresh `python -m device_bench MODEL --runs 1 --warmup 0 --batch 1` process,
   wall clock, median of 5) for the run's ~20 MB INT8 ONNX model, in the runner's own virtual environment;
   target: at most 2 s;
2. that virtual environment's size on disk (ONNX Runtime flavour: `python -m venv --without-pip`, then
   `pip install --no-deps --no-compile -r requirements-onnx.txt`), before and after the runs of 1. (Python writes
   the bytecode of what it imports); target: at most 150 MB;
3. ARM64 (qemu-arm64: Debian arm64 root, aarch64 wheels, emulated) against x86 (local) predictions on the first
   200 test sentences for ONNX INT8 (ONNX Runtime dynamic) and TFLite INT8 (ai-edge-quantizer dynamic-range) of the
   run's student; target: at least 99% agreement for each. Also the time to build the qemu root (when not cached).

    python bench/device_runner.py artifacts/distilbert-int8 [--skip-qemu]

Writes bench/results/device_runner.json and .md.
"""
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from edgekit import cli, devices, pipeline  # noqa: E402
from edgekit.artifact import Artifact, write_json, write_text  # noqa: E402


def du_mb(path: Path) -> float:
    return round(sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink()) / 1e6, 1)


def runner_venv(into: Path) -> Path:
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(into)], check=True)
    subprocess.run([sys.executable, "-m", "pip", "--python", str(into / "bin" / "python"), "install", "-q", "--no-deps",
                    "--no-compile", "--disable-pip-version-check", "-r",
                    str(devices.runner_source() / "requirements-onnx.txt")], check=True)
    return into / "bin" / "python"


def startup(python: Path, model: Path, job: Path, rounds: int = 5) -> dict:
    """Fresh processes; Python may write bytecode, as on a device: the first round compiles what it imports."""
    import os

    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    walls, results = [], []
    for _ in range(rounds):
        t = time.perf_counter()
        subprocess.run([str(python), "-m", "device_bench", str(model), "--runs", "1", "--warmup", "0", "--batch", "1",
                        "--out", str(job / "r.json")], check=True, cwd=job, capture_output=True, env=env)
        walls.append(time.perf_counter() - t)
        results.append(json.loads((job / "r.json").read_text()))
    return {"wall_s_median": round(statistics.median(walls), 3), "wall_s_first": round(walls[0], 3),
            "wall_s": [round(w, 3) for w in walls],
            "load_s_median": statistics.median(r["load_s"] for r in results),
            "first_inference_ms_median": statistics.median(r["first_inference_ms"] for r in results),
            "size_mb": results[0]["size_mb"]}


def int8_models(run: Path, into: Path) -> dict:
    """The run's final ONNX INT8, and a TFLite dynamic-range INT8 of its last transformers model (the student; the
    input model when the run has no training stage), exported here when the run has no TFLite output."""
    from ai_edge_quantizer import quantizer, recipe as qrecipe

    from edgekit.stages import export

    manifest, ctx = pipeline.context_of(run, progress=False)
    onnx = devices.model_file(run, manifest)
    outputs = manifest["final"].get("outputs") or {}
    lite = next((run / o["path"] for o in outputs.values() if o["kind"] == "tflite"), None)
    if lite is None:
        student = next((Artifact.from_json(s["output"], run) for s in reversed(manifest["stages"])
                        if s["output"]["kind"] == "hf"), Artifact(Path(manifest["model"]["path"]), "hf"))
        fp32 = export.run(student, into / "tflite", ctx, format="tflite", buckets=[32, 64, 128], check_sentences=50)
        lite_dir = into / "tflite-int8"
        shutil.copytree(into / "tflite", lite_dir)
        (lite_dir / "model.tflite").unlink()
        quantizer.Quantizer(str(fp32.path), qrecipe.dynamic_wi8_afp32()).quantize().export_model(
            str(lite_dir / "model.tflite"), overwrite=True)
        lite = lite_dir / "model.tflite"
    return {"onnx-int8": onnx, "tflite-int8": lite}


def agreement(run: Path, models: dict, sentences: int, tmp: Path) -> dict:
    targets = tmp / "targets.yaml"
    common = {"sentences": sentences, "runs": 3, "warmup": 1, "batch": 2, "seq_len": 32, "timeout_s": 7200}
    targets.write_text(json.dumps({"devices": {"x86": {"kind": "local", **common},
                                               "arm64": {"kind": "qemu-arm64", **common}}}))
    _, ctx = pipeline.context_of(run, progress=False)
    out = {}
    for name, model in models.items():
        t = time.perf_counter()
        arm = devices.bench(run, "arm64", targets, str(model))
        arm_s = time.perf_counter() - t
        x86 = devices.bench(run, "x86", targets, str(model))
        same = sum(a == b for a, b in zip(arm["predictions"], x86["predictions"]))
        differ = [i for i, (a, b) in enumerate(zip(arm["predictions"], x86["predictions"])) if a != b]
        margins = []
        if differ:  # how close to a tie each disagreeing sentence is on x86 (top-1 minus top-2 logit)
            from edgekit import runtime

            model = runtime.load(model)
            for i in differ:
                logits = sorted(model.logits(model.encode([ctx.splits.test[i][0]]))[0], reverse=True)
                margins.append(round(float(logits[0] - logits[1]), 5))
        out[name] = {"sentences": len(x86["predictions"]), "agree": same,
                     "agreement": round(same / len(x86["predictions"]), 4),
                     "accuracy_arm64": arm["metrics"]["accuracy"], "accuracy_x86": x86["metrics"]["accuracy"],
                     "size_mb": x86["metrics"]["size_mb"], "arm64_runtime": f"{arm['result']['runtime']} "
                     f"{arm['result']['runtime_version']} on {arm['result']['machine']} (emulated)",
                     "latency_ms_p50_arm64_emulated": arm["metrics"]["latency_ms_p50"],
                     "latency_ms_p50_x86": x86["metrics"]["latency_ms_p50"], "arm64_wall_s": round(arm_s, 1),
                     "seq_len": 32, "disagreeing": differ, "x86_logit_margin_of_disagreeing": margins}
    return out


def main():
    p = cli.Parser(description=cli.description(__doc__))
    p.add_argument("run", type=Path, help="a finished run folder (artifacts/distilbert-int8)")
    p.add_argument("--sentences", type=int, default=200,
                   help="test sentences whose arm64 and x86 predictions are compared (default 200)")
    p.add_argument("--skip-qemu", action="store_true", help="measure start-up and venv size only: no qemu-arm64 root, "
                                                            "no arm64 against x86 check")
    p.add_argument("--time-root-build", action="store_true", help="build a second qemu root in a temporary cache "
                   "to time it (about 0.4 GB, needs the Debian mirror and the package index)")
    a = p.parse_args()
    run = a.run.resolve()
    results = {}
    with tempfile.TemporaryDirectory(prefix="device-runner-") as tmp:
        tmp = Path(tmp)
        t = time.perf_counter()
        python = runner_venv(tmp / "venv")
        venv_install_s = time.perf_counter() - t
        venv_before = du_mb(tmp / "venv")
        job = tmp / "job"
        shutil.copytree(devices.runner_source(), job / "device_bench")
        manifest, _ = pipeline.context_of(run, progress=False)
        model = devices.model_file(run, manifest)
        results["startup"] = {"model": str(model), **startup(python, model, job), "target_s": 2.0}
        results["venv"] = {"mb_after_install": venv_before, "mb_after_first_run": du_mb(tmp / "venv"),
                           "install_s": round(venv_install_s, 1), "target_mb": 150,
                           "packages": (devices.runner_source() / "requirements-onnx.txt").read_text().split("\n")[1:-1]}
        if not a.skip_qemu:
            root_cached = (devices.qemu_root_dir({})[0] / ".ready").is_file()
            t = time.perf_counter()
            devices.qemu_root({})
            results["qemu_root"] = {"cached": root_cached, "build_min": None if root_cached else
                                    round((time.perf_counter() - t) / 60, 2), "path": str(devices.qemu_root_dir({})[0])}
            if a.time_root_build:
                import os

                os.environ["EDGEKIT_CACHE"], saved = str(tmp / "cache"), os.environ.get("EDGEKIT_CACHE")
                t = time.perf_counter()
                devices.qemu_root({})
                results["qemu_root"]["fresh_build_min"] = round((time.perf_counter() - t) / 60, 2)
                results["qemu_root"]["fresh_root_mb"] = du_mb(devices.qemu_root_dir({})[0])
                shutil.rmtree(tmp / "cache")
                os.environ.pop("EDGEKIT_CACHE") if saved is None else os.environ.update(EDGEKIT_CACHE=saved)
            results["arm64_vs_x86"] = agreement(run, int8_models(run, tmp), a.sentences, tmp)
    out = ROOT / "bench" / "results"
    write_json(out / "device_runner.json", results)
    s, v = results["startup"], results["venv"]
    md = ["| check | measured | target |", "|---|---:|---:|",
          f"| runner start-up + one inference ({s['size_mb']} MB INT8 ONNX), median of 5 (first, compiling bytecode)"
          f" | {s['wall_s_median']} s ({s['wall_s_first']} s) | <= 2 s |",
          f"| runner venv (ONNX Runtime flavour), after install / after first run | {v['mb_after_install']} / "
          f"{v['mb_after_first_run']} MB | <= 150 MB |"]
    for name, r in results.get("arm64_vs_x86", {}).items():
        md.append(f"| {name}: arm64 (emulated) vs x86 predictions on {r['sentences']} test sentences | "
                  f"{r['agreement']:.2%} ({r['agree']}/{r['sentences']}; x86 logit margins of those that differ: "
                  f"{r['x86_logit_margin_of_disagreeing'] or '-'}) | >= 99% |")
    if "qemu_root" in results:
        q = results["qemu_root"]
        built = q.get("fresh_build_min", q["build_min"])
        md.append(f"| qemu-arm64 root build (debootstrap + wheels) | {'cached' if built is None else str(built) + ' min'}"
                  f" | |")
    write_text(out / "device_runner.md", "\n".join(md) + "\n")
    print("\n".join(md))


if __name__ == "__main__":
    from edgekit.cli import script

    sys.exit(script(main))
