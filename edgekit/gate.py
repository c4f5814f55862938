"""Budgets as a CI gate: check a finished run (or, for size alone, plain model files) against budgets.

Never passes when it could not check: an unreadable or newer manifest, a missing output or a metric the
run did not measure is an error (exit 1), not a pass. With --target, a latency or memory budget the device did not
measure is a failed row ("not measured on NAME"), never the build machine's number; each row says where its number
is from (on NAME, build machine, file). Imports nothing heavy (no torch): it reads files.
"""
import json
import math
import os
import re
import sys
from pathlib import Path
from xml.sax.saxutils import quoteattr

from edgekit import artifact, assets, recipe as recipes
from edgekit.errors import EdgekitError, UsageError

SCHEMA = 1
VERDICT_SCHEMA = 1  # of --json's output: raised when a key changes meaning or goes
DEVICE_METRICS = ("latency_ms_p50", "latency_ms_p90", "latency_ms_p99", "peak_rss_mb")  # only the device can tell


def parse_budget(text: str) -> tuple:
    """'peak_rss_mb<=300' -> ('peak_rss_mb', '<=', 300.0)."""
    match = re.fullmatch(r"\s*([A-Za-z0-9_]+)\s*(<=|>=|<|>)\s*(\S+)\s*", text)
    try:
        metric, op, bound = match.group(1), match.group(2), float(match.group(3))
    except (AttributeError, ValueError):
        raise UsageError(f"budget '{text}' must look like METRIC<=NUMBER (operators: <=, >=, <, >)")
    if metric not in recipes.METRICS:
        raise UsageError(f"budget '{text}' names unknown metric '{metric}'; metrics: {', '.join(recipes.METRICS)}")
    return metric, op, bound


def number_of(flag: str, text: str) -> float:
    """A bound given as a flag's value (--max-size-mb 25), read here rather than by argparse: its error is one
    more case the JUnit file and step summary must say."""
    try:
        return float(text)
    except ValueError:
        raise UsageError(f"{flag} {text}: give a number, without a unit (--max-size-mb 25 is 25 MB)")


def weights_mb(path: Path) -> float:
    """Size of the weights of a model file or folder, in MB, from the files alone."""
    if not artifact.weight_files(path) or (path.is_file() and path.suffix not in artifact.WEIGHT_SUFFIXES):
        raise EdgekitError(f"{path} holds no model weights ({', '.join(artifact.WEIGHT_SUFFIXES)}); nothing to gate")
    return artifact.weights_mb(path)


def load_manifest(path: Path, other: str = "") -> tuple:
    """(manifest, run folder) from a run folder or a manifest.json path; `other`: what else the command takes, said
    with what a path that is no run should be."""
    manifest_path = path / "manifest.json" if path.is_dir() else path
    if path.is_file() and path.suffix != ".json":
        raise EdgekitError(f"{path} is a file, not a run: give the run folder edgekit compress wrote, or its "
                           f"manifest.json")
    if path.is_dir() and not manifest_path.exists() and any(path.glob("[0-9][0-9]-*.partial")):
        raise EdgekitError(f"{path} has no manifest.json yet: its first stage is still running or was stopped; wait "
                           f"for it, or run the same compress command again")
    try:
        manifest = json.loads(manifest_path.read_text())
    except (OSError, ValueError) as e:
        raise EdgekitError(f"cannot read {manifest_path} ({getattr(e, 'strerror', None) or e}); give a run folder "
                           f"or its manifest.json")
    version = manifest.get("schema") if isinstance(manifest, dict) else None
    if version is None:
        raise EdgekitError(f"{manifest_path} is not an edgekit run manifest (no schema); give a run folder or its "
                           f"manifest.json{other}")
    if version != SCHEMA:
        raise EdgekitError(f"{manifest_path} has manifest schema {version!r}; this edgekit reads schema {SCHEMA}: "
                           f"upgrade edgekit or re-run the recipe")
    from edgekit import schemas

    schemas.validate(manifest, schemas.MANIFEST, str(manifest_path))
    if manifest["status"] == "running" or not manifest.get("final"):
        if being_written(manifest_path.parent):
            raise EdgekitError(f"{manifest_path.parent} is being written by an edgekit run now; wait for it to finish")
        raise EdgekitError(f"{manifest_path} is from an unfinished run; run the same compress command to finish it")
    return manifest, manifest_path.parent


