"""Distillation targets (issue #3) on real assets: the teacher fine-tuned on rt-polarity, students distilled from
it, each FP32 student's accuracy on the rt-polarity test split next to its teacher's (accuracy_retained), and
out of domain on vader-amazon when that dataset asset is known to edgekit.

    python bench/distill_targets.py --teacher mpnet-base --variants six four
    python bench/distill_targets.py --teacher minilm-l6 --variants three
    python bench/distill_targets.py --from-run artifacts/distilbert-int8   # a finished run: evaluation only

Variants (distill settings over the distilbert-int8 recipe's):
  six    DistilBERT: every other teacher layer (6 of mpnet-base's 12), soft KD + CE + hidden cosine
  three  the same on minilm-l6 (3 of 6 layers): the distilbert-int8 student
  four   the tinybert-int8 recipe's distillation with a 4-layer, 384-wide student: minilm-l6's layers 0, 2, 3, 5
         (pretrained, same WordPiece pieces as mpnet-base); phase 1 embedding + attention + hidden MSE through
         learned 384 -> 768 projections, phase 2 soft KD + CE, on the training set plus 2 augmented copies of
         each sentence; the teacher's hidden states and attention maps cached once (cache_mb)
  four-kd  the same student and augmented set in one phase: soft KD (alpha 0.7) + CE + cosine through the
         projection (DistilBERT's losses), 3 epochs
  four-kd6  four-kd on up to 6 augmented copies of each sentence (60,485 extra), 2 epochs
  minilm-kd  four-kd with all 6 of minilm-l6's layers, 2 epochs: the 384-wide family's own ceiling
  four-kd-val  four-kd keeping layers 0, 2, 3, 4: of the 15 ways to keep 4 of 6 layers, the one that loses least
         validation accuracy before any training (bench/layer_drop.py on the --student model)
  four-kd-lr5, four-kd-lr2  four-kd at half (5e-5) and twice (2e-4) the learning rate
  four-kd-val-lr2  four-kd-val at 2e-4
The teacher is fine-tuned once and shared between variants (pipeline's shared stages). Results go to
bench/results/distill-targets-<teacher>.json and .md, rewritten after every variant. Each row also has both
models' accuracy on the validation split (`--add-validation` scores the stored rows whose run folders are here).
"""
import json
import sys
import time
from pathlib import Path

from edgekit import cli, data, pipeline, recipe as recipes, runtime
from edgekit.artifact import Artifact, write_json, write_text
from edgekit.stages import evaluate

FOUR = {"student": "minilm-l6", "layers": [0, 2, 3, 5], "cache_mb": 16000}
FOUR_KD = {**FOUR, "augment": 2, "alpha": 0.7, "epochs": 3.0}
VARIANTS = {
    "six": {"layers": "every_other"},
    "three": {"layers": "every_other"},
    "four": FOUR,
    "four-kd": FOUR_KD,
    "four-kd6": {**FOUR_KD, "augment": 6, "epochs": 2.0},
    "minilm-kd": {**FOUR_KD, "layers": "all", "epochs": 2.0},
    "four-kd-val": {**FOUR_KD, "layers": [0, 2, 3, 4]},
    "four-kd-lr5": {**FOUR_KD, "lr": 5e-5},
    "four-kd-lr2": {**FOUR_KD, "lr": 2e-4},
    "four-kd-val-lr2": {**FOUR_KD, "layers": [0, 2, 3, 4], "lr": 2e-4},
}
BASE = {"four": "tinybert-int8"}  # the others start from distilbert-int8


def recipe_for(teacher: str, variant: str, finetune_lr: float, epochs: float, student: str = None) -> dict:
    base = recipes.load(BASE.get(variant, "distilbert-int8"))
    base.update(teacher=teacher, stages=["finetune", "distill", "evaluate"], budgets={})
    base["finetune"] = {**base["finetune"], "lr": finetune_lr}
    base["distill"] = {**base["distill"], "epochs": epochs, **VARIANTS[variant]}
    if student:
        base["distill"]["student"] = student
    base["evaluate"] = {"split": "test"}
    for k in ("export", "quantize", "bench"):
        base.pop(k, None)
    return recipes.validate(base)


