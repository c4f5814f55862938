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
FORMATS = ("csv", "jsonl")


def out_format(args) -> str:
    """The --out file's format ('' without --out), checked before any work: a path that cannot be written fails
    here, not after every text was predicted."""
    if not args.out:
        if args.format:
            raise UsageError("--format sets --out's format; give --out FILE too")
        return ""
    out = Path(args.out)
    if out.is_dir():
        raise UsageError(f"--out {args.out} is a folder; give the path of a .csv or .jsonl file")
    if not out.absolute().parent.is_dir():
        raise UsageError(f"--out {args.out}: folder {out.absolute().parent} does not exist; create it or give "
                         f"another path")
    if args.data and out.exists() and out.resolve() == Path(args.data).expanduser().resolve():
        raise UsageError(f"--out {args.out} is the --data file; give another path (it would replace your data)")
    suffix = out.suffix.lower().lstrip(".")
    if args.format or artifact.written_into(out):  # a pipe has no suffix: CSV unless --format says
        return args.format or "csv"
    if suffix not in FORMATS:
        raise UsageError(f"--out {args.out}: give a .csv or .jsonl file (or --format csv|jsonl)")
    return suffix


def texts_of(args) -> tuple:
    """[(text, gold label or None, row number)] from the arguments, --data, or the lines of standard input."""
    if args.texts and args.data:
        raise UsageError("give texts as arguments or --data FILE, not both")
    if not args.data:
        for flag, value in (("--text-column", args.text_column), ("--label-column", args.label_column),
                            ("--text-pair-column", args.text_pair_column), ("--label-separator", args.label_separator),
                            ("--label-columns", args.label_columns)):
            if value is not None:
                raise UsageError(f"{flag} names a column of --data FILE; give the file too")
    if args.data:
        try:
            rows, read = data.read_texts(args.data, args.text_column or "text", args.label_column or "label",
                                         args.text_pair_column or "", label_column_needed=bool(args.label_column),
                                         label_separator=args.label_separator or "",
                                         label_columns=args.label_columns or "")
        except EdgekitError as e:  # the reader speaks of recipe settings: here they are flags
            raise type(e)(data.as_flags(str(e))) from None
        if read > len(rows):
            print(f"edgekit: warning: {read - len(rows)} of {read} rows of {args.data} have no text"
                  f"{' (or no second text)' * bool(args.text_pair_column)}; left out (--out's row column numbers "
                  f"the file's rows)", file=sys.stderr)
        return rows
    if args.texts and args.texts != ["-"]:
        for i, text in enumerate(args.texts, 1):
            if not data.encodes(text):  # bytes the shell passed that are not UTF-8 (kept as surrogates)
                raise UsageError(f"text argument {i} is not UTF-8; give it in UTF-8 (iconv -t utf-8 converts)")
        return [(text, None, i) for i, text in enumerate(args.texts, 1)]
    if sys.stdin is None or (terminal(sys.stdin) and not args.texts):
        raise UsageError("give texts to classify: as arguments, --data FILE, or one per line on standard input")
    raw = sys.stdin.buffer.read() if hasattr(sys.stdin, "buffer") else sys.stdin.read().encode("utf-8", "replace")
    rows = []
    for i, line in enumerate(raw.splitlines(), 1):
        try:
            text = line.decode("utf-8-sig" if i == 1 else "utf-8")  # a byte-order mark starts some files
        except UnicodeDecodeError:
            raise UsageError(f"standard input line {i} is not UTF-8; convert the input (iconv -f latin1 -t utf-8)")
        if text.strip():
            rows.append((text, None, i))
    if not rows:
        raise UsageError("standard input held no text; give one text per line")
    return rows


def gold_names(gold: list, labels: list, source: str, multi_label: bool = False) -> list | None:
    """Each given label as the model's label name (a name, or its index); None where no row has a label, or where
    some are not the model's (said in a warning: an accuracy against other classes means nothing). For a
    multi-label model each row's labels, a list in the model's order (a single name is a list of one)."""
    given = [g for g in gold if g is not None]
    if not given:
        return None
    by_index = {str(i): name for i, name in enumerate(labels)}
    if not multi_label and any(isinstance(g, tuple) for g in given):
        print(f"edgekit: warning: {source} gives rows several labels but the model gives one, so no accuracy",
              file=sys.stderr)
        return None
    sets = [None if g is None else g if isinstance(g, tuple) else (g,) for g in gold]  # a single name: a set of one
    if unknown := sorted({n for s in sets if s for n in s if n not in labels and n not in by_index}):
        print(f"edgekit: warning: {source} has labels the model does not know ({', '.join(map(repr, unknown[:5]))}; "
              f"the model's: {', '.join(map(repr, labels))}), so no accuracy; give --label-column the column of the "
              f"model's label names or their indices", file=sys.stderr)
        return None
    named = [None if s is None else {n if n in labels else by_index[n] for n in s} for s in sets]  # names first
    if multi_label:
        return [None if s is None else [n for n in labels if n in s] for s in named]
    return [None if s is None else next(iter(s)) for s in named]


