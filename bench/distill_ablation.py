"""Which distillation losses help on this data: one teacher, one student shape, one budget, a row per loss mix
with the student's test accuracy and the minutes distillation took (teacher outputs, augmentation and training).

    python bench/distill_ablation.py [--teacher minilm-l6] [--max-train 3000] [--epochs 1] [--mixes ce kd ...]
                                     [--teacher-run RUN_DIR]

The teacher is fine-tuned once on all of rt-polarity's training split (the distilbert-int8 recipe's finetune
settings) and reused on later calls, or taken from a finished run with a finetune stage (--teacher-run); the students (every other teacher layer) are distilled on the first
--max-train training sentences, so the budget is small and the differences between mixes show. Accuracy is on the
whole test split. Results: bench/results/distill-ablation-<teacher>.json and .md, rewritten after every mix.
"""
import json
import shutil
import sys
import time
from pathlib import Path

from edgekit import cli, pipeline, recipe as recipes, runtime
from edgekit.artifact import Artifact, write_json, write_text
from edgekit.stages import distill, evaluate

OFF = {"alpha": 0.5, "cosine": 0.0}
MIXES = {
    "ce": {"alpha": 0.0, "cosine": 0.0},                                    # no distillation: labels only
    "kd": {"alpha": 1.0, "cosine": 0.0},                                    # Hinton: soft labels only
    "kd+ce": OFF,
    "kd+ce+cos": {"alpha": 0.5, "cosine": 1.0},                             # DistilBERT (distilbert-int8)
    "kd+ce+pkd": {**OFF, "pkd": 1.0},                                       # PKD [CLS] per layer
    "kd+ce+hid+att+emb": {**OFF, "hidden": 1.0, "attention": 1.0, "embedding": 1.0},  # TinyBERT terms, one phase
    "tinybert-2phase": {**OFF, "hidden": 1.0, "attention": 1.0, "embedding": 1.0, "intermediate_epochs": 1.0},
    "tinybert-2phase+aug2": {**OFF, "hidden": 1.0, "attention": 1.0, "embedding": 1.0, "intermediate_epochs": 1.0,
                             "augment": 2},
}


def teacher_run(teacher: str, root: Path) -> Path:
    base = recipes.load("distilbert-int8")
    base.update(teacher=teacher, stages=["finetune"], budgets={})
    for k in ("distill", "export", "quantize", "evaluate", "bench"):
        base.pop(k, None)
    run = root / "teacher"
    pipeline.run(recipes.validate(base), run, progress=True)
    return run


def main():
    ap = cli.Parser(description=cli.description(__doc__))
    ap.add_argument("--teacher", default="minilm-l6", help="the model fine-tuned as teacher: an asset or a folder "
                                                           "(default minilm-l6)")
    ap.add_argument("--max-train", type=int, default=3000,
                    help="training sentences the students are distilled on (default 3000)")
    ap.add_argument("--epochs", type=float, default=1.0, help="distillation epochs per mix (default 1)")
    ap.add_argument("--mixes", nargs="+", default=list(MIXES), choices=list(MIXES),
                    help="the loss mixes to run (default: all)")
    ap.add_argument("--runs", default="artifacts/distill-ablation",
                    help="folder for the teacher and student runs (default artifacts/distill-ablation)")
    ap.add_argument("--teacher-run", default=None, help="a finished run whose finetune stage is the teacher")
    args = ap.parse_args()
    root = Path(args.runs) / args.teacher
    out = Path(f"bench/results/distill-ablation-{args.teacher}.json")
    _, ctx = pipeline.context_of(Path(args.teacher_run) if args.teacher_run else teacher_run(args.teacher, root))
    if args.teacher_run:  # a copy, so the other run may go on or be removed
        shutil.rmtree(root / "teacher-model", ignore_errors=True)
        shutil.copytree(ctx.teacher.path, root / "teacher-model")
        ctx.teacher = Artifact(root / "teacher-model", "hf")
    ctx.splits.train = ctx.splits.train[:args.max_train]
    teacher_acc = evaluate.accuracy(runtime.load(ctx.teacher.path), ctx.splits.test, 64, True, "teacher")
    result = json.loads(out.read_text()) if out.is_file() else {}
    rows = {r["mix"]: r for r in result.get("rows", []) if result.get("max_train") == args.max_train}
    for mix in args.mixes:
        started = time.time()
        settings = {"epochs": args.epochs, **MIXES[mix]}
        shutil.rmtree(root / mix, ignore_errors=True)  # a checkpoint of other settings must not be resumed
        student = distill.run(ctx.teacher, root / mix, ctx, **settings)
        minutes = (time.time() - started) / 60
        acc = evaluate.accuracy(runtime.load(student.path), ctx.splits.test, 64, True, mix)
        rows[mix] = {"mix": mix, "settings": settings, "accuracy": acc, "retained": round(acc / teacher_acc, 4),
                     "distill_minutes": round(minutes, 2), "train_loss": student.metrics["train_loss"],
                     "augmented_examples": student.metrics.get("augmented_examples", 0)}
        result = {"teacher": args.teacher, "teacher_model": str(ctx.teacher.path), "teacher_accuracy": teacher_acc, "max_train": args.max_train,
                  "epochs": args.epochs, "student_layers": student.metrics["student_layers"],
                  "test_examples": len(ctx.splits.test), "rows": list(rows.values())}
        write(out, result)
        print(json.dumps(rows[mix]), file=sys.stderr)


def write(out: Path, result: dict) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    write_json(out, result)
    lines = [f"Teacher {result['teacher']} (test accuracy {result['teacher_accuracy']:.4f}); student: teacher layers "
             f"{result['student_layers']}; {result['max_train']} training sentences, {result['epochs']} epoch(s) of "
             f"prediction-layer distillation; {result['test_examples']} test sentences.", "",
             "| loss mix | accuracy | retained | distill minutes | augmented sentences |", "|---|---|---|---|---|"]
    for r in result["rows"]:
        lines.append(f"| {r['mix']} | {r['accuracy']:.4f} | {r['retained']:.3f} | {r['distill_minutes']} | "
                     f"{r['augmented_examples']} |")
    write_text(out.with_suffix(".md"), "\n".join(lines) + "\n")


if __name__ == "__main__":
    from edgekit.cli import script

    sys.exit(script(main))