def out_of_domain(model_dir: Path, teacher_dir: Path, labels: list) -> dict:
    """Accuracy on vader-amazon (positive mean rating = the positive class of rt-polarity)."""
    examples = data.out_of_domain(labels)
    student = evaluate.accuracy(runtime.load(model_dir), examples, 64, False, "ood")
    teacher = evaluate.accuracy(runtime.load(teacher_dir), examples, 64, False, "ood teacher")
    return {"vader_amazon_accuracy": student, "vader_amazon_teacher_accuracy": teacher,
            "vader_amazon_retained": round(student / teacher, 4), "vader_amazon_examples": len(examples)}


def main():
    ap = cli.Parser(description=cli.description(__doc__))
    ap.add_argument("--teacher", default="mpnet-base",
                    help="the model fine-tuned as teacher: an asset or a folder (default mpnet-base)")
    ap.add_argument("--variants", nargs="+", default=["six", "four"], choices=list(VARIANTS),
                    help="the students to distill, named above (default six four)")
    ap.add_argument("--finetune-lr", type=float, default=5e-5, help="the teacher's fine-tuning learning rate "
                                                                    "(default 5e-5)")
    ap.add_argument("--epochs", type=float, default=2.0, help="distillation epochs (default 2; a variant that sets "
                                                              "its own keeps it)")
    ap.add_argument("--student", default=None, help="a model folder or asset name in place of the variant's student "
                    "(e.g. an already fine-tuned minilm-l6); the row is named VARIANT@STUDENT")
    ap.add_argument("--runs", default="artifacts/distill-targets",
                    help="folder for the runs, one per teacher (default artifacts/distill-targets)")
    ap.add_argument("--out", default=None, help="the result JSON (default "
                                                "bench/results/distill-targets-<teacher>.json)")
    ap.add_argument("--from-run", default=None, help="a finished run with finetune and distill stages")
    ap.add_argument("--add-validation", action="store_true", help="score the students of the stored rows whose "
                    "run folders are still here on the validation split (no training)")
    args = ap.parse_args()
    if args.from_run:
        return from_run(Path(args.from_run), args.out)
    out = Path(args.out or f"bench/results/distill-targets-{args.teacher}.json")
    root = Path(args.runs) / args.teacher
    if args.add_validation:
        if not out.is_file():
            sys.exit(f"distill_targets: --add-validation: no results at {out}; run some --variants first")
        result = json.loads(out.read_text())
        for row in result["rows"]:
            run_dir = run_folder(root, row["variant"])
            if (run_dir / "manifest.json").is_file():
                row.update(validation(run_dir))
        return write(out, result)
    for variant in args.variants:
        name = f"{variant}@{args.student}" if args.student else variant
        started = time.time()
        recipe = recipe_for(args.teacher, variant, args.finetune_lr, args.epochs, args.student)
        run_dir = run_folder(root, name)
        manifest = pipeline.run(recipe, run_dir, progress=True, shared=root / "shared")
        stages = {s["name"]: s for s in manifest["stages"]}
        final = stages["evaluate"]["metrics"]
        student_dir = run_dir / stages["distill"]["output"]["path"]
        teacher_dir = run_dir / stages["finetune"]["output"]["path"]
        row = {"teacher": args.teacher, "variant": name, "distill": recipe["distill"],
               "student_params": stages["distill"]["metrics"]["params"],
               "teacher_params": stages["finetune"]["metrics"]["params"],
               "accuracy": final["accuracy"], "teacher_accuracy": final["teacher_accuracy"],
               "accuracy_retained": final["accuracy_retained"], "test_examples": final["eval_examples"],
               "finetune_minutes": round(stages["finetune"]["seconds"] / 60, 1),
               "distill_minutes": round(stages["distill"]["seconds"] / 60, 1),
               "wall_minutes": round((time.time() - started) / 60, 1),
               **out_of_domain(student_dir, teacher_dir, manifest["data"]["labels"]), **validation(run_dir)}
        rows = json.loads(out.read_text()).get("rows", []) if out.is_file() else []  # another run may have added rows
        write(out, {"run": str(root), "rows": [r for r in rows if r["variant"] != name] + [row]})
        print(json.dumps(row), file=sys.stderr)


