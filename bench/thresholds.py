"""What tuned thresholds buy a multi-label run: each label decided at 0.5, and at thresholds tuned for its F1.

A multi-label model gives a label where the label's sigmoid is over its threshold: 0.5 by default, or with the
recipe's `thresholds: f1` each label's own, tuned on the validation split (of 0.05, 0.10, ... 0.95, the one with
the label's best F1). This bench tunes both models of a finished multi-label run, its teacher and its final file,
on the run's validation split with each one's own logits, and scores each on the test split both ways (the
final file one sentence at a time, as a device runs it): exact-match accuracy, micro-F1, each label's recall and
precision, and the final model's share of its teacher's micro-F1 under each rule.

    python bench/thresholds.py RUN [--out bench/results/thresholds.json]

Writes the JSON and a markdown table beside it (--out: elsewhere).
"""
from pathlib import Path

import numpy as np

from edgekit import cli, pipeline, runtime
from edgekit.artifact import write_json, write_text
from edgekit.stages import evaluate


def main(argv=None):
    p = cli.Parser(description=cli.description(__doc__))
    p.add_argument("run", type=Path, help="a finished run on multi-label data, with an evaluate stage")
    p.add_argument("--out", type=Path, default=Path("bench/results/thresholds.json"),
                   help="the result JSON, its .md beside it (default bench/results/thresholds.json)")
    a = p.parse_args(argv)
    manifest, ctx = pipeline.context_of(a.run)
    if not ctx.splits.multi_label:
        p.error(f"{a.run} is a run on single-label data: its models take the largest logit, no thresholds")
    if not ctx.splits.validation:
        p.error(f"{a.run} has no validation rows to tune thresholds on; give its data a validation split")
    test, labels = ctx.splits.test, ctx.splits.labels
    models = {"teacher": (runtime.load(ctx.teacher.path, max_length=ctx.max_length), 64),
              "final": (runtime.load(a.run / manifest["final"]["path"], max_length=ctx.max_length), 1)}
    result = {"run": str(a.run), "final": manifest["final"]["path"], "labels": labels, "examples": len(test),
              "final_decides_at": models["final"][0].thresholds or 0.5, "thresholds": {}, "rows": []}  # its file's
    for name, (model, batch) in models.items():
        result["thresholds"][name] = tuned = evaluate.tuned_thresholds(evaluate.logits_of(
            model, ctx.splits.validation, batch, ctx.progress, f"tune {name}"), ctx.splits.validation)
        logits = evaluate.logits_of(model, test, batch, ctx.progress, f"score {name}")
        for rule, cuts in (("0.5", None), ("f1", tuned)):
            result["rows"].append({"model": name, "thresholds": rule, **scores(runtime.decided(logits, True, cuts),
                                                                                test, labels)})
    for rule in ("0.5", "f1"):
        teacher, final = (next(r for r in result["rows"] if r["model"] == m and r["thresholds"] == rule)
                          for m in ("teacher", "final"))
        final["f1_micro_retained"] = final["f1_micro"] / teacher["f1_micro"] if teacher["f1_micro"] else None
    write_json(a.out, result)
    write_text(a.out.with_suffix(".md"), markdown(result))
    print(markdown(result), end="")


def scores(said: list, examples: list, labels: list) -> dict:
    """Exact-match accuracy, micro-F1, and each label's recall and precision (None where nothing to divide)."""
    gold, said = np.array([y for _, y in examples]) == 1, np.array(said) == 1
    per_label = {}
    for k, name in enumerate(labels):
        hits = (said[:, k] & gold[:, k]).sum()
        per_label[name] = {"examples": int(gold[:, k].sum()),
                           "recall": float(hits / gold[:, k].sum()) if gold[:, k].any() else None,
                           "precision": float(hits / said[:, k].sum()) if said[:, k].any() else None}
    return {"accuracy": float((said == gold).all(1).mean()), "f1_micro": evaluate.f1_micro(
        [tuple(map(int, row)) for row in said], examples), "per_label": per_label}


def markdown(result: dict) -> str:
    labels = result["labels"]

    def cell(v) -> str:
        return "-" if v is None else f"{v:.4f}"

    def cuts(name: str) -> str:
        return ", ".join(f"{n} {t}" for n, t in zip(labels, result["thresholds"][name]))

    lines = [f"Run `{result['run']}` (final model {result['final']}, which decides at {result['final_decides_at']}), "
             f"{result['examples']} test sentences. Thresholds tuned for each label's F1 on the validation split "
             f"(f1): teacher {cuts('teacher')}; final {cuts('final')}.", "",
             "| model | thresholds | exact-match | micro-F1 | micro-F1 kept | "
             + " | ".join(f"{n} recall / precision" for n in labels) + " |",
             "|---|---|---:|---:|---:|" + "---:|" * len(labels)]
    for r in result["rows"]:
        lines.append(f"| {r['model']} | {r['thresholds']} | {cell(r['accuracy'])} | {cell(r['f1_micro'])} | "
                     f"{cell(r.get('f1_micro_retained'))} | "
                     + " | ".join(f"{cell(r['per_label'][n]['recall'])} / {cell(r['per_label'][n]['precision'])}"
                                  for n in labels) + " |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