def being_written(run: Path) -> bool:
    """Whether a compress (or a bench's merge) holds the run's lock now (edgekit.pipeline.lock)."""
    import fcntl

    try:
        with open(run / ".lock") as handle:
            fcntl.flock(handle, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:  # no lock file: nothing ever ran here with a lock
        return False
    return False


def check(path, budgets: list, target: str = None) -> list:
    """Rows {metric, op, target, actual, ok} for each budget; the recipe's own budgets when none are given (budgets
    given replace them: a warning names those left unchecked)."""
    path = Path(path).expanduser()
    for metric, _, bound in budgets:
        if problem := recipes.bound_problem(metric, bound):
            raise UsageError(problem)
    if not path.exists():
        raise EdgekitError(f"{path} does not exist; give a run folder, its manifest.json, or a model file or folder")
    is_run = (path / "manifest.json").is_file() or path.suffix == ".json" or (path.is_dir() and (
        (path / ".lock").exists() or any(path.glob("[0-9][0-9]-*.partial"))))  # a run not yet written: never sized
    if not is_run:  # plain model files: only size can be known without running anything
        others = [b for b in budgets if b[0] != "size_mb"]
        if others or not budgets:
            raise UsageError(f"{path} is not a run folder; only --max-size-mb can be checked from model files alone")
        exported = sorted(p for p in path.rglob("*") if p.suffix in (".onnx", ".tflite", ".pt") and not any(
            part.endswith(".partial") for part in p.relative_to(path).parts)) if path.is_dir() else []
        sizes = {str(p.relative_to(path)): weights_mb(p) for p in exported} or {None: weights_mb(path)}  # else one
        rows = []  # file, or one transformers folder
        for name, mb in sizes.items():
            for _, op, bound in budgets:
                row = recipes.budget_row("size_mb", op, bound, mb)
                rows.append(dict(row, artifact=name) if name else row)
        return rows
    manifest, run = load_manifest(path, ", or a model file or folder for --max-size-mb")
    entries = [manifest["final"], *(manifest["final"].get("outputs") or {}).values()]
    for entry in entries:
        outside_problem(run, entry["path"], manifest.get("model") or {})
    finals = {Path(o["path"]).parts[0] for o in entries}
    files = {rel: sha for rel, sha in recorded_files(manifest).items()  # the final models' stage folders:
             if Path(rel).parts[0] in finals}  # a CI upload may leave out the rest
    missing = [rel for rel in files if not (run / rel).is_file()]
    if missing:
        raise EdgekitError(f"{run} is missing final model files ({missing[0]}"
                           f"{f' and {len(missing) - 1} more' if len(missing) > 1 else ''}); "
                           f"re-run the recipe to restore them, or copy them with manifest.json")
    if changed := [rel for rel, sha in files.items() if assets.sha256_file(run / rel) != sha]:
        raise EdgekitError(f"{run / changed[0]} is not the file the run made and measured (its sha256 is not the "
                           f"manifest's); copy the run's files unchanged, or re-run the recipe")
    targets = {n: d for n, d in (manifest.get("devices") or {}).items() if d.get("complete") is True}
    if target:  # results of `edgekit bench RUN --target NAME`; an incomplete one never counts
        if target not in targets:
            raise EdgekitError(f"{run} has no complete results for target '{target}'; targets with results: "
                               f"{', '.join(targets) or 'none'}; run edgekit bench {run} --target {target}")
    there = targets[target].get("metrics", {}) if target else {}
    own = [(m, *recipes.parse_bound(b)) for m, b in manifest["recipe"].get("budgets", {}).items()]
    if target:  # and the target's own budgets, as edgekit bench checked them
        own += [(r["metric"], r["op"], r["target"]) for r in targets[target].get("budgets", [])]
    if budgets and (dropped := [f"{m} {op} {b:g}" for m, op, b in own if m not in {given[0] for given in budgets}]):
        whose = f"the recipe's and target {target}'s" if target else "the recipe's"
        print(f"edgekit: warning: the budgets given replace {whose}; not checked: {', '.join(dropped)} (give them "
              f"too to check them)", file=sys.stderr)
    if not budgets:
        budgets = list(dict.fromkeys(own))
        if not budgets:
            raise UsageError("the run's recipe has no budgets; give --max-size-mb, --max-latency-ms-p90, "
                             "--min-accuracy-retained or --budget METRIC<=N")
    artifacts = {None: (manifest["final"], manifest["final"]["metrics"])}
    if manifest["final"].get("outputs"):  # one artifact per target and format: every one must hold
        artifacts = {name: (o, o["metrics"]) for name, o in manifest["final"]["outputs"].items()}
    benched = targets[target].get("model") if target else None
    if benched:  # the device's numbers belong to the model it ran: never mixed with another model's size
        artifacts = {n: a for n, a in artifacts.items() if (run / a[0]["path"]).resolve() == (run / benched).resolve()}
        if not artifacts:
            raise EdgekitError(f"target '{target}' ran {benched}, not the run's final model "
                               f"({manifest['final']['path']}); gate checks the final model: run edgekit bench {run} "
                               f"--target {target} without --model, then gate again")
    rows = []
    for name, (entry, measured) in artifacts.items():
        path = Path(entry["path"])
        size = weights_mb(path if path.is_absolute() else run / path)
        for metric, op, bound in budgets:  # with a target: its numbers, and the row says where each one is from
            if metric == "size_mb":  # a property of the file: read from it, never trusted from a manifest
                source, numbers = "file", {"size_mb": size}
            elif metric in there:
                if not recipes.measure(there[metric]):
                    raise EdgekitError(f"target '{target}' recorded {metric} {there[metric]!r}, not a finite number "
                                       f">= 0; run edgekit bench {run} --target {target} again")
                source, numbers = f"on {target}", there
            elif target and metric in DEVICE_METRICS:  # never this machine's latency or memory in the device's place
                row = dict(recipes.budget_row(metric, op, bound, None), error=f"not measured on {target}")
                rows.append(row if name is None else dict(row, artifact=name))
                continue
            else:  # accuracy of the same file, from the run's evaluate
                source, numbers = "build machine", from_counts(measured)
            if metric == "accuracy_retained" and numbers.get("teacher_accuracy") == 0:
                raise EdgekitError(f"accuracy_retained is undefined: the teacher scored 0 on the run's "
                                   f"{numbers.get('eval_split', 'evaluation')} split; check the teacher and its labels")
            if not isinstance(numbers.get(metric), (int, float)):
                raise EdgekitError(
                    f"the run did not measure {metric}: only a multi-label run's evaluate does (and not where the "
                    f"teacher's f1_micro is 0); bound accuracy or accuracy_retained"
                    if metric in recipes.MULTI_LABEL_METRICS else
                    f"the run did not measure {metric}; add the stage that measures it (evaluate for accuracy, bench "
                    f"for latency and memory) or drop that budget")
            row = recipes.with_note(recipes.budget_row(metric, op, bound, numbers[metric],
                                                       numbers.get(f"{metric}_interval")), numbers)
            row = dict(row, source=source) if target else row
            rows.append(row if name is None else dict(row, artifact=name))
    return rows


def from_counts(numbers: dict) -> dict:
    """accuracy_retained as the right answers over the teacher's on the same sentences, counted back from the scores:
    the same number for a run of this edgekit, and the exact one for a run made before evaluate's REVISION 5, which
    stored the ratio of two scores rounded to 4 places (94.406% read 0.9441 and held `>= 0.9441`; scores to 4
    places give the counts back exactly up to 5,000 sentences)."""
    n, score, teacher = (numbers.get(k) for k in ("eval_examples", "accuracy", "teacher_accuracy"))
    if not all(isinstance(v, (int, float)) for v in (n, score, teacher, numbers.get("accuracy_retained"))) or \
            round(teacher * n) < 1:  # not measured stays not measured
        return numbers
    return dict(numbers, accuracy_retained=round(score * n) / round(teacher * n))


def recorded_files(manifest: dict) -> dict:
    """{path in the run: sha256} of every file the manifest's stages recorded (compress, bench and gate read them
    here: gate imports no torch)."""
    return {rel: sha for stage in manifest.get("stages", []) for rel, sha in stage.get("files", {}).items()}


def outside_problem(run: Path, final: str, model: dict) -> None:
    """A final model outside the run folder is checked too: the run's teacher, the final model of a recipe whose
    stages write none (evaluate alone), against the fingerprint the run took of it; any other is refused (a
    manifest edited to point elsewhere, or a copy that lost it)."""
    where = run / final
    if where.resolve().is_relative_to(run.resolve()):
        return  # a stage folder's file: its sha256 is checked with the stages' files
    if str(final) != model.get("path"):
        raise EdgekitError(f"the run's final model {final} lies outside {run}, where no stage wrote it; gate checks "
                           f"only what the run made and measured: re-run the recipe")
    if not where.exists():
        raise EdgekitError(f"the run's final model, its teacher {final}, is not there; give gate the machine or copy "
                           f"that holds it, or re-run the recipe")
    if assets.fingerprint(where) != model.get("fingerprint"):
        raise EdgekitError(f"the run's final model, its teacher {final}, is not the model the run measured (its "
                           f"files changed since); re-run the recipe")


def label(row: dict) -> str:
    return f"{row['artifact']}: {row['metric']}" if "artifact" in row else row["metric"]


def interval_note(ci, bound: float | None = None) -> str:
    """' (95% interval lo-hi, bound inside)' for a measured interval: with the bound inside it, the split cannot tell
    the artifact from one on the bound; '' when none was measured."""
    if not ci:
        return ""
    inside = "" if bound is None else ", bound inside" if ci[0] <= bound <= ci[1] else ", bound outside"
    return f" (95% interval {ci[0]:.4f}-{ci[1]:.4f}{inside})"  # 4 places, as accuracies print: "1.0-1.0" read oddly


def number(row: dict) -> str:
    return "-" if row["actual"] is None else \
        faithful(row["actual"], lambda v: recipes.budget_row(row["metric"], row["op"], row["target"], v)["ok"])


def faithful(value: float, holds) -> str:
    """`value` to 4 significant digits, or as many more as it takes to read on the side of its bound it is on
    (`holds`: whether a number meets the bound): 0.96997 against >= 0.97, never 0.97 beside OVER."""
    for digits in range(4, 18):
        if holds(float(text := f"{value:.{digits}g}")) == holds(value):
            return text
    return repr(value)


def notes(row: dict) -> str:
    """' (on pi4)', ' (build machine)' or why there is no number, then the interval note."""
    said = row.get("error") or row.get("source") or ("not measured" if row["actual"] is None else "")
    said = "; ".join(x for x in (said, row.get("note")) if x)
    return (f" ({said})" if said else "") + interval_note(row.get("interval"), row["target"])


def lines(rows: list) -> list:
    """One aligned line per row (a label like `x86-torchscript: accuracy_retained` shifted its row)."""
    width = max([22, *(len(label(r)) for r in rows)])
    return [f"{label(r):{width}s} {number(r):>10} {r['op']} {r['target']:<10g} {'ok' if r['ok'] else 'OVER'}"
            f"{notes(r)}" for r in rows]


def markdown(rows: list, title: str) -> str:
    out = [f"### edgekit gate: {title}", "", "| metric | actual | budget | ok |", "|---|---:|---:|---|"]
    out += [f"| {label(r)} | {number(r)}{notes(r)} | {r['op']} {r['target']:g} | {'✅' if r['ok'] else '❌'} |"
            for r in rows]
    return "\n".join(out) + "\n"


def junit(rows: list, title: str, error: str = None) -> str:
    failures = sum(not r["ok"] for r in rows)
    cases = [f'  <testcase classname="edgekit.gate" name="check"><error message={attribute(error)}/></testcase>'] \
        if error else []
    for r in rows:
        name = attribute(f"{label(r)} {r['op']} {r['target']:g}")
        body = "" if r["ok"] else f"<failure message={attribute(f'actual {number(r)}{notes(r)}')}/>"
        cases.append(f'  <testcase classname="edgekit.gate" name={name}>{body}</testcase>')
    return (f'<?xml version="1.0" encoding="utf-8"?>\n<testsuite name={attribute("edgekit gate " + title)} '
            f'tests="{len(cases)}" failures="{failures}" errors="{int(bool(error))}">\n' + "\n".join(cases)
            + "\n</testsuite>\n")


NOT_XML = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def printable(text: str) -> str:
    """`text` as UTF-8 can hold it and XML 1.0 allows it: a path's undecodable byte and a control character written
    out as escapes, not a failed write or a JUnit file no parser reads."""
    text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    return NOT_XML.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


def attribute(text: str) -> str:
    return quoteattr(printable(text))


def as_json(rows: list, title: str, error: str = None) -> str:
    """The verdict for a program to read: `ok` (false when anything is over, unmeasured or could not be checked),
    `error` (why nothing was checked, else null) and one entry per budget; `bound` is the budget's number, `source`
    where the actual one is from (with --target), a number that is not finite is null."""
    def finite(v):
        return v if not isinstance(v, float) or math.isfinite(v) else None

    budgets = [{"metric": r["metric"], "op": r["op"], "bound": finite(r["target"]), "actual": finite(r["actual"]),
                "ok": r["ok"], **{k: r[k] for k in ("artifact", "source", "note", "error") if r.get(k) is not None},
                **({"interval": [finite(v) for v in r["interval"]]} if r.get("interval") else {})} for r in rows]
    return json.dumps({"schema": VERDICT_SCHEMA, "checked": title, "ok": not error and all(r["ok"] for r in rows),
                       "error": error, "budgets": budgets}, indent=1) + "\n"


def write_reports(rows: list, title: str, junit_file: str = None, error: str = None, json_file: str = None) -> None:
    """The GitHub step summary (when GITHUB_STEP_SUMMARY is set), a JUnit file and a JSON one (`-`: standard output);
    `error`: why nothing was checked."""
    summary = os.environ.get("GITHUB_STEP_SUMMARY")
    title, error = printable(title), error and printable(error)
    if summary:
        text = f"### edgekit gate: {title}\n\ncould not check: {error}\n" if error else markdown(rows, title)
        try:
            with open(summary, "a", encoding="utf-8") as f:
                f.write(text)
        except OSError as e:  # the verdict stands; the summary is a courtesy
            print(f"edgekit: warning: cannot append to GITHUB_STEP_SUMMARY {summary} ({e.strerror})", file=sys.stderr)
    if junit_file:
        artifact.write_text(Path(junit_file), junit(rows, title, error))
    if json_file == "-":
        sys.stdout.write(as_json(rows, title, error))
    elif json_file:
        artifact.write_text(Path(json_file), as_json(rows, title, error))
