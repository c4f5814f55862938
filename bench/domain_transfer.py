"""What unlabelled text from the deployment domain buys: a recipe with `transfer` on half of vader-amazon.

A model trained on movie reviews meets product reviews on the device. Its user has no labels there, but has text.
This bench cuts vader-amazon (or `--source`) in two halves (seed 0). Half A is the transfer set: a .txt file, one
sentence per line, given to `distill.transfer` and `prune.transfer` without labels. Half B is held out.

The base run's recipe, as that run resolved it, runs again with those two keys. Its finetune stage is copied from
the base run, so both runs distil the same teacher. Then the teacher and both runs' distilled, pruned and final
models are scored on the run's test split, on B and on A, every sentence on its own (as a device runs it). Each
accuracy comes with the share kept of the teacher's and the 95% paired bootstrap interval of that share.

    python bench/domain_transfer.py artifacts/edge-base [--run artifacts/edge-base-transfer] [--render]

A second call with the same folders reuses every finished stage. Writes bench/results/domain-transfer.json,
bench/results/domain-transfer.md and a bar plot beside them (--out: elsewhere).
"""
import json
import random
import shutil
import sys
import time
from pathlib import Path

import yaml

from edgekit import cli, data, pipeline, runtime
from edgekit.artifact import write_json, write_text
from edgekit.stages import evaluate

from headline import bits, distinct_finals, kept_interval  # bench/headline.py: the same rows and intervals


def main(argv=None):
    p = cli.Parser(description=cli.description(__doc__))
    p.add_argument("base", type=Path, nargs="?", help="a finished run with distill and prune (artifacts/edge-base)")
    p.add_argument("--run", type=Path, help="the transfer run's folder (default: BASE-transfer)")
    p.add_argument("--source", default="vader-amazon",
                   help="the deployment domain: a two-class dataset labelled positive / negative, vader-amazon "
                        "(default) or a local .csv/.tsv/.jsonl file (columns text, label)")
    p.add_argument("--out", type=Path, default=Path("bench/results/domain-transfer.json"),
                   help="the result JSON, its .md and plot beside it (default bench/results/domain-transfer.json)")
    p.add_argument("--render", action="store_true", help="redraw the table and plot from the stored JSON, no runs")
    a = p.parse_args(argv)
    if a.render:
        render(json.loads(a.out.read_text()), a.out)
        return
    if a.base is None:
        p.error("give a finished run (artifacts/edge-base), or --render to redraw from the stored JSON")
    base = a.base.resolve()
    run = (a.run or base.with_name(base.name + "-transfer")).resolve()
    manifest, ctx = pipeline.context_of(base)
    stages = [s["name"] for s in manifest["stages"]]
    if stages[:1] != ["finetune"] or not {"distill", "prune"} <= set(stages):
        sys.exit(f"error: {base} ran stages {stages}; give a run that starts with finetune and has distill and prune "
                 f"(edge-base)")
    held_a, held_b = halves(data.out_of_domain(manifest["data"]["labels"], a.source))
    transfer = base.parent / "transfer" / f"{Path(a.source).stem}-A.txt"
    transfer.parent.mkdir(parents=True, exist_ok=True)
    write_text(transfer, "".join(t + "\n" for t, _ in held_a))
    recipe = transfer.with_name(f"{base.name}-recipe.yaml")  # the base run's own recipe, as it resolved
    write_text(recipe, yaml.safe_dump(manifest["recipe"], sort_keys=False))
    if not (run / "manifest.json").exists():  # start from the base run's teacher: its finetune stage is reused
        run.mkdir(parents=True, exist_ok=True)
        shutil.copytree(base / f"01-{stages[0]}", run / f"01-{stages[0]}", dirs_exist_ok=True)
        shutil.copy2(base / "manifest.json", run / "manifest.json")
    keys = [f"{stage}.{key}={value}" for stage in ("distill", "prune")
            for key, value in (("transfer", transfer), ("transfer_examples", len(held_a)))]
    t0 = time.time()
    _, run_manifest = pipeline.compress(str(recipe), out=run, overrides=keys)
    print(f"transfer run: {run} ({(time.time() - t0) / 60:.0f} min)", file=sys.stderr)
    models = [("teacher FP32", ctx.teacher.path)]
    for label, folder, finished in (("base", base, manifest), ("transfer", run, run_manifest)):
        models += [(f"{label}: {what} student FP32", folder / f"{stages.index(stage) + 1:02d}-{stage}" / "model")
                   for stage, what in (("distill", "distilled"), ("prune", "pruned"))]
        models += [(f"{label}: {names}", art.path) for names, art in distinct_finals(finished, folder)]
    rows, splits = [], {"test": ctx.splits.test, "B": held_b, "A": held_a}
    for label, path in models:
        model = runtime.load(path)
        hits = {k: evaluate.correct(model, v, 1, True, f"{label[:24]} {k}") for k, v in splits.items()}
        rows.append({"model": label, "path": str(path), **{f"{k}_correct": bits(v) for k, v in hits.items()}})
    for r in rows:
        for k in splits:
            mine, ref = r[f"{k}_correct"], rows[0][f"{k}_correct"]
            r[f"{k}_accuracy"] = round(mine.count("1") / len(mine), 4)
            r[f"{k}_kept"] = round(mine.count("1") / max(ref.count("1"), 1), 4)
            r[f"{k}_kept_ci"] = kept_interval(mine, ref)
    result = {"at": time.strftime("%Y-%m-%d %H:%M"), "base": str(base), "run": str(run),
              "source": Path(a.source).name, "data": Path(ctx.splits.source).name,
              "transfer_file": str(transfer), "a_examples": len(held_a), "b_examples": len(held_b),
              "test_examples": len(ctx.splits.test), "overrides": keys, "rows": rows}
    a.out.parent.mkdir(parents=True, exist_ok=True)
    write_json(a.out, result)
    render(result, a.out)


