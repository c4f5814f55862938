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
import sys
import traceback
from pathlib import Path

from edgekit import recipe as recipes
from edgekit.artifact import write_json, write_text
from edgekit.errors import EdgekitError, UsageError


def grid(overrides: list) -> list:
    """['a=1,2', 'b=x'] -> [['a=1', 'b=x'], ['a=2', 'b=x']]; commas inside [...] or {...} do not split, so
    'targets=[x86],[x86,arm64]' sweeps two lists."""
    axes, keys = [], []
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep:
            raise UsageError(f"sweep setting '{item}' must look like key=v1,v2,...")
        values = [v.strip() for v in split_top(raw)]
        if any(v == "" for v in values):
            raise UsageError(f"sweep setting '{item}' has an empty value; give key=v1,v2,...")
        if key in keys or len(set(values)) < len(values):  # the last would win: rows would name runs never made
            raise UsageError(f"sweep setting '{item}' repeats a key or a value; give each key once, with distinct "
                             f"values")
        keys.append(key)
        axes.append([f"{key}={v}" for v in values])
    return [list(point) for point in itertools.product(*axes)]


def split_top(raw: str) -> list:
    """'1,[2, 3],{a: 4}' -> ['1', '[2, 3]', '{a: 4}']: commas outside brackets and braces."""
    parts, depth, start = [], 0, 0
    for i, c in enumerate(raw):
        depth += (c in "[{") - (c in "]}")
        if c == "," and depth == 0:
            parts.append(raw[start:i])
            start = i + 1
    return parts + [raw[start:]]


def slug(point: list) -> str:
    text = "_".join(point) or "base"
    return "".join(c if c.isalnum() or c in "._=-" else "-" for c in text)[:120]


def run_point(recipe_name: str, point: list, out: str, shared: str, progress: bool = False) -> dict:
    """One grid point; returns its manifest, or {status: failed, error} when it failed: the other points go on.
    Also what a Ray task runs (without progress: a worker's bars would go nowhere useful)."""
    from edgekit import pipeline

    try:
        return pipeline.run(recipes.load(recipe_name, point), Path(out), progress=progress, shared=Path(shared),
                            warn=False)
    except EdgekitError as e:
        return {"status": "failed", "error": str(e), "final": {"metrics": {}}, "stages": []}
    except Exception as e:  # a bug or a library's own error: the traceback goes to stderr, the other points run
        traceback.print_exc()
        return {"status": "failed", "error": f"unexpected {type(e).__name__}: {e}".replace("\n", " "),
                "final": {"metrics": {}}, "stages": []}


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
        for warning in set(recipes.ineffective(recipe)) - told:  # and each setting that changes nothing
            told.add(warning)
            print(f"edgekit: warning: {warning}", file=sys.stderr, flush=True)
    if ray_address:
        check_ray(ray_address)  # before anything is written
    out = Path(out).resolve()  # Ray workers may start elsewhere
    shared = out / "shared"
    shared.mkdir(parents=True, exist_ok=True)
    dirs = [out / f"{i:02d}-{slug(p)}" for i, p in enumerate(points)]
    made = earlier_points(out) | {d.name for d in dirs}
    write_json(out / POINTS, sorted(made))  # what a later sweep into this folder may remove: nothing else
    if ray_address:
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
    else:  # each point shows its stages and their bars, as compress does: a point of a real recipe takes minutes
        manifests = []
        for i, (p, d) in enumerate(zip(points, dirs), 1):
            pipeline.log(f"sweep point {i}/{len(points)}: {d.name}", progress)
            manifests.append(run_point(recipe_name, p, str(d), str(shared), progress))
    for old in sorted(made - {d.name for d in dirs}):  # an earlier grid's points: not a folder the user put here
        shutil.rmtree(out / old, ignore_errors=True)
    used = {s["key"] for m in manifests for s in m.get("stages", [])}
    for entry in shared.iterdir():  # stages no point of this grid uses (an earlier grid's): shared/ only grew
        if entry.name not in used:
            shutil.rmtree(entry, ignore_errors=True)
    write_json(out / POINTS, sorted(d.name for d in dirs))
    return summarize(points, dirs, manifests, out)


POINTS = ".sweep-points.json"  # the point folders sweeps made in OUT


def earlier_points(out: Path) -> set:
    """The point folders earlier sweeps into `out` made (sweep.json of sweeps before the list was kept)."""
    for name, key in ((POINTS, None), ("sweep.json", "run")):
        try:
            listed = json.loads((out / name).read_text())
            names = {str(x[key] if key else x) for x in listed}
            return {n for n in names if n[:2].isdigit() and n[2:3] == "-" and "/" not in n and "\\" not in n}
        except (OSError, ValueError, TypeError, KeyError):
            continue
    return set()


def summarize(points: list, dirs: list, manifests: list, out: Path) -> dict:
    """One row per point and artifact (a multi-target run has several), with the Pareto front over all of them,
    as the sweep's report draws it."""
    from edgekit import report

    rows = []
    for point, folder, manifest in zip(points, dirs, manifests):
        final = manifest["final"]
        for a in (final.get("outputs") or {"": final}).values():
            m = a["metrics"]
            rows.append({"run": folder.name, "artifact": a.get("path"), "settings": point,
                         "accuracy": m.get("accuracy"), "latency_ms_p50": m.get("latency_ms_p50"),
                         "size_mb": m.get("size_mb"),
                         "reused_stages": sum(bool(s.get("reused")) for s in manifest["stages"]),
                         "status": manifest["status"], **({"error": manifest["error"]} if "error" in manifest else {})})
    pts = [(i, r["accuracy"], r["latency_ms_p50"], r["size_mb"]) for i, r in enumerate(rows)
           if isinstance(r["accuracy"], (int, float)) and isinstance(r["latency_ms_p50"], (int, float))]
    front = {p[0] for p in report.pareto(pts)}
    for i, r in enumerate(rows):
        r["pareto"] = i in front

    def cell(v, unit=""):
        return "-" if v is None else report.number(v, unit) if isinstance(v, (int, float)) else v

    lines = ["| run | artifact | settings | status | accuracy | latency p50 ms | size MB | stages reused | Pareto |",
             "|---|---|---|---|---:|---:|---:|---:|---|"]
    lines += [f"| {r['run']} | {cell(r['artifact'])} | {' '.join(r['settings'])} | "
              f"{r['status']}{': ' + r['error'] if 'error' in r else ''} | {cell(r['accuracy'])} | "
              f"{cell(r['latency_ms_p50'], 'ms')} | {cell(r['size_mb'], 'MB')} | {r['reused_stages']} | "
              f"{'yes' if r['pareto'] else ''} |" for r in rows]
    write_text(out / "sweep.md", "\n".join(lines) + "\n")
    write_json(out / "sweep.json", rows)
    if pts:
        report.build([str(d) for d, m in zip(dirs, manifests) if m["status"] != "failed"], out / "report")
    return {"rows": rows, "table": "\n".join(lines)}
