"""edgekit predict: a model's labels and probabilities for texts given as arguments, in a file or on standard input,
with the accuracy where the file has labels. Any model edgekit.load takes: a run folder (its final model), a stage's
model folder, an exported .onnx, .tflite or TorchScript .pt file."""
import csv
import io
import json
import sys
from pathlib import Path

from edgekit import artifact, data, runtime
from edgekit.errors import EdgekitError, UsageError
from edgekit.progress import bar, terminal

SHOWN = 100  # characters of a text in the table (the --out file holds it whole)
BAR_FROM = 1000  # texts: fewer take seconds, and a bar would only add two lines to a log


def texts_of(args) -> tuple:
    """(texts, gold labels or None per text) from the arguments, --data, or the lines of standard input."""
    if args.texts and args.data:
        raise UsageError("give texts as arguments or --data FILE, not both")
    if args.data:
        try:
            return data.read_texts(args.data, args.text_column, args.label_column, args.text_pair_column)
        except EdgekitError as e:  # the reader speaks of recipe settings: here they are flags
            said = str(e)
            for setting in ("text_column", "label_column", "text_pair_column"):
                said = said.replace(f"data.{setting}", "--" + setting.replace("_", "-"))
            raise type(e)(said) from None
    if args.text_pair_column:
        raise UsageError("--text-pair-column reads --data FILE; give the file of text pairs")
    if args.texts:
        return list(args.texts), [None] * len(args.texts)
    if sys.stdin is None or terminal(sys.stdin):
        raise UsageError("give texts to classify: as arguments, --data FILE, or one per line on standard input")
    texts = [line.rstrip("\r\n") for line in sys.stdin if line.strip()]
    if not texts:
        raise UsageError("standard input held no text; give one text per line")
    return texts, [None] * len(texts)


def gold_names(gold: list, labels: list, source: str) -> list | None:
    """Each given label as the model's label name (a name, or its index); None where no row has a label, or where
    some are not the model's (said in a warning: an accuracy against other classes means nothing)."""
    given = [g for g in gold if g is not None]
    if not given:
        return None
    by_index = {str(i): name for i, name in enumerate(labels)}
    if unknown := sorted({g for g in given if g not in labels and g not in by_index}):
        print(f"edgekit: warning: {source} has labels the model does not know ({', '.join(map(repr, unknown[:5]))}; "
              f"the model's: {', '.join(map(repr, labels))}), so no accuracy; give --label-column the column of the "
              f"model's label names or their indices", file=sys.stderr)
        return None
    return [None if g is None else g if g in labels else by_index[g] for g in gold]


def run(args) -> dict:
    """Predict and write: the table on stdout, or --out; returns {predictions, accuracy, right, labelled}."""
    out = Path(args.out) if args.out else None
    if out and out.suffix not in (".csv", ".jsonl") and not artifact.written_into(out):
        raise UsageError(f"--out {args.out}: give a .csv or .jsonl file")
    texts, gold = texts_of(args)
    model = runtime.load(args.model, threads=args.threads or 0, max_length=args.max_length or 0)
    meta = getattr(model, "meta", None) or {}  # an exported file's model.json: whether it reads pairs
    if meta.get("text_pair") and not isinstance(texts[0], tuple):
        raise UsageError(f"{args.model} reads text pairs; give --data FILE with --text-pair-column naming the "
                         f"second text's column")
    if meta and not meta.get("text_pair") and isinstance(texts[0], tuple):
        raise UsageError(f"{args.model} reads single texts, not pairs; leave out --text-pair-column")
    gold = gold_names(gold, list(model.labels), args.data)
    labels, probs = [], []
    with bar(total=len(texts), desc="predict", unit="text", disable=args.quiet or len(texts) < BAR_FROM) as b:
        for s in range(0, len(texts), runtime.CHUNK):
            done = model(texts[s:s + runtime.CHUNK])
            labels += done["labels"]
            probs += done["probs"].tolist()
            b.update(len(done["labels"]))
    rows = [{"text": t, "label": label, "prob": max(p), "probs": dict(zip(model.labels, p)), "gold": g}
            for t, label, p, g in zip(texts, labels, probs, gold or [None] * len(texts))]
    if out:
        artifact.write_text(out, jsonl(rows) if out.suffix == ".jsonl" else table_csv(rows, list(model.labels)))
    labelled = [r for r in rows if r["gold"] is not None]
    right = sum(r["label"] == r["gold"] for r in labelled)
    return {"rows": rows, "right": right, "labelled": len(labelled),
            "accuracy": right / len(labelled) if labelled else None}


def pair(text) -> dict:
    return {"text": text[0], "text_pair": text[1]} if isinstance(text, tuple) else {"text": text}


def jsonl(rows: list) -> str:
    return "".join(json.dumps({**pair(r["text"]), "label": r["label"], "prob": round(r["prob"], 6),
                               "probs": {k: round(v, 6) for k, v in r["probs"].items()},
                               **({"gold": r["gold"]} if r["gold"] is not None else {})}, ensure_ascii=False) + "\n"
                   for r in rows)


def table_csv(rows: list, labels: list) -> str:
    f = io.StringIO()
    gold = any(r["gold"] is not None for r in rows)
    writer = csv.writer(f, lineterminator="\n")
    writer.writerow([*pair(rows[0]["text"]), "label", "prob", *(f"prob_{k}" for k in labels), *["gold"] * gold])
    for r in rows:
        writer.writerow([*pair(r["text"]).values(), r["label"], round(r["prob"], 6),
                         *(round(r["probs"][k], 6) for k in labels), *[r["gold"] or ""] * gold])
    return f.getvalue()


def markdown(rows: list) -> str:
    """The table people read: label, probability, the given label where there is one, and the text (cut)."""
    gold = any(r["gold"] is not None for r in rows)
    lines = ["| label | prob |" + " gold |" * gold + " text |", "|---|---:|" + "---|" * gold + "---|"]
    for r in rows:
        text = " [SEP] ".join(r["text"]) if isinstance(r["text"], tuple) else r["text"]
        text = " ".join(text.split())  # one line: newlines and tabs in a text as spaces
        text = (text[:SHOWN - 1] + "…" if len(text) > SHOWN else text).replace("|", "\\|")
        mark = f" {r['gold'] or ''}{' (wrong)' if r['gold'] is not None and r['gold'] != r['label'] else ''} |" * gold
        lines.append(f"| {r['label']} | {r['prob']:.4f} |{mark} {text} |")
    return "\n".join(lines)
