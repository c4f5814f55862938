"""Sweep a recipe over a grid of settings, reusing the stages the runs share, and report the Pareto front.

    edgekit sweep --recipe distilbert-int8 distill.temperature=1,2,4 quantize.per_channel=true,false

Runs locally, one after another, by default; with `--ray ADDRESS` each grid point is a Ray task (the first
point runs alone first, so the stages every point shares are computed once). Finished stages are shared
through `OUT/shared/` by their key (hard links), whichever process computed them.
"""
import itertools
import json
import shutil
import socket
from pathlib import Path

from edgekit import recipe as recipes
from edgekit.errors import EdgekitError, UsageError


def grid(overrides: list) -> list:
    """['a=1,2', 'b=x'] -> [['a=1', 'b=x'], ['a=2', 'b=x']]; a value in [...] or {...} is never split."""
    axes, keys = [], []
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep:
            raise UsageError(f"sweep setting '{item}' must look like key=v1,v2,...")
        values = [raw] if raw.strip()[:1] in "[{" else [v.strip() for v in raw.split(",")]
        if any(v == "" for v in values):
            raise UsageError(f"sweep setting '{item}' has an empty value; give key=v1,v2,...")
        if key in keys or len(set(values)) < len(values):  # the last would win: rows would name runs never made
            raise UsageError(f"sweep setting '{item}' repeats a key or a value; give each key once, with distinct "
                             f"values")
        keys.append(key)
        axes.append([f"{key}={v}" for v in values])
    return [list(point) for point in itertools.product(*axes)]


def slug(point: list) -> str:
    text = "_".join(point) or "base"
    return "".join(c if c.isalnum() or c in "._=-" else "-" for c in text)[:120]


def run_point(recipe_name: str, point: list, out: str, shared: str) -> dict:
    """One grid point; returns its manifest, or {status: failed, error} when it failed: the other points go on.
    Also what a Ray task runs."""
    from edgekit import pipeline

    try:
        return pipeline.run(recipes.load(recipe_name, point), Path(out), progress=False, shared=Path(shared),
                            warn=False)
    except EdgekitError as e:
        return {"status": "failed", "error": str(e), "final": {"metrics": {}}, "stages": []}


def check_ray(address: str) -> None:
    host, _, port = address.replace("ray://", "").rpartition(":")
    try:
        with socket.create_connection((host or "127.0.0.1", int(port)), timeout=3):
            return
    except (OSError, ValueError):
        raise EdgekitError(f"cannot reach a Ray cluster at {address}; start one (`ray start --head`) and pass its "
                           f"HOST:PORT, or leave out --ray to sweep locally")


def sweep(recipe_name: str, overrides: list, out: Path, ray_address: str = None, progress: bool = True) -> dict:
    if ray_address is not None and not ray_address.strip():
        raise UsageError("--ray is empty; give the cluster's HOST:PORT, or leave --ray out to sweep here")
    if (Path(out) / "manifest.json").is_file():
        raise UsageError(f"--out {out} holds a compress run (manifest.json); give a folder of its own to the sweep")
    from edgekit import pipeline

    points, told = grid(overrides), set()
    for point in points:  # every point is validated before anything runs, against its data and teacher too
        recipe = recipes.load(recipe_name, point)
        splits = pipeline.check_inputs(recipe)
        if splits and (source := json.dumps(recipe["data"], sort_keys=True)) not in told:
            told.add(source)  # each data source's warnings once, not once per point
            pipeline.tell_data(splits, progress)
    out = Path(out).resolve()  # Ray workers may start elsewhere
    shared = out / "shared"
    shared.mkdir(parents=True, exist_ok=True)
    dirs = [out / f"{i:02d}-{slug(p)}" for i, p in enumerate(points)]
    if ray_address:
        check_ray(ray_address)
        import ray

        ray.init(address=ray_address, log_to_driver=False)
        try:
            task = ray.remote(num_cpus=1)(run_point)
            first = ray.get(task.remote(recipe_name, points[0], str(dirs[0]), str(shared)))
            manifests = [first] + ray.get([task.remote(recipe_name, p, str(d), str(shared))
                                           for p, d in zip(points[1:], dirs[1:])])
        finally:
            # disconnect: a driver left attached exits its whole process (code 1) once the cluster stops
            ray.shutdown()
    else:
        from tqdm import tqdm

        manifests = [run_point(recipe_name, p, str(d), str(shared))
                     for p, d in tqdm(list(zip(points, dirs)), desc="sweep", unit="run", disable=not progress)]
    for old in sorted(set(p for p in out.glob("[0-9][0-9]-*") if p.is_dir()) - set(dirs)):  # an earlier grid's
        shutil.rmtree(old)
    return summarize(points, dirs, manifests, out)


def summarize(points: list, dirs: list, manifests: list, out: Path) -> dict:
    from edgekit import report

    rows = []
    for point, folder, manifest in zip(points, dirs, manifests):
        m = manifest["final"]["metrics"]
        rows.append({"run": folder.name, "settings": point, "accuracy": m.get("accuracy"),
                     "latency_ms_p50": m.get("latency_ms_p50"), "size_mb": m.get("size_mb"),
                     "reused_stages": sum(bool(s.get("reused")) for s in manifest["stages"]),
                     "status": manifest["status"], **({"error": manifest["error"]} if "error" in manifest else {})})
    pts = [(r["run"], r["accuracy"], r["latency_ms_p50"], r["size_mb"]) for r in rows
           if isinstance(r["accuracy"], (int, float)) and isinstance(r["latency_ms_p50"], (int, float))]
    front = {p[0] for p in report.pareto(pts)}
    for r in rows:
        r["pareto"] = r["run"] in front
    lines = ["| run | settings | status | accuracy | latency p50 ms | size MB | stages reused | Pareto |",
             "|---|---|---|---:|---:|---:|---:|---|"]
    lines += [f"| {r['run']} | {' '.join(r['settings'])} | {r['status']}{': ' + r['error'] if 'error' in r else ''} | "
              f"{r['accuracy']} | {r['latency_ms_p50']} | {r['size_mb']} | {r['reused_stages']} | "
              f"{'yes' if r['pareto'] else ''} |" for r in rows]
    (out / "sweep.md").write_text("\n".join(lines) + "\n")
    (out / "sweep.json").write_text(json.dumps(rows, indent=2))
    if pts:
        report.build([str(d) for d, r in zip(dirs, rows) if r["status"] != "failed"], out / "report")
    return {"rows": rows, "table": "\n".join(lines)}
