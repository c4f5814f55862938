"""Argument parsing only; every command forwards to a library function.
Exit codes: EXIT_CODES below. Errors are one line; -v shows the traceback."""
import argparse
import errno
import os
import re
import shlex
import shutil
import signal
import sys
import threading
import time
import traceback
import unicodedata
from pathlib import Path

import edgekit
from edgekit import errors
from edgekit.errors import EdgekitError, Terminated, UsageError

OVER_BUDGET = 3
EXIT_CODES = ("exit codes: 0 ok, 1 error, 2 wrong command line or recipe, 3 over budget, 130 interrupted (Ctrl-C), "
              "143 terminated (SIGTERM)")


REPEAT_S = 5  # a second SIGTERM or Ctrl-C this soon after the first is the same stop: its cleanup goes on


def _stop(signum, frame):
    """SIGTERM and Ctrl-C raise once. A second one while the first's cleanup runs gave a traceback, left a temp file
    or killed the process (exit -15); one later than REPEAT_S raises again (a stop Python dropped, or a slow
    cleanup the user wants to cut short)."""
    now = time.monotonic()
    if errors.STOP["at"] is not None and now - errors.STOP["at"] < REPEAT_S:
        return
    errors.STOP.update(at=now, signal=signum)
    errors.stop_point()


RESUMES = ("compress", "sweep")  # commands whose finished stages a second run reuses
OUTS = ("compress", "sweep", "report", "compare")  # commands with an --out folder


