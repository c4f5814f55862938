"""evaluate: accuracy of any artifact through runtime.load, the same way for every format, next to the
teacher's accuracy on the same split (accuracy_retained = artifact / teacher).

Artifacts are scored one sentence at a time (batch_size 1), as a device runs them: dynamic INT8 computes its
activation ranges over the whole input tensor, so in a padded batch the padding and the other sentences change a
sentence's prediction (measured on minilm-l6 INT8 ONNX: 0.53 points lost at batch 64, none at batch 1). The
PyTorch teacher does not depend on its batch and is scored in batches of 64.

accuracy_retained comes with its 95% paired bootstrap interval over the split's sentences: on ~1,000 sentences a
point or two either way is what the split itself moves, and a budget bound inside the interval says so.

A multi-label model is right on a sentence when it gives exactly the sentence's set of labels (exact-match, or
subset, accuracy); each label's recall is over the sentences that have it, and f1_micro (every label decision of
every sentence pooled) stands beside the teacher's. Each label applies over the model's threshold: the recipe's
`thresholds` (0.5 by default; one probability for every label; or f1, each label's tuned on the validation split:
cuts_for), which tune_folder writes into a trained folder's config and export into model.json; the teacher decides
at the same setting."""
import json
import sys
from collections import Counter
from pathlib import Path

import numpy as np
from tqdm import tqdm

from edgekit import data, runtime
from edgekit.artifact import Artifact, write_json
from edgekit.errors import EdgekitError
from edgekit.progress import bar as progress_bar

REVISION = 8  # 2: a transformers folder (the teacher) is truncated at the recipe's max_length, not at 512
# 3: accuracy_retained_interval; 4: per_class (each class's recall, the teacher's beside it), class_recall_retained
# 5: scores unrounded, accuracy_retained from the two counts (a ratio of scores rounded to 4 places read 969/999
# right, 0.96997, as 0.97 and passed `>= 0.97`); 6: the interval leaves out draws where the teacher gets nothing right
# 7: a multi-label model's f1_micro_retained and its interval; 8: a multi-label model's per-label precision and F1,
# label_f1_retained


LIMITS = {"split": ("validation", "test")}  # and recipe.COMMON


def run(artifact: Artifact, out_dir: Path, ctx, *, split: str = "test", batch_size: int = 1) -> Artifact:
    examples = getattr(ctx.splits, split)
    if not examples:
        raise EdgekitError(f"the {split} split is empty; evaluate another split or give more data")
    out_dir.mkdir(parents=True, exist_ok=True)
    teacher_said = predictions(teacher_of(ctx), examples, 64, ctx.progress, "evaluate teacher")
    teacher_hits = matches(teacher_said, examples)
    teacher = sum(teacher_hits) / len(examples)  # unrounded, as every score here: a budget compares them
    counts = Counter(label for _, label in examples)
    top, n_top = counts.most_common(1)[0]
    majority = n_top / len(examples)  # what always answering the commonest class scores
    if teacher <= majority:
        tqdm.write(f"edgekit: warning: the teacher scores {teacher:.4f} on {split}, no better than always answering "
                   f"'{data.label_text(ctx.splits.labels, top)}' ({majority:.4f}): accuracy and accuracy_retained say "
                   f"little here; "
                   f"check that the teacher is fine-tuned for these labels and reads them in the data's order "
                   f"({', '.join(ctx.splits.labels)})", file=sys.stderr)
    measured = {}
    for name, a in artifact.all().items():  # every target's artifact, when there are several
        said = predictions(runtime.load(a.path, max_length=ctx.max_length), examples, batch_size, ctx.progress,
                           f"evaluate {name}")
        hits = matches(said, examples)
        measured[name] = {"accuracy": sum(hits) / len(examples), "teacher_accuracy": teacher,  # the share kept
                          "accuracy_retained": sum(hits) / sum(teacher_hits) if teacher else None,  # from counts
                          "accuracy_retained_interval": kept_interval(hits, teacher_hits) if teacher else None,
                          "majority_accuracy": majority, "eval_split": split, "eval_examples": len(examples),
                          "per_class": (classes := per_class(said, teacher_said, examples, ctx.splits.labels)),
                          "class_recall_retained": lowest_kept(classes),
                          "class_recall_measured": [sum(c["teacher_recall"] > 0 for c in classes.values()),
                                                    len(classes)],
                          **(dict(f1_measures(said, teacher_said, examples),
                                  label_f1_retained=lowest_f1_kept(said, teacher_said, examples))
                             if ctx.splits.multi_label else {})}
    (out_dir / "metrics.json").write_text(json.dumps(measured, indent=2))
    outputs = {name: Artifact(a.path, a.kind, {**a.metrics, **measured[name]}) for name, a in artifact.outputs.items()}
    first = next(iter(measured.values()))
    return Artifact(artifact.path, artifact.kind, {**artifact.metrics, **first}, outputs)


