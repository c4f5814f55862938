"""evaluate: accuracy of any artifact through runtime.load, the same way for every format, next to the
teacher's accuracy on the same split (accuracy_retained = artifact / teacher).

Artifacts are scored one sentence at a time (batch_size 1), as a device runs them: dynamic INT8 computes its
activation ranges over the whole input tensor, so in a padded batch the padding and the other sentences change a
sentence's prediction (measured on minilm-l6 INT8 ONNX: 0.53 points lost at batch 64, none at batch 1). The
PyTorch teacher does not depend on its batch and is scored in batches of 64.

accuracy_retained comes with its 95% paired bootstrap interval over the split's sentences: on ~1,000 sentences a
point or two either way is what the split itself moves, and a budget bound inside the interval says so."""
import json
import sys
from collections import Counter
from pathlib import Path

import numpy as np
from tqdm import tqdm

from edgekit import runtime
from edgekit.artifact import Artifact
from edgekit.errors import EdgekitError

REVISION = 3  # 2: a transformers folder (the teacher) is truncated at the recipe's max_length, not at 512
# 3: accuracy_retained_interval


LIMITS = {"split": ("validation", "test")}  # and recipe.COMMON


def run(artifact: Artifact, out_dir: Path, ctx, *, split: str = "test", batch_size: int = 1) -> Artifact:
    examples = getattr(ctx.splits, split)
    if not examples:
        raise EdgekitError(f"the {split} split is empty; evaluate another split or give more data")
    out_dir.mkdir(parents=True, exist_ok=True)
    teacher_hits = correct(runtime.load(ctx.teacher.path, max_length=ctx.max_length), examples, 64, ctx.progress,
                           "evaluate teacher")  # truncated where the student was trained and exported
    teacher = round(sum(teacher_hits) / len(examples), 4)
    counts = Counter(label for _, label in examples)
    top, n_top = counts.most_common(1)[0]
    majority = round(n_top / len(examples), 4)  # what always answering the commonest class scores
    if teacher <= majority:
        tqdm.write(f"edgekit: warning: the teacher scores {teacher:.4f} on {split}, no better than always answering "
                   f"'{ctx.splits.labels[top]}' ({majority:.4f}): accuracy and accuracy_retained say little here; "
                   f"check that the teacher is fine-tuned for these labels and reads them in the data's order "
                   f"({', '.join(ctx.splits.labels)})", file=sys.stderr)
    measured = {}
    for name, a in artifact.all().items():  # every target's artifact, when there are several
        hits = correct(runtime.load(a.path, max_length=ctx.max_length), examples, batch_size, ctx.progress,
                       f"evaluate {name}")
        score = round(sum(hits) / len(examples), 4)
        measured[name] = {"accuracy": score, "teacher_accuracy": teacher,
                          "accuracy_retained": round(score / teacher, 4) if teacher else None,
                          "accuracy_retained_interval": kept_interval(hits, teacher_hits) if teacher else None,
                          "majority_accuracy": majority, "eval_split": split, "eval_examples": len(examples)}
    (out_dir / "metrics.json").write_text(json.dumps(measured, indent=2))
    outputs = {name: Artifact(a.path, a.kind, {**a.metrics, **measured[name]}) for name, a in artifact.outputs.items()}
    first = next(iter(measured.values()))
    return Artifact(artifact.path, artifact.kind, {**artifact.metrics, **first}, outputs)


def accuracy(model, examples: list, batch_size: int, progress: bool, desc: str) -> float:
    hits = correct(model, examples, batch_size, progress, desc)
    return round(sum(hits) / len(hits), 4)


def correct(model, examples: list, batch_size: int, progress: bool, desc: str) -> list:
    """Per example, in order: whether the model predicts its label."""
    hits = []
    with tqdm(total=len(examples), desc=desc, unit="ex", disable=not progress, dynamic_ncols=True) as bar:
        for s in range(0, len(examples), batch_size):
            chunk = examples[s:s + batch_size]
            predicted = model.logits(model.encode([t for t, _ in chunk])).argmax(-1)
            hits += [bool(p == label) for p, (_, label) in zip(predicted, chunk)]
            bar.update(len(chunk))
    return hits


def kept_interval(hits: list, teacher_hits: list, draws: int = 2000, seed: int = 0) -> list:
    """95% paired bootstrap interval of (accuracy / the teacher's accuracy) on the same examples: each draw resamples
    the examples with replacement and scores both on that draw, so what the two get right together is not noise."""
    m, t = np.asarray(hits, bool), np.asarray(teacher_hits, bool)
    if len(m) != len(t) or not len(m):
        raise ValueError(f"per-example results for {len(m)} and {len(t)} examples: score both on the same split")
    index = np.random.default_rng(seed).integers(0, len(m), (draws, len(m)))
    ratio = m[index].sum(1) / np.maximum(t[index].sum(1), 1)
    return [round(float(q), 4) for q in np.percentile(ratio, [2.5, 97.5])]