def render(result: dict, json_path: Path) -> None:
    """The markdown table and the bar plot beside the JSON."""
    plot(result["rows"], json_path.with_suffix(".png"))
    write_text(json_path.with_suffix(".md"), markdown(result, json_path))
    print(json_path.with_suffix(".md").read_text())


def halves(rows: list, seed: int = 0) -> tuple:
    """(A, B): a seeded shuffle of the rows cut in two; A is the transfer set, B is held out."""
    order = list(range(len(rows)))
    random.Random(seed).shuffle(order)
    cut = len(rows) // 2
    return [rows[i] for i in order[:cut]], [rows[i] for i in order[cut:]]


def markdown(result: dict, json_path: Path) -> str:
    source, b, a = result["source"], result["b_examples"], result["a_examples"]
    lines = [
        f"# What unlabelled {source} text buys a recipe: `transfer` on half of it, scored on the other half",
        "",
        f"Measured {result['at']} by `python bench/domain_transfer.py {Path(result['base']).name}` (raw: "
        f"`{json_path.name}`). {source} was cut in two halves (seed 0). Half A ({a} sentences, labels dropped) was "
        f"the `transfer` set of the distill and prune stages; half B ({b} sentences) is held out. `base` is the base "
        f"run; `transfer` is its recipe again with A, from the same fine-tuned teacher. Every sentence is scored on "
        f"its own. `kept` = accuracy / the FP32 teacher's on the same sentences, with its 95% paired bootstrap "
        f"interval.",
        "",
        f"![kept on test and on B]({json_path.with_suffix('.png').name})",
        "",
        f"| model | {result['data']} test | kept (95% interval) | B: held out | kept (95% interval) "
        f"| A: seen without labels | kept |",
        "|---|---:|---|---:|---|---:|---:|",
    ]
    for r in result["rows"]:
        ci = lambda k: f"{r[f'{k}_kept']:.3f} ({r[f'{k}_kept_ci'][0]:.3f}-{r[f'{k}_kept_ci'][1]:.3f})"  # noqa: E731
        lines.append(f"| {r['model']} | {r['test_accuracy']:.4f} | {ci('test')} | {r['B_accuracy']:.4f} | {ci('B')} "
                     f"| {r['A_accuracy']:.4f} | {r['A_kept']:.3f} |")
    return "\n".join(lines) + "\n"


def plot(rows: list, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shown = rows[1:]
    fig, ax = plt.subplots(figsize=(10, 5))
    width = 0.38
    for j, (key, name) in enumerate((("test", "test split"), ("B", "held-out half B"))):
        xs = [i + (j - 0.5) * width for i in range(len(shown))]
        kept = [r[f"{key}_kept"] for r in shown]
        err = [[k - r[f"{key}_kept_ci"][0] for k, r in zip(kept, shown)],
               [r[f"{key}_kept_ci"][1] - k for k, r in zip(kept, shown)]]
        ax.bar(xs, kept, width, yerr=err, capsize=3, label=name)
    ax.axhline(0.97, color="black", linestyle="--", linewidth=1, label="97% of the teacher")
    ax.set_xticks(range(len(shown)), [r["model"].replace(" student FP32", " (FP32)") for r in shown], fontsize=8,
                  rotation=30, ha="right")
    ax.set_ylim(0.8, 1.06)
    ax.set_ylabel("accuracy kept (95% interval)")
    ax.set_title("Accuracy kept, without (base) and with (transfer) the unlabelled half A in distill and prune")
    ax.legend(loc="upper center", ncol=3, fontsize=8)
    ax.grid(True, axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    from edgekit.cli import script

    sys.exit(script(main))