def teacher_of(ctx):
    """The run's teacher, loaded as evaluate scores it: truncated where the student was trained and exported; a
    multi-label teacher decides at the run's thresholds as every model of the run does (cuts_for; never at ones
    another run left in its config)."""
    model = runtime.load(ctx.teacher.path, max_length=ctx.max_length)
    if ctx.splits.multi_label:
        model.thresholds = cuts_for(ctx.teacher.path, ctx, model)
    return model


def accuracy(model, examples: list, batch_size: int, progress: bool, desc: str) -> float:
    hits = correct(model, examples, batch_size, progress, desc)
    return round(sum(hits) / len(hits), 4)


def correct(model, examples: list, batch_size: int, progress: bool, desc: str) -> list:
    """Per example, in order: whether the model predicts its label."""
    return matches(predictions(model, examples, batch_size, progress, desc), examples)


def matches(said: list, examples: list) -> list:
    """Per example, in order: whether the class said for it is its label."""
    return [p == label for p, (_, label) in zip(said, examples)]


def predictions(model, examples: list, batch_size: int, progress: bool, desc: str) -> list:
    """Per example, in order: the class id the model predicts (multi-label: its 0/1 per label over the model's
    thresholds, runtime.decided)."""
    return runtime.decided(logits_of(model, examples, batch_size, progress, desc), getattr(model, "multi_label", False),
                           getattr(model, "thresholds", None))


def logits_of(model, examples: list, batch_size: int, progress: bool, desc: str) -> np.ndarray:
    """The model's logits for each example, in order (examples x labels). Batches (the teacher's 64) are of
    sentences of about one length, so padding is not half the tokens (rt-polarity's test split in file order: 2.07x
    the real tokens, the teacher's pass twice as long); each sentence's logits are its own either way."""
    order = sorted(range(len(examples)), key=lambda i: len(str(examples[i][0]))) if batch_size > 1 else \
        range(len(examples))
    out = [None] * len(examples)
    with progress_bar(total=len(examples), desc=desc, unit="ex", disable=not progress) as bar:
        for s in range(0, len(examples), batch_size):
            chunk = order[s:s + batch_size]
            for i, row in zip(chunk, model.logits(model.encode([examples[i][0] for i in chunk]))):
                out[i] = row
            bar.update(len(chunk))
    return np.stack(out)


GRID = tuple(round(0.05 * i, 2) for i in range(1, 20))  # the thresholds tried: 0.05, 0.10, ... 0.95


def tuned_thresholds(logits: np.ndarray, examples: list) -> list:
    """Per label, the probability threshold (of GRID) under which the label's decisions on these examples have the
    best F1 (ties: the one nearest 0.5); 0.5 for a label no example has. A rare label, which a compressed model's
    sigmoid seldom takes over 0.5, keeps its recall this way."""
    gold, logits = np.array([label for _, label in examples]) == 1, np.asarray(logits)
    out = []
    for k in range(gold.shape[1]):
        def f1(t: float) -> float:
            said = logits[:, k] > runtime.logit(t)
            return 2 * (said & gold[:, k]).sum() / (2 * (said & gold[:, k]).sum() + (said != gold[:, k]).sum())

        out.append(max(GRID, key=lambda t: (f1(t), -abs(t - 0.5))) if gold[:, k].any() else 0.5)
    return out