def run_folder(root: Path, name: str) -> Path:
    """Where a row's run lives: its name with the --student path flattened into one folder."""
    return (root / name.replace("/", "_")).resolve()


def validation(run_dir: Path) -> dict:
    """Student and teacher accuracy on the validation split, beside the test split's: a choice between variants
    made on test accuracy can be checked against data no choice looked at."""
    manifest, ctx = pipeline.context_of(run_dir, progress=False)
    stages = {s["name"]: s for s in manifest["stages"]}
    student = evaluate.accuracy(runtime.load(run_dir / stages["distill"]["output"]["path"]), ctx.splits.validation,
                                64, False, "validation")
    teacher = evaluate.accuracy(runtime.load(ctx.teacher.path), ctx.splits.validation, 64, False, "validation teacher")
    return {"validation_accuracy": student, "validation_teacher_accuracy": teacher,
            "validation_retained": round(student / teacher, 4)}


def from_run(run: Path, out: str) -> None:
    """The FP32 student of a finished run against its teacher, in and out of domain (no training)."""
    manifest, ctx = pipeline.context_of(run)
    stages = {s["name"]: s for s in manifest["stages"]}
    if not {"finetune", "distill"} <= set(stages):
        sys.exit(f"distill_targets: --from-run {run}: it ran {', '.join(stages)}; give a run with finetune and distill")
    student = Artifact.from_json(stages["distill"]["output"], run.resolve())
    acc = evaluate.accuracy(runtime.load(student.path), ctx.splits.test, 64, True, "student")
    teacher = evaluate.accuracy(runtime.load(ctx.teacher.path), ctx.splits.test, 64, True, "teacher")
    final = stages.get("evaluate", {}).get("metrics", {})
    row = {"teacher": manifest["recipe"]["teacher"], "variant": f"{manifest['recipe']['name']} (run {run})",
           "distill": manifest["recipe"]["distill"], "student_params": stages["distill"]["metrics"]["params"],
           "teacher_params": stages["finetune"]["metrics"]["params"], "accuracy": acc, "teacher_accuracy": teacher,
           "accuracy_retained": round(acc / teacher, 4), "test_examples": len(ctx.splits.test),
           "final_artifact_accuracy": final.get("accuracy"), "final_artifact_retained": final.get("accuracy_retained"),
           "finetune_minutes": round(stages["finetune"]["seconds"] / 60, 1),
           "distill_minutes": round(stages["distill"]["seconds"] / 60, 1),
           **out_of_domain(student.path, ctx.teacher.path, manifest["data"]["labels"]), **validation(run)}
    out = Path(out or f"bench/results/distill-targets-{row['teacher']}.json")
    rows = json.loads(out.read_text()).get("rows", []) if out.is_file() else []
    write(out, {"run": str(run), "rows": [r for r in rows if r["variant"] != row["variant"]] + [row]})
    print(json.dumps(row), file=sys.stderr)


def write(out: Path, result: dict) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    write_json(out, result)
    lines = ["| teacher | student | params | accuracy | teacher | retained | vader-amazon retained | validation retained "
             "| distill min |", "|---|---|---|---|---|---|---|---|---|"]
    for r in result["rows"]:
        lines.append(f"| {r['teacher']} | {r['variant']} | {r['student_params'] / 1e6:.1f}M | {r['accuracy']:.4f} | "
                     f"{r['teacher_accuracy']:.4f} | {r['accuracy_retained']:.3f} | "
                     f"{r.get('vader_amazon_retained', 'n/a')} | {r.get('validation_retained', 'n/a')} | "
                     f"{r['distill_minutes']} |")
    write_text(out.with_suffix(".md"), "\n".join(lines) + "\n")


if __name__ == "__main__":
    from edgekit.cli import script

    sys.exit(script(main))