def run(args) -> dict:
    """Predict and write --out; returns {rows, right, labelled, accuracy} (accuracy None where nothing is labelled)."""
    if args.max_length is not None and args.max_length < runtime.MIN_LENGTH:
        raise UsageError(f"--max-length {args.max_length}: give a whole number >= {runtime.MIN_LENGTH}")
    fmt = out_format(args)
    given = texts_of(args)
    texts = [t for t, _, _ in given]
    model = runtime.load(args.model, threads=args.threads or 0, max_length=args.max_length or 0)
    meta = getattr(model, "meta", None) or {}  # an exported file's model.json: whether it reads pairs
    if meta.get("text_pair") and not isinstance(texts[0], tuple):
        raise UsageError(f"{args.model} reads text pairs; give --data FILE with --text-pair-column naming the "
                         f"second text's column")
    if meta and not meta.get("text_pair") and isinstance(texts[0], tuple):
        raise UsageError(f"{args.model} reads single texts, not pairs; leave out --text-pair-column")
    multi = getattr(model, "multi_label", False)
    gold = gold_names([g for _, g, _ in given], list(model.labels), args.data, multi) or [None] * len(texts)
    labels, probs = [], []
    with bar(total=len(texts), desc="predict", unit="text", disable=args.quiet or len(texts) < BAR_FROM) as b:
        for s in range(0, len(texts), runtime.CHUNK):
            done = model(texts[s:s + runtime.CHUNK])
            labels += done["labels"]
            probs += done["probs"].tolist()
            b.update(len(done["labels"]))
    rows = [{"row": n, "text": t, "label": label, "prob": max(p), "probs": dict(zip(model.labels, p)), "gold": g}
            for (t, _, n), label, p, g in zip(given, labels, probs, gold)]
    if fmt:
        artifact.write_text(Path(args.out), jsonl(rows) if fmt == "jsonl" else table_csv(rows, list(model.labels),
                                                                                          args.label_separator or "|"))
    labelled = [r for r in rows if r["gold"] is not None]
    right = sum(r["label"] == r["gold"] for r in labelled)
    return {"rows": rows, "right": right, "labelled": len(labelled),
            "accuracy": right / len(labelled) if labelled else None}


def pair(text) -> dict:
    return {"text": text[0], "text_pair": text[1]} if isinstance(text, tuple) else {"text": text}


def jsonl(rows: list) -> str:
    return "".join(json.dumps({"row": r["row"], **pair(r["text"]), "label": r["label"], "prob": round(r["prob"], 6),
                               "probs": {k: round(v, 6) for k, v in r["probs"].items()},
                               **({"gold": r["gold"]} if r["gold"] is not None else {})}, ensure_ascii=False) + "\n"
                   for r in rows)


def cell(label, separator: str = "|") -> str:
    """A label as a CSV cell: a multi-label list joined by `separator` (what --label-separator reads back)."""
    return separator.join(label) if isinstance(label, list) else label or ""


def shown(label) -> str:
    """A label as the table shows it: a multi-label list joined, 'none' for no label."""
    return (", ".join(label) or "none") if isinstance(label, list) else label or ""


def table_csv(rows: list, labels: list, separator: str = "|") -> str:
    f = io.StringIO()
    gold = any(r["gold"] is not None for r in rows)
    writer = csv.writer(f, lineterminator="\n")
    writer.writerow(["row", *pair(rows[0]["text"]), "label", "prob", *(f"prob_{k}" for k in labels), *["gold"] * gold])
    for r in rows:
        writer.writerow([r["row"], *pair(r["text"]).values(), cell(r["label"], separator), round(r["prob"], 6),
                         *(round(r["probs"][k], 6) for k in labels),
                         *[cell(r["gold"], separator) if r["gold"] is not None else ""] * gold])
    return f.getvalue()


def markdown(rows: list) -> str:
    """The table people read: label, probability, the given label where there is one, and the text (cut)."""
    gold = any(r["gold"] is not None for r in rows)
    lines = ["| label | prob |" + " gold |" * gold + " text |", "|---|---:|" + "---|" * gold + "---|"]
    for r in rows:
        text = " [SEP] ".join(r["text"]) if isinstance(r["text"], tuple) else r["text"]
        text = " ".join(text.split())  # one line: newlines and tabs in a text as spaces
        text = text[:SHOWN - 1] + "…" if len(text) > SHOWN else text
        text = text.replace("\\", "\\\\").replace("|", "\\|")  # markdown: a | would end the cell
        mark = f" {shown(r['gold'])}{' (wrong)' if r['gold'] is not None and r['gold'] != r['label'] else ''} |" * gold
        lines.append(f"| {shown(r['label'])} | {r['prob']:.4f} |{mark} {text} |")
    return "\n".join(lines)