def cuts_for(path: Path, ctx, model=None) -> list | None:
    """The thresholds a run gives the multi-label transformers folder at `path` (the recipe's `thresholds`): None
    for 0.5 (a logit over 0), and for single-label data; a probability for every label; or, for "f1", each label's
    tuned on the validation split with the folder's own logits (tuned_thresholds; None without validation rows).
    `model`: the folder already loaded (runtime.load at the run's max_length)."""
    if not ctx.splits.multi_label or ctx.thresholds == 0.5 or (ctx.thresholds == "f1" and not ctx.splits.validation):
        return None
    if ctx.thresholds != "f1":
        return [float(ctx.thresholds)] * len(ctx.splits.labels)
    model = model or runtime.HFModel(path, max_length=ctx.max_length)
    return tuned_thresholds(logits_of(model, ctx.splits.validation, 64, ctx.progress, "tune thresholds"),
                            ctx.splits.validation)


def tune_folder(folder: Path, ctx) -> list | None:
    """A trained multi-label folder's thresholds (cuts_for), written into its config.json as edgekit_thresholds,
    which edgekit.load decides by (and none where the run's are 0.5: a student's config may carry its teacher's)."""
    if not ctx.splits.multi_label:
        return None
    config = json.loads((folder / "config.json").read_text())
    config.pop("edgekit_thresholds", None)
    if cuts := cuts_for(folder, ctx):
        config["edgekit_thresholds"] = cuts
    write_json(folder / "config.json", config)
    return cuts


def per_class(said: list, teacher_said: list, examples: list, labels: list) -> dict:
    """{label: {examples, recall, teacher_recall}}, each class's share of sentences predicted as that class: where
    compression costs a class more than the accuracy says (a minority class first). For a multi-label model also
    each label's precision (None where it is never said) and F1, and the teacher's: a label said on every sentence
    has all its recall and little precision, which a lower threshold trades for."""
    def has(y, c) -> bool:  # a multi-label example (a 0/1 tuple) may have several
        return y[c] == 1 if isinstance(y, tuple) else y == c

    out = {}
    for c, name in enumerate(labels):
        rows = [i for i, (_, label) in enumerate(examples) if has(label, c)]
        if not rows:
            continue
        out[name] = {"examples": len(rows)}
        for prefix, by in (("", said), ("teacher_", teacher_said)):
            hit = sum(has(by[i], c) for i in rows)
            out[name][f"{prefix}recall"] = hit / len(rows)
            if isinstance(examples[0][1], tuple):
                told = sum(has(y, c) for y in by)  # sentences it gives this label: hits and false alarms
                out[name][f"{prefix}precision"] = hit / told if told else None
                out[name][f"{prefix}f1"] = 2 * hit / (len(rows) + told)  # 2 TP / (2 TP + FP + FN)
    return out


def f1_micro(said: list, examples: list) -> float | None:
    """Multi-label F1 over every (sentence, label) decision pooled: 2 TP / (2 TP + FP + FN); None with no label
    given or said anywhere."""
    tp = sum(p == g == 1 for y, (_, label) in zip(said, examples) for p, g in zip(y, label))
    wrong = sum(p != g for y, (_, label) in zip(said, examples) for p, g in zip(y, label))
    return 2 * tp / (2 * tp + wrong) if tp or wrong else None


def f1_measures(said: list, teacher_said: list, examples: list) -> dict:
    """A multi-label model's f1_micro, the teacher's, and the share kept (from the two, with its 95% interval; None
    where the teacher's is 0 or undefined)."""
    mine, teacher = f1_micro(said, examples), f1_micro(teacher_said, examples)
    kept = mine is not None and bool(teacher)
    return {"f1_micro": mine, "teacher_f1_micro": teacher, "f1_micro_retained": mine / teacher if kept else None,
            "f1_micro_retained_interval": f1_kept_interval(said, teacher_said, examples) if kept else None}


def lowest_kept(classes: dict) -> float | None:
    """The lowest share of its teacher's recall that a class keeps (classes the teacher never gets right left out;
    None where that is every class): a budget on it bounds what compression costs the worst-served class."""
    kept = [round(c["recall"] * c["examples"]) / round(c["teacher_recall"] * c["examples"])  # the counts: their ratio
            for c in classes.values() if c["teacher_recall"] > 0]  # is the exact one, as accuracy_retained's
    return min(kept) if kept else None