def main(argv=None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra and getattr(args, "command", None) == "predict":  # texts after an option: argparse hands out
        before, after = (extra[:extra.index("--")], extra[extra.index("--") + 1:]) if "--" in extra else (extra, [])
        if not any(x.startswith("-") for x in before):  # positionals before it reads on, and keeps these apart
            args.texts, extra = args.texts + before + after, []
    if extra:
        hint = "; put -- before texts that start with -" if getattr(args, "command", None) == "predict" else ""
        parser.error(f"unrecognized arguments: {' '.join(extra)[:200]}{hint}")
    if not getattr(args, "command", None):
        parser.print_help()
        return 2
    main_thread = threading.current_thread() is threading.main_thread()  # only there can signals be handled
    errors.STOP.update(at=None, signal=None)
    previous = {s: signal.signal(s, _stop) for s in (signal.SIGTERM, signal.SIGINT)  # one the parent ignored
                if signal.getsignal(s) != signal.SIG_IGN} if main_thread else {}  # (`edgekit ... &` in a script)
    try:
        code = args.func(args) or 0
        errors.stop_point()  # a stop that came while Python could not raise it: the work went on, its exit code says
        return code
    except EdgekitError as e:
        if args.verbose:  # the traceback, and still the exit code that says what kind of error it was
            _say(traceback.format_exc().rstrip())
        _close_bars()
        _say(f"edgekit: error{_rank()}: {e}")
        return e.code
    except BrokenPipeError:  # `edgekit recipes | head -1`: the reader has gone; nothing to say, nowhere to say it
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # Python's own flush at exit fails else
        return 141
    except OSError as e:  # full disk, read-only folder, vanished file: say which and what to do
        if args.verbose:
            _say(traceback.format_exc().rstrip())
        _close_bars()
        _say(f"edgekit: error{_rank()}: {os_problem(e, args.command)}")
        return 1
    except KeyboardInterrupt as e:
        _close_bars()
        resumes = args.command in RESUMES  # finished stages are kept; the rest start over
        what = "terminated" if isinstance(e, Terminated) else "interrupted"
        _say(f"edgekit: {what}{'; run the same command again to resume' if resumes else ''}")
        return 143 if isinstance(e, Terminated) else 130
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        errors.STOP.update(at=None, signal=None)
        _leave_process_group()  # killed a process whose run had finished
        if argv is None and main_thread:  # the `edgekit` command, about to exit: a signal during the interpreter's
            for s in (signal.SIGTERM, signal.SIGINT):  # shutdown (torch's exit hooks, 2-3 s) printed a traceback
                signal.signal(s, signal.SIG_IGN)  # or made the exit code -15 or -2 after the message was said


def _say(message: str) -> None:
    """The last line a command prints, on stderr; with stderr closed (`2>&-`) there is nowhere to say it, and the
    exit code still says what happened. (Python sets sys.stderr to None then, and print would write to stdout.)"""
    if sys.stderr is None:
        return
    try:
        print(message, file=sys.stderr, flush=True)
    except (OSError, ValueError):
        pass


def script(main) -> int:
    """A bench script's main() ended as the CLI ends a command: an EdgekitError as one line and its exit code,
    Ctrl-C as 130; `sys.exit(script(main))`."""
    name = Path(sys.argv[0]).name
    try:
        code = main()
        return code if isinstance(code, int) else 0
    except (EdgekitError, OSError) as e:
        _close_bars()
        _say(f"{name}: error: {os_problem(e) if isinstance(e, OSError) else e}")
        return getattr(e, "code", 1)
    except KeyboardInterrupt:
        _close_bars()
        _say(f"{name}: interrupted")
        return 130


def os_problem(e: OSError, command: str = "compress") -> str:
    """What went wrong with a file, and what to do, by the error's kind and the command that met it."""
    where = f" {e.filename}" if e.filename else ""
    if e.errno in (errno.ENOSPC, errno.EDQUOT):
        kept = " (finished stages are kept)" if command in RESUMES else ""
        return f"cannot write{where}: {e.strerror}; free space, then run the same command again{kept}"
    if e.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        other = {"bench": "; edgekit bench writes its results into the run folder: bench a copy you can write",
                 "gate": "; give --junit and --json paths you can write"}.get(command,
                                                                               " (--out)" if command in OUTS else "")
        return f"not allowed to write or read{where} ({e.strerror}); fix its permissions or choose another folder{other}"
    if e.errno in (errno.EEXIST, errno.ENOTDIR, errno.EISDIR):
        return f"{where.strip()} is in the way ({e.strerror}); give a path where a file or folder stands for itself"
    if e.errno == errno.ENOENT:
        return (f"{where.strip() or 'a file'} does not exist ({e.strerror}); check the path (a folder written in must "
                f"exist)")
    return f"cannot read or write{where}: {(e.strerror or str(e)).splitlines()[0]}"


def _close_bars() -> None:
    """End the progress bars an error left open, so the error starts a line of its own."""
    tqdm = sys.modules.get("tqdm")
    for bar in list(getattr(getattr(tqdm, "tqdm", None), "_instances", ())):
        bar.close()


class Parser(argparse.ArgumentParser):
    """A wrong command line in one line, what is wrong and where to read what is allowed, exit 2 (argparse's own
    error prints the usage block first). add_subparsers(parser_class=Parser) makes the subcommands' parsers too."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message}; see {self.prog} --help\n")


def description(doc: str) -> str:
    """A script's --help description: the first paragraph of its docstring, on one line."""
    return " ".join(doc.strip().split("\n\n")[0].split())


def positive(text: str) -> int:
    if not text.lstrip("-").isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"'{text}' is not a whole number >= 1")
    return int(text)


def _rank() -> str:
    """' (rank N)' on ranks > 0 under torchrun: when every rank fails, the lines say which process wrote which."""
    rank = os.environ.get("RANK", "0")
    return f" (rank {rank})" if os.environ.get("WORLD_SIZE", "1") != "1" and rank != "0" else ""


def _leave_process_group() -> None:
    """Under torchrun: leave the process group before exit (its threads abort a process that exits inside it)."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


def build_parser():
    p = Parser(prog="edgekit", description="Compress BERT-family text classifiers for edge devices.",
              epilog=EXIT_CODES)
    p.add_argument("-v", "--verbose", action="store_true", help="show tracebacks")
    p.add_argument("--version", action="version", version=f"edgekit {edgekit.__version__}")
    sub = p.add_subparsers(dest="command", parser_class=Parser)

    c = sub.add_parser("compress", help="run a recipe end to end")
    c.add_argument("--recipe", default="distilbert-int8", help="a shipped recipe name or a .yaml path")
    c.add_argument("--teacher", help="model: an asset (minilm-l6, mpnet-base), a local folder or a hub id")
    c.add_argument("--data", help="dataset: rt-polarity, vader-amazon, tweets-3class or a local .csv/.tsv/.jsonl "
                                  "file (columns text, label; see data.text_column)")
    c.add_argument("--out", help="run folder (default artifacts/<recipe name>)")
    c.add_argument("--dry-run", action="store_true", help="check the recipe, data and a local teacher folder, print "
                                                          "the resolved recipe and stop")
    c.add_argument("--quiet", action="store_true", help="no progress bars")
    c.add_argument("overrides", nargs="*", metavar="key=value", help="e.g. distill.epochs=1 data.max_train=2000")
    c.set_defaults(func=cmd_compress)

    r = sub.add_parser("recipes", help="list shipped recipes, or `recipes show NAME`")
    r.add_argument("action", nargs="?", default="list", help="list (default) or show")
    r.add_argument("name", nargs="?")
    r.set_defaults(func=cmd_recipes)

    a = sub.add_parser("assets", help="list offline assets and the cache, `assets fetch NAME`, `assets clean NAME`")
    a.add_argument("action", nargs="?", default="list", help="list (default), fetch or clean")
    a.add_argument("name", nargs="?")
    a.set_defaults(func=cmd_assets)

    g = sub.add_parser("gate", help="check a finished run (or model files, for size) against budgets; exit 3 if over")
    g.add_argument("path", help="a run folder, its manifest.json, or (size only) a model file or folder")
    g.add_argument("--max-size-mb", metavar="N", help="weights of each final artifact, in MB (10^6 bytes)")
    g.add_argument("--max-latency-ms-p90", metavar="N", help="p90 latency in ms, as the bench stage or --target "
                                                            "measured it")
    g.add_argument("--min-accuracy-retained", metavar="N", help="accuracy / teacher accuracy as a fraction: 0.97 "
                                                               "keeps 97%%")
    g.add_argument("--budget", action="append", default=[], metavar="METRIC<=N", help="any metric, repeatable; budgets "
                   "given replace the recipe's (a warning names those left unchecked)")
    g.add_argument("--target", help="check the results of this device target (edgekit bench), against the run's "
                                    "budgets and the target's own")
    g.add_argument("--junit", metavar="FILE", help="also write a JUnit XML report")
    g.add_argument("--json", metavar="FILE", help="also write the verdict as JSON (- : to standard output, in place "
                                                  "of the table)")
    g.set_defaults(func=cmd_gate)

    rp = sub.add_parser("report", help="report.md, report.html and plots from one or more finished runs")
    rp.add_argument("runs", nargs="+", help="run folders")
    rp.add_argument("--out", help="folder for the report (default: RUN/report for one run, artifacts/report for several)")
    rp.set_defaults(func=cmd_report)

    cp = sub.add_parser("compare", help="the model-selection table: size, latency, memory, accuracy per model")
    cp.add_argument("models", nargs="*", help="model assets, transformers folders, config.json files, base shapes "
                                              "(bert-base, ...) or hub ids")
    cp.add_argument("--families", action="store_true",
                    help="add BERT/RoBERTa/ALBERT/DistilBERT/ELECTRA base shapes (xlm-roberta-base: name it)")
    cp.add_argument("--data", help="a dataset, for the accuracy of task models whose labels match it")
    cp.add_argument("--text-column", default="text", help="--data file's text column (default text)")
    cp.add_argument("--label-column", default="label", help="--data file's label column (default label)")
    cp.add_argument("--label-separator", default="", metavar="SEP",
                    help="multi-label data: --data CSV/TSV cells hold labels cut at SEP")
    cp.add_argument("--label-columns", default="", metavar="A,B,...",
                    help="multi-label data: a 0/1 column per label (Jigsaw's toxic,severe_toxic,...)")
    cp.add_argument("--threads", type=positive, default=1, help="ONNX Runtime threads (default 1)")
    cp.add_argument("--seq-len", type=int, default=128, help="tokens for latency; accuracy inputs are cut there too")
    cp.add_argument("--out", default="artifacts/compare", help="folder for compare.md/.csv/.png "
                                                                "(default artifacts/compare)")
    cp.add_argument("--quiet", action="store_true", help="no progress bars")
    cp.set_defaults(func=cmd_compare)

    sw = sub.add_parser("sweep", help="run a recipe over a grid (key=v1,v2 ...), sharing stages; report the Pareto "
                                      "front; exit 1 if a point failed (the others still run), 3 if one is over budget")
    sw.add_argument("--recipe", default="distilbert-int8", help="a shipped recipe name or a .yaml path")
    sw.add_argument("--out", help="sweep folder (default artifacts/sweep-<recipe>)")
    sw.add_argument("--ray", metavar="ADDRESS", help="run grid points as tasks on this Ray cluster (HOST:PORT)")
    sw.add_argument("--quiet", action="store_true", help="no progress bars")
    sw.add_argument("overrides", nargs="+", metavar="key=v1,v2")
    sw.set_defaults(func=cmd_sweep)
    b = sub.add_parser("bench", help="run a finished run's model on a device target; merge the result; exit 3 if over")
    b.add_argument("run", help="a finished run folder")
    b.add_argument("--target", default="local", help="a target name: local, qemu-arm64, manual (run by hand), or one "
                   "from --targets/recipe")
    b.add_argument("--targets", metavar="FILE", help="a YAML file of targets (kind: local|ssh|adb|qemu-arm64|manual)")
    b.add_argument("--model", help="an output name of the final stage (arm64-tflite) or a model file "
                                   "(default: the final model)")
    by_hand = b.add_mutually_exclusive_group()
    by_hand.add_argument("--stage", metavar="DIR", help="only write the job (runner, model, test sentences) into the new "
                         "folder DIR and print the command to run on the device: for a device edgekit cannot reach")
    by_hand.add_argument("--result", metavar="FILE", help="merge the result.json device_bench wrote for a --stage job "
                         "instead of running the target (target manual, or the target whose settings it ran with)")
    b.add_argument("--quiet", action="store_true", help="no progress bars")
    b.set_defaults(func=cmd_bench)

    pr = sub.add_parser("predict", allow_abbrev=False, help="labels and probabilities from a model for texts "
                        "(arguments, a file or stdin); accuracy where the file has labels")
    pr.add_argument("model", help="a run folder (its final model), a stage's model folder, or an .onnx, .tflite or "
                                  "TorchScript .pt file")
    pr.add_argument("texts", nargs="*", metavar="TEXT", help="texts to classify (none, or -: one per line on standard "
                                                             "input; -- before texts that start with -)")
    pr.add_argument("--data", metavar="FILE", help="a .csv, .tsv or .jsonl file of texts; its labels, where it has "
                                                   "them, give the accuracy")
    pr.add_argument("--text-column", metavar="NAME", help="--data file's text column (default text)")
    pr.add_argument("--label-column", metavar="NAME", help="--data file's label column (default label, if there)")
    pr.add_argument("--text-pair-column", metavar="NAME", help="a model of text pairs: --data file's second text")
    pr.add_argument("--label-separator", metavar="SEP", help="a multi-label model: --data CSV/TSV cells hold labels "
                                                             "cut at SEP (a JSONL file gives lists)")
    pr.add_argument("--label-columns", metavar="A,B,...", help="a multi-label model: --data has a 0/1 column per "
                                                                "label (Jigsaw's toxic,severe_toxic,...)")
    pr.add_argument("--max-length", metavar="N", type=positive, help="tokens per text (default: the model's)")
    pr.add_argument("--threads", metavar="N", type=positive, help="runtime threads (default: the runtime's)")
    pr.add_argument("--out", metavar="FILE", help="write every prediction, with its row and each class's "
                                                  "probability, to a .csv or .jsonl file instead of the table")
    pr.add_argument("--format", choices=("csv", "jsonl"), help="--out's format where its name does not say it "
                                                                "(/dev/stdout: csv unless given)")
    pr.add_argument("--quiet", action="store_true", help="no progress bar")
    pr.set_defaults(func=cmd_predict)
    for s in (c, r, a, g, rp, cp, sw, b, pr):
        s.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS, help="show tracebacks")
        s.epilog = EXIT_CODES
    return p


def cmd_compress(args) -> int:
    from edgekit import pipeline, recipe

    resolved = pipeline.resolve(args.recipe, args.teacher, args.data, args.overrides)
    if args.dry_run:
        if splits := pipeline.check_inputs(resolved):
            pipeline.tell_data(splits, True, resolved)
        print(recipe.dump(resolved), end="")
        return 0
    out = Path(args.out) if args.out else Path("artifacts") / resolved["name"]
    manifest = pipeline.run(resolved, out, progress=not args.quiet)
    if manifest is None:  # a rank > 0 under torchrun: it trained with rank 0, which reports
        return 0
    print(aligned(summary(manifest)))
    code = 0 if manifest["status"] == "complete" else OVER_BUDGET
    for name, spec in (resolved.get("devices") or {}).items():  # device_bench targets marked after_compress
        if spec.get("after_compress"):
            from edgekit import devices

            entry = devices.bench(out, name, progress=not args.quiet)
            print(devices.summary(name, entry))
            code = code if all(r["ok"] for r in entry["budgets"]) else OVER_BUDGET
    print(f"manifest: {out / 'manifest.json'}")
    return code


def aligned(text: str) -> str:
    """Markdown tables in `text` with their columns padded to one width (still markdown): read in a terminal or a CI
    log, the numbers line up. Columns whose rule is ---: are right-aligned."""
    lines, out, block = text.split("\n"), [], []
    for line in lines + [""]:
        if line.startswith("|") and line.endswith("|"):
            block.append([c.strip() for c in re.split(r"(?<!\\)\|", line[1:-1])])  # a cell's \| is text
            continue
        if block:
            rule = [set("".join(r)) <= set("-:") for r in block]  # the |---|--:| row: it sets no width
            widths = [max([3] + [shown(r[i]) for r, is_rule in zip(block, rule) if not is_rule and i < len(r)])
                      for i in range(max(map(len, block)))]
            right = [c.endswith(":") for c in block[1]] if len(block) > 1 else []
            for r, is_rule in zip(block, rule):
                cells = [("-" * (w - 1) + ":" if c.endswith(":") else "-" * w) if is_rule
                         else " " * (w - shown(c)) + c if i < len(right) and right[i] else c + " " * (w - shown(c))
                         for i, (c, w) in enumerate(zip(r, widths))]
                out.append("| " + " | ".join(cells) + " |")
            block = []
        out.append(line)
    return "\n".join(out[:-1])


def shown(text: str) -> int:
    """The columns a terminal gives `text`: wide characters (CJK, most emoji) take two, combining marks none."""
    return sum(0 if unicodedata.combining(c) else 2 if unicodedata.east_asian_width(c) in "WF" else 1 for c in text)


def summary(manifest: dict) -> str:
    from edgekit import gate, report
    from edgekit.stages.evaluate import worst_class

    rows = ["| stage | seconds | params | size MB | accuracy | latency p50 ms |", "|---|---:|---:|---:|---:|---:|"]
    for s in manifest["stages"]:
        m = s["metrics"]
        seconds = f"{s['seconds']:.0f}" + (" (reused)" if s.get("reused") else "")
        rows.append(f"| {s['name']} | {seconds} | {report.number(m.get('params') or None, 'params')} | "
                    f"{report.number(m.get('size_mb'), 'MB')} | {report.number(m.get('accuracy'))} | "
                    f"{report.number(m.get('latency_ms_p50'), 'ms')} |")
    final = manifest["final"]["metrics"]
    if manifest["final"].get("outputs"):  # one artifact per target and format
        rows += ["", "| artifact | path | size MB | accuracy | latency p50 ms |", "|---|---|---:|---:|---:|"]
        for name, o in manifest["final"]["outputs"].items():
            m = o["metrics"]
            rows.append(f"| {name} | {o['path']} | {report.number(m.get('size_mb'), 'MB')} | "
                        f"{report.number(m.get('accuracy'))} | {report.number(m.get('latency_ms_p50'), 'ms')} |")
    rows.append("")
    commonest = "label set" if final.get("f1_micro") is not None else "class"  # f1_micro: a multi-label run
    majority = f" (always the commonest {commonest}: {final['majority_accuracy']:.4f})" \
        if "majority_accuracy" in final else ""
    kept = final.get("accuracy_retained")
    scored = (f"teacher accuracy {final['teacher_accuracy']:.4f}{majority}, "
              f"retained {'undefined (the teacher scored 0)' if kept is None else f'{kept:.4f}'}"
              f"{gate.interval_note(final.get('accuracy_retained_interval'))}"
              f"{f' on {n} {split} sentences' if (n := final.get('eval_examples')) and (split := final.get('eval_split')) else ''}"
              if final.get("teacher_accuracy") is not None else "accuracy not measured (no evaluate stage)")
    rows.append(f"final: {manifest['final']['path']} ({manifest['final']['kind']}); {scored}")
    if final.get("f1_micro") is not None and final.get("teacher_f1_micro") is not None:  # a multi-label run
        kept = final.get("f1_micro_retained")
        rows.append(f"multi-label: accuracy is exact-match (a sentence's whole set of labels); micro-F1 "
                    f"{final['f1_micro']:.4f} against the teacher's {final['teacher_f1_micro']:.4f}"
                    + (f", retained {kept:.4f}{gate.interval_note(final.get('f1_micro_retained_interval'))}"
                       if kept is not None else ""))
    classes = final.get("per_class") or {}
    if any("f1" in c for c in classes.values()):  # a multi-label run: the label whose F1 fell most
        if worst := worst_class(classes, "f1"):
            name, c = worst
            rows.append(f"label losing most: '{name}', F1 {c['f1']:.4f} against the teacher's {c['teacher_f1']:.4f} "
                        f"(recall {c['recall']:.4f} against {c['teacher_recall']:.4f}; {c['examples']} sentences "
                        f"have it; every label: edgekit report)")
    elif worst := worst_class(classes):
        name, c = worst
        rows.append(f"class losing most: '{name}', recall {c['recall']:.4f} against the teacher's "
                    f"{c['teacher_recall']:.4f} "
                    f"({c['examples']} sentences; every class: edgekit report)")
    if final.get("bench_cpu"):
        isa = final.get("bench_int8_isa") or "INT8 instructions unknown"
        rows.append(f"latency measured on {final['bench_cpu']} ({isa}), "
                    f"{report.threads_text(final.get('bench_threads'))}, {final.get('bench_seq_len')} tokens")
    for b in manifest["budgets"]:
        where = f"{b['artifact']}: " if "artifact" in b else ""
        verdict = "ok" if b["ok"] else "NOT MEASURED: add the stage that measures it" if b["actual"] is None \
            else "OVER BUDGET"
        rows.append(f"budget {where}{b['metric']} {b['op']} {b['target']:g}: actual {gate.number(b)} "
                    f"{verdict}{gate.interval_note(b.get('interval'), b['target'])}")
    return "\n".join(rows)


def cmd_gate(args) -> int:
    from edgekit import gate

    bad = {flag: report_problem(flag, file, kind) for flag, file, kind in (("--junit", args.junit, "XML"),
                                                                            ("--json", args.json, "JSON"))}
    if args.junit and args.json and "-" not in (args.junit, args.json) and \
            Path(args.junit).resolve() == Path(args.json).resolve():
        bad = dict.fromkeys(bad, f"--junit and --json both name {args.json}; give each its own file")
    if said := next((problem for problem in bad.values() if problem), ""):  # the other report says so too: an
        gate.write_reports([], str(args.path), None if bad["--junit"] else args.junit, error=said,  # earlier pass
                           json_file=None if bad["--json"] else args.json)  # must not stay in it
        raise UsageError(said)
    try:  # a budget that does not parse is said in the CI reports too: an earlier passing gate.xml must not stay
        budgets = [gate.parse_budget(b) for b in args.budget]
        for value, metric, op, flag in ((args.max_size_mb, "size_mb", "<=", "--max-size-mb"),
                                        (args.max_latency_ms_p90, "latency_ms_p90", "<=", "--max-latency-ms-p90"),
                                        (args.min_accuracy_retained, "accuracy_retained", ">=",
                                         "--min-accuracy-retained")):
            if value is not None:
                budgets.append((metric, op, gate.number_of(flag, value)))
        rows = gate.check(args.path, list(dict.fromkeys(budgets)), args.target)  # a budget given twice: one row
    except EdgekitError as e:  # CI dashboards show why nothing was checked, not a missing file
        gate.write_reports([], str(args.path), args.junit, error=str(e), json_file=args.json)
        raise
    if args.json != "-":
        print("\n".join(gate.lines(rows)))
    gate.write_reports(rows, str(args.path), args.junit, json_file=args.json)
    return 0 if all(r["ok"] for r in rows) else OVER_BUDGET


def report_problem(flag: str, file: str, kind: str) -> str:
    """'' or why gate cannot write a report to `file`."""
    if file == "-" and flag == "--junit":
        return "--junit - is not allowed: the JUnit report goes to a file; give its path (--json - prints)"
    if not file or file == "-":
        return ""
    if Path(file).is_dir():
        return f"{flag} {file} is a folder; give the path of the {kind} file to write"
    if not Path(file).resolve().parent.is_dir():
        return f"{flag} {file}: its folder does not exist; create it or give another path"
    return ""


def cmd_bench(args) -> int:
    from edgekit import devices, gate

    if args.stage:
        job = devices.stage(args.run, args.target, args.stage, args.targets, args.model)
        print(f"staged: {args.stage} (job.json says what it holds). Copy it to the device and run there:\n"
              f"  cd {shlex.quote(Path(args.stage).name)} && {job['command']}\n"
              f"then bring result.json back here and merge it:\n  {job['merge']}")
        return 0
    entry = devices.bench(args.run, args.target, args.targets, args.model, progress=not args.quiet,
                          result_file=args.result)
    print(devices.summary(args.target, entry))
    gate.write_reports(entry["budgets"], f"{args.run} on {args.target}")
    return 0 if all(r["ok"] for r in entry["budgets"]) else OVER_BUDGET


def cmd_predict(args) -> int:
    from edgekit import artifact, predict

    done = predict.run(args)
    said = sys.stderr if args.out and artifact.written_into(Path(args.out)) else sys.stdout  # --out /dev/stdout: alone
    n = len(done["rows"])
    if args.out:
        print(f"written: {args.out} ({n} prediction{'s' * (n != 1)})", file=said)
    else:
        print(aligned(predict.markdown(done["rows"])))
    if done["accuracy"] is not None:
        print(f"accuracy {done['accuracy']:.4f} ({done['right']} of {done['labelled']} labelled texts)", file=said)
    return 0


def cmd_report(args) -> int:
    from edgekit import report

    runs = {(Path(r).parent if Path(r).suffix == ".json" else Path(r)).resolve() for r in args.runs}  # each once
    out = Path(args.out) if args.out else (runs.pop() / "report" if len(runs) == 1 else Path("artifacts") / "report")
    print(report.build(args.runs, out))
    return 0


def cmd_compare(args) -> int:
    from edgekit import compare

    specs = list(args.models) + (list(compare.FAMILIES) if args.families else [])
    rows = compare.run(specs, Path(args.out), args.data, args.threads, args.seq_len, progress=not args.quiet,
                       text_column=args.text_column, label_column=args.label_column,
                       label_separator=args.label_separator, label_columns=args.label_columns)
    print(aligned(compare.markdown(rows)), end="")
    print(f"written: {Path(args.out) / 'compare.md'}, {', '.join(compare.OUTPUTS[1:])}")
    return 0


def cmd_sweep(args) -> int:
    from edgekit import sweep

    name = Path(args.recipe).stem
    out = Path(args.out) if args.out else Path("artifacts") / f"sweep-{name}"
    result = sweep.sweep(args.recipe, args.overrides, out, args.ray, progress=not args.quiet)
    print(aligned(result["table"]))
    built = out / "report" / "report.md"
    print(f"written: {out / 'sweep.md'}" + (f", {built}" if built.is_file() else ""))
    status = {r["status"] for r in result["rows"]}
    for r in result["rows"]:
        if r["status"] == "failed":
            print(f"edgekit: error: sweep point {r['run']}: {r['error']}", file=sys.stderr)
    return 1 if "failed" in status else OVER_BUDGET if "over_budget" in status else 0


def cmd_recipes(args) -> int:
    from edgekit import recipe

    if args.action not in ("list", "show"):
        hint = f"; to see that recipe: edgekit recipes show {args.action}" if args.action in recipe.names() else ""
        raise UsageError(f"recipes takes list or show, not {args.action!r}{hint}")
    if args.action == "show":
        if not args.name:
            raise UsageError("recipes show needs a NAME; see `edgekit recipes`")
        print(recipe.find(args.name).read_text(), end="")
        return 0
    if args.name is not None:
        raise UsageError(f"recipes list takes no name (got {args.name!r}); to see one: edgekit recipes show NAME")
    import shutil
    import textwrap

    import yaml

    from edgekit.progress import terminal

    width = max(60, shutil.get_terminal_size().columns)  # lines of ~350 characters, wrapped under their name on a
    for name in recipe.names():  # terminal; a pipe (awk '{print $1}') keeps one line per recipe
        line = f"{name:20s} {yaml.safe_load(recipe.find(name).read_text()).get('description', '')}"
        print(textwrap.fill(line, width, subsequent_indent=" " * 21, break_on_hyphens=False)
              if terminal(sys.stdout) else line)
    return 0


def cmd_assets(args) -> int:
    from edgekit import assets

    if args.action not in ("list", "fetch", "clean"):
        hint = f"; to fetch that asset: edgekit assets fetch {args.action}" if args.action in assets.ASSETS else ""
        raise UsageError(f"assets takes list, fetch or clean, not {args.action!r}{hint}")
    if args.action == "clean":
        entries = [*assets.ASSETS, *MADE]
        if args.name not in (*entries, "all"):
            raise UsageError(f"assets clean needs a NAME from: {', '.join(entries)}, or all"
                             f"{f'; got {args.name!r}' if args.name is not None else ''}")
        root = assets.cache_dir()
        freed = 0.0
        for name in entries if args.name == "all" else [args.name]:
            freed += folder_mb(root / name)
            shutil.rmtree(root / name, ignore_errors=True)
        print(f"removed {args.name} from {root}: {freed:.1f} MB freed (fetched or made again when needed)")
        return 0
    if args.action == "fetch":
        if args.name not in assets.ASSETS:
            got = f"; got {args.name!r}" if args.name is not None else ""
            raise UsageError(f"assets fetch needs a NAME from: {', '.join(assets.ASSETS)}{got}")
        print(assets.path(args.name))
        return 0
    if args.name is not None:
        raise UsageError(f"assets list takes no name (got {args.name!r}); to fetch one: edgekit assets fetch NAME")
    root = assets.cache_dir()
    print(f"cache: {root}" + (" (EDGEKIT_CACHE)" if "EDGEKIT_CACHE" in os.environ else ""))
    rows = [(r["name"], r["kind"], r["state"], f"{folder_mb(root / r['name']):.1f} MB", r["package"], r["about"])
            for r in assets.listing()]
    rows += [(name, "made", "cached" if (root / name).is_dir() else "none", f"{folder_mb(root / name):.1f} MB", "-",
              about) for name, about in MADE.items()]
    widths = [max(len(r[i]) for r in rows) for i in range(5)]
    for row in rows:
        print(" ".join(f"{v:{w}s}" for v, w in zip(row, widths)) + " " + row[5])
    print(f"total {folder_mb(root):.1f} MB; edgekit assets clean NAME (or all) frees an entry: an asset is fetched "
          f"again and the rest made again when needed")
    return 0


MADE = {"augment": "distill.augment's sentence sets, one per teacher and data",  # cache entries edgekit makes
        "qemu-arm64": "the qemu-arm64 target's Debian roots, one per runner set"}


def folder_mb(path: Path) -> float:
    """What the files under `path` take, in MB (hard links once)."""
    seen, total = set(), 0
    for p in path.rglob("*") if path.is_dir() else ():
        if p.is_file() and not p.is_symlink() and (st := p.stat()).st_ino not in seen:
            seen.add(st.st_ino)
            total += st.st_size
    return total / 1e6


if __name__ == "__main__":
    sys.exit(main())