def lowest_f1_kept(said: list, teacher_said: list, examples: list) -> float | None:
    """A multi-label model's lowest share of its teacher's F1 that any label keeps (labels the teacher never says
    rightly left out, as lowest_kept leaves them; None where that is every label): a budget on it bounds what
    compression costs the worst-served label, precision included. From the counts, one division: the F1 ratio
    2 TP / (n + said) over the teacher's is TP (n + teacher said) / ((n + said) TP teacher)."""
    def counts(by, k) -> tuple:  # (sentences with label k, said k rightly, said k)
        return (sum(label[k] for _, label in examples),
                sum(y[k] == label[k] == 1 for y, (_, label) in zip(by, examples)), sum(y[k] for y in by))

    kept = []
    for k in range(len(examples[0][1])):
        (n, tp, told), (_, tp_t, told_t) = counts(said, k), counts(teacher_said, k)
        if n and tp_t:
            kept.append(tp * (n + told_t) / ((n + told) * tp_t))
    return min(kept) if kept else None


def worst_class(classes: dict, key: str = "recall") -> tuple:
    """(label, its numbers) of the class whose recall (or `key`: a multi-label run's f1) fell most against the
    teacher's; None where none fell."""
    worst = max(classes.items(), key=lambda c: c[1][f"teacher_{key}"] - c[1][key], default=None)
    return worst if worst and worst[1][f"teacher_{key}"] > worst[1][key] else None


def kept_interval(hits: list, teacher_hits: list, draws: int = 2000, seed: int = 0) -> list:
    """95% paired bootstrap interval of (accuracy / the teacher's accuracy) on the same examples: each draw resamples
    the examples with replacement and scores both on that draw, so what the two get right together is not noise. A
    draw where the teacher gets nothing right has no ratio and is left out (it counted as the model's hits / 1); None
    when no draw has one."""
    m, t = np.asarray(hits, bool), np.asarray(teacher_hits, bool)
    if len(m) != len(t) or not len(m):
        raise ValueError(f"per-example results for {len(m)} and {len(t)} examples: score both on the same split")
    return bootstrap(np.stack([m, t], 1), lambda s: (s[:, 0] / np.maximum(s[:, 1], 1), s[:, 1] > 0), draws, seed)


def f1_kept_interval(said: list, teacher_said: list, examples: list, draws: int = 2000, seed: int = 0) -> list:
    """95% paired bootstrap interval of (f1_micro / the teacher's f1_micro), as kept_interval's: each draw pools the
    label decisions of the sentences it drew, for both models; draws where the teacher gets no label right are left
    out."""
    def counts(y, label) -> tuple:  # one sentence's true positives and wrong decisions
        return sum(p == g == 1 for p, g in zip(y, label)), sum(p != g for p, g in zip(y, label))

    rows = np.array([counts(y, label) + counts(t, label) for y, t, (_, label) in zip(said, teacher_said, examples)],
                    np.int32).reshape(-1, 4)
    if not len(rows):
        raise ValueError("no examples: score both on the same split")

    def ratio(s):
        mine = 2 * s[:, 0] / np.maximum(2 * s[:, 0] + s[:, 1], 1)
        teacher = 2 * s[:, 2] / np.maximum(2 * s[:, 2] + s[:, 3], 1)
        return mine / np.where(teacher > 0, teacher, 1), s[:, 2] > 0

    return bootstrap(rows, ratio, draws, seed)


def bootstrap(per_example: np.ndarray, ratio, draws: int, seed: int) -> list | None:
    """The 2.5th and 97.5th percentiles of a ratio over `draws` resamplings (with replacement) of the examples:
    `per_example` holds each example's counts (examples x k), `ratio` maps each draw's summed counts (draws x k) to
    (its ratio, whether it has one); None when no draw has one."""
    rng, out, n = np.random.default_rng(seed), [], len(per_example)
    rows = max(1, min(draws, 2_000_000 // n))  # draws at a time: 16 MB of indices, not draws x examples (100k test
    for start in range(0, draws, rows):  # sentences took 1.7 GB); the same stream, so the same interval
        index = rng.integers(0, n, (min(rows, draws - start), n))
        value, defined = ratio(per_example[index].sum(1))
        out.append(value[defined])
    out = np.concatenate(out)
    return [round(float(q), 4) for q in np.percentile(out, [2.5, 97.5])] if len(out) else None
