"""The loop that runs a recipe: resolve the model and data, then each stage in order, each into its own
folder, the manifest rewritten atomically after every stage. A stage whose input and settings are
unchanged (and whose files still match their sha256) is reused; a stopped stage resumes in place.

Under `torchrun --nproc_per_node N` rank 0 owns the run folder (lock, manifest, reuse, renames) and runs every
stage; the other ranks join the training of the stages in DISTRIBUTED when rank 0 tells them to, then return."""
import fcntl
import hashlib
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import edgekit
from edgekit import assets, data, errors, families, gate, recipe as recipes, stages
from edgekit.artifact import Artifact, remove, through_temp, weights_mb, write_json
from edgekit.errors import EdgekitError, UsageError

SCHEMA = 1
LOW_DISK_MB = 100
TOKENIZER_FILES = ("tokenizer.json", "vocab.txt", "vocab.json", "*.model")  # fast, WordPiece, BPE, SentencePiece
DISTRIBUTED = ("finetune", "distill", "prune")  # data-parallel under torchrun (training.train); the rest: rank 0


@dataclass
class Context:
    """What every stage may read besides its input artifact."""
    splits: data.Splits
    teacher: Artifact
    seed: int
    max_length: int
    progress: bool
    targets: list = field(default_factory=lambda: ["x86"])  # deployment targets (edgekit.targets)
    thresholds: float | str = 0.5  # a multi-label model's per label: one probability for all, or "f1" (tuned)


def resolve_model(spec: str) -> Artifact:
    """An asset name, a local transformers folder, or (where a hub is reachable) a hub id."""
    if assets.is_asset(spec):
        if assets.ASSETS[spec]["kind"] != "model":
            raise EdgekitError(f"'{spec}' is a dataset, not a model; model assets: {', '.join(model_assets())}")
        return Artifact(assets.path(spec), "hf")
    path = Path(spec).expanduser()
    if path.exists():
        if not (path / "config.json").is_file():
            raise EdgekitError(f"{path} is not a transformers model folder (no config.json)")
        try:
            config = json.loads((path / "config.json").read_text())
        except (UnicodeDecodeError, ValueError) as e:
            raise EdgekitError(f"{path / 'config.json'} is not valid JSON ({e}); restore it from where the model came")
        if not isinstance(config, dict) or not config.get("model_type"):
            raise EdgekitError(f"{path / 'config.json'} names no model_type (bert, roberta, ...); restore it from "
                               f"where the model came (model.save_pretrained(folder) writes it)")
        if not _has(path, "*.safetensors"):
            if _has(path, "pytorch_model*.bin"):  # a pickle can run code as it loads: never opened here
                raise EdgekitError(f"{path} holds its weights only as pytorch_model.bin, a pickle, which edgekit does "
                                   f"not load; if you trust the file, convert it once: python -c \"from transformers import "
                                   f"AutoModelForSequenceClassification as M; M.from_pretrained('{path}')"
                                   f".save_pretrained('{path}')\" (writes model.safetensors)")
            raise EdgekitError(f"{path} has no weights (model.safetensors); save the model into it "
                               f"(model.save_pretrained(folder))")
        for weights in sorted(path.glob("*.safetensors")):  # a cut-short copy fails here, not inside a stage
            try:
                from safetensors import safe_open

                with safe_open(str(weights), "pt"):
                    pass
            except Exception as e:
                raise EdgekitError(f"{weights} is damaged or incomplete ({e}); copy or save the model again")
        if not _has(path, *TOKENIZER_FILES):  # transformers would make up a tokenizer of 5 special tokens
            raise EdgekitError(f"{path} has no tokenizer files ({', '.join(TOKENIZER_FILES)}); save the model's "
                               f"tokenizer into it (tokenizer.save_pretrained(folder))")
        readable(path)
        return Artifact(path.resolve(), "hf")
    if looks_local(spec):  # a path, not a hub id: asking the hub would only hide the typo
        raise UsageError(f"model '{spec}': no such folder ({path.absolute()}); give a transformers model folder, "
                         f"a model asset ({', '.join(model_assets())}) or a hub id (org/name)")
    try:
        from huggingface_hub import snapshot_download

        return Artifact(Path(snapshot_download(spec, allow_patterns=["*.json", "*.txt", "*.safetensors", "*.model"])), "hf")
    except Exception as e:
        raise EdgekitError(f"model '{spec}' is not an asset or a local folder, and the model hub could not provide it "
                           f"({type(e).__name__}); offline model assets: {', '.join(model_assets())}")


def readable(path: Path) -> None:
    """A local model folder's config and tokenizer open with transformers, and the family is one edgekit knows (each
    failed inside a stage with a traceback: wrong types in config.json, a config that asks to run the folder's own
    code, a cut-short tokenizer.json)."""
    from transformers import AutoConfig

    for what, load in (("config.json", AutoConfig.from_pretrained), ("tokenizer", families.load_tokenizer)):
        try:
            loaded = load(path, trust_remote_code=False)  # raises, where None would ask on the terminal
        except Exception as e:  # transformers raises many kinds here; each is a damaged or foreign folder
            if "trust_remote_code" in str(e):
                raise EdgekitError(f"{path} needs its own code to load (trust_remote_code), which edgekit never runs; "
                                   f"give a model of a family transformers ships: {', '.join(families.FAMILIES)}")
            reason = " ".join(str(e).split())[:200]
            raise EdgekitError(f"{path}: the {what} cannot be read ({type(e).__name__}: {reason}); restore the folder "
                               f"from where the model came (model.save_pretrained / tokenizer.save_pretrained)")
        if what == "config.json":
            families.family(loaded)
            config = loaded
    if loaded.pad_token_id is None:  # each failed inside a stage with a traceback
        raise EdgekitError(f"{path}: the tokenizer has no padding token, which batches and the exported files need; "
                           f"set one (tokenizer.pad_token = tokenizer.unk_token, or a <pad> token added with "
                           f"resize_token_embeddings) and save it (tokenizer.save_pretrained(folder))")
    if len(loaded) > getattr(config, "vocab_size", len(loaded)):
        raise EdgekitError(f"{path}: the tokenizer has {len(loaded)} token ids, the model's embedding table "
                           f"{config.vocab_size} rows (tokens added without resizing it); run "
                           f"model.resize_token_embeddings(len(tokenizer)) and save the model again")


def looks_local(spec: str) -> bool:
    """A model spec that can only mean a path on this machine (hub ids are `name` or `org/name`)."""
    return spec.startswith(("/", "./", "../", "~")) or spec in (".", "..") or "\\" in spec \
        or spec.count("/") > 1 or (len(spec) > 1 and spec[1] == ":")


def _has(folder: Path, *patterns) -> bool:
    return any(True for pattern in patterns for _ in folder.glob(pattern))


def model_assets() -> list:
    return [n for n, a in assets.ASSETS.items() if a["kind"] == "model"]


def prepare_out(out: Path) -> None:
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {out} is a file; give a folder path")
    try:
        out.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=out):  # gone even after a stop (a named probe file stayed)
            pass
    except OSError as e:
        raise EdgekitError(f"cannot write to {out} ({e.strerror}); choose a writable --out folder")


def foreign_folders(out: Path) -> list:
    """Names in `out` that look like stage folders (NN-stage, NN-stage.partial) that no edgekit run made: the
    manifest lists its stages' folders, and a stopped stage's `.partial` holds its `.key`. A run replaces and
    removes stage folders, so it must never meet one of these (a user's folder, a symlink)."""
    made = listed_folders(out / "manifest.json") or set()
    return [p.name for p in sorted(out.glob("[0-9][0-9]-*")) if p.name.removesuffix(".partial")[3:] in stages.NAMES
            and (p.is_symlink() or not p.is_dir()
                 or (p.name.removesuffix(".partial") not in made and not (p / ".key").is_file()))]


def made_here(manifest: dict) -> set:
    """The stage folders a run's manifest lists: its stages', and those on disk it has not listed as its own yet (an
    earlier run's, the one being made)."""
    return ({f"{i:02d}-{s.get('name')}" for i, s in enumerate(manifest.get("stages", []), 1)}
            | set(manifest.get("earlier_stages", [])))


def listed_folders(path: Path) -> set | None:
    """The stage folders the manifest at `path` lists, read from any manifest edgekit wrote, also one of another
    schema or one that fails validation: it is not used to skip work here, only to know which folders a run made.
    None when there is none or it cannot be read."""
    try:
        manifest = json.loads(path.read_text())
        names = made_here(manifest)
    except (OSError, UnicodeDecodeError, ValueError, TypeError, AttributeError):
        return None
    return {n for n in names if isinstance(n, str)}


def old_report(out: Path) -> bool:
    """Whether `out` holds the folder `edgekit report RUN` writes by default (report.md, report.html, PNG plots and
    nothing else): a run into `out` replaces the run it describes, and a CI upload of the folder showed the old
    numbers beside the new model."""
    folder = out / "report"
    if folder.is_symlink() or not folder.is_dir():  # a link is someone's: rmtree refused it, and "removed" was said
        return False
    try:
        return (folder / "report.md").read_text(encoding="utf-8").startswith("# edgekit report") and \
            all(p.is_file() and p.suffix in (".md", ".html", ".png") for p in folder.iterdir())
    except (OSError, UnicodeDecodeError):
        return False


def lock(out: Path, wait_s: float = 0, busy: str = "wait for it to finish or choose another --out"):
    """The run folder's lock, held while a run (or a bench's merge) writes it; `wait_s`: how long to wait for it."""
    handle = open(out / ".lock", "a+")
    deadline = time.monotonic() + wait_s
    while True:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return handle
        except BlockingIOError:
            if time.monotonic() >= deadline:
                handle.close()
                raise EdgekitError(f"another edgekit run is writing to {out}; {busy}")
            time.sleep(0.2)


def log(msg: str, progress: bool) -> None:
    if progress:
        print(msg, file=sys.stderr, flush=True)


@families.quiet_transformers()  # and the host's settings back after the run
def run(recipe: dict, out: Path, progress: bool = True, shared: Path = None, warn: bool = True) -> dict:
    """Run a recipe into `out`; returns the manifest (None on a rank > 0 under torchrun: rank 0 holds it).
    `shared`: a folder of finished stages, by key, that several runs draw on (sweeps); `warn`: say what looks wrong
    in the data (a sweep says it once, before its points)."""
    from edgekit import training

    out = Path(out).resolve()
    rank, world = training.distributed()
    if rank > 0:
        return follow(recipe, out)
    team = Team(world)
    try:
        from transformers import AutoConfig

        named = recipe["data"]["source"]  # a local file as the manifest records it: edgekit bench reads it from anywhere
        if named not in data.DATASETS and (file := Path(named).expanduser()).is_file():
            recipe = {**recipe, "data": {**recipe["data"], "source": str(file.resolve())}}
        loaded = data.load(seed=recipe["seed"], **recipe["data"])  # before the teacher: bad data is said at once,
        check_budget_kind(recipe["budgets"], loaded.multi_label, recipe.get("devices"))
        source = resolve_model(recipe["teacher"])  # not after fetching a model asset
        config = AutoConfig.from_pretrained(source.path)  # read once for the shape and label checks
        splits = in_teacher_order(loaded, families.label_names(config))
        check_local_files(recipe)
        check_shapes(recipe, config)
        if "finetune" not in recipe["stages"]:
            check_head(source.path, config.architectures, recipe["teacher"])
            check_labels(config, splits.labels, recipe["teacher"], splits.multi_label)
            check_order(source, config, splits, recipe["teacher"], recipe["max_length"])
        prepare_out(out)
        fresh = not (out / ".lock").exists()
        held = lock(out)
        if foreign := foreign_folders(out):
            held.close()
            if fresh:  # a refused run leaves the user's folder as it was
                (out / ".lock").unlink(missing_ok=True)
            why = "its manifest.json cannot be read, so nothing shows an edgekit run made it" if \
                (out / "manifest.json").exists() and listed_folders(out / "manifest.json") is None else \
                "not made by an edgekit run here (no manifest.json lists it)"
            raise UsageError(f"--out {out} holds {', '.join(foreign)}, named like a stage but {why}; a run would "
                             f"replace it: move it away or choose another --out")
        if old_report(out):
            shutil.rmtree(out / "report", ignore_errors=True)
            log(f"removed {out / 'report'}: it described the run this one replaces (edgekit report {out} makes it "
                f"again)", progress)
        if warn:
            tell_data(splits, progress, recipe)  # after the checks: a refused run says one line
            tell_length(splits, source, recipe["max_length"], progress)
        import torch

        try:  # seeded stages; the caller's random stream goes on after the run as if it had not run
            with torch.random.fork_rng(devices=[]):
                return _run(recipe, out, source, splits, progress, Path(shared).resolve() if shared else None, team)
        finally:
            held.close()
    finally:
        team.release()  # on an error too: the other ranks stop waiting, rank 0 reports it


def in_teacher_order(splits: data.Splits, names: list) -> data.Splits:
    """The data's classes in the order of `names` (a teacher's or model's labels) where they are the same classes in
    another order: class id k then means in every model the run writes what it meant in the teacher, and no output
    row is moved."""
    if families.unnamed(names) or names == splits.labels or sorted(names) != sorted(splits.labels):
        return splits
    return relabel(splits, names)


def relabel(splits: data.Splits, names: list) -> data.Splits:
    """`splits` with its classes numbered in the order of `names` (the same names)."""
    new_id = [names.index(n) for n in splits.labels]

    def moved(rows):
        if splits.multi_label:  # a 0/1 per label, in the new order
            return [(t, tuple(y[splits.labels.index(n)] for n in names)) for t, y in rows]
        return [(t, new_id[y]) for t, y in rows]

    stats = dict(splits.stats)
    if "classes" in stats:
        stats["classes"] = {n: stats["classes"][n] for n in names}
    return replace(splits, train=moved(splits.train), validation=moved(splits.validation), test=moved(splits.test),
                   labels=list(names), stats=stats)


def check_head(path: Path, architectures, spec: str) -> None:
    """Without a finetune stage the teacher must be a sequence classifier: a plain encoder, a masked-LM (as
    bert-base-uncased is published) or a token classifier got a new random head on every load, and a run exported
    a random classifier with exit code 0. Read from config.json's `architectures`, else from the weights' names."""
    from safetensors import safe_open

    if architectures:
        ok = any(a.endswith("ForSequenceClassification") for a in architectures)
    else:
        keys = set()
        for weights in Path(path).glob("*.safetensors"):
            with safe_open(str(weights), "pt") as f:
                keys |= set(f.keys())
        ok = any(k.startswith(("classifier.", "pre_classifier.")) for k in keys)
    if not ok:
        what = f"it is a {', '.join(architectures)}" if architectures else "its weights hold no classifier"
        raise EdgekitError(f"teacher {spec} is not a sequence classifier ({what}); add a finetune stage, which trains "
                           f"a classification head on the data, or give a model fine-tuned for sequence classification")


def check_budget_kind(budgets: dict, multi_label: bool, targets: dict = None) -> None:
    """A budget on f1_micro, f1_micro_retained or label_f1_retained, which only a multi-label run measures, is refused
    before the first stage of a run whose data gives one label per text (and before `edgekit bench` runs such a
    run's model), in the recipe's budgets or a device target's: it could never hold."""
    if multi_label:
        return
    where = [(m, f"budgets.{m}") for m in budgets] + [
        (m, f"devices.{name}.budgets.{m}") for name, spec in (targets or {}).items()
        if isinstance(spec, dict) and isinstance(spec.get("budgets"), dict) for m in spec["budgets"]]
    if named := next(((m, key) for m, key in where if m in recipes.MULTI_LABEL_METRICS), None):
        raise UsageError(f"budget {named[0]}: only a multi-label run measures it (an F1 of label decisions), and "
                         f"this data gives one label per text; bound accuracy or accuracy_retained instead "
                         f"({named[1]}=null drops it)")


def check_labels(config, labels: list, spec: str, multi_label: bool = False) -> None:
    """Without a finetune stage the teacher's class ids are the data's: its named labels must be the data's (the
    data takes the teacher's order: in_teacher_order; unnamed LABEL_0.. are taken in order), and its head (`config`)
    must be of the data's kind: a single-label classifier, or for multi-label data a multi-label one."""
    multi = families.is_multi_label(config)
    if config.problem_type == "regression" or config.num_labels == 1:
        raise EdgekitError(f"teacher {spec} has a regression head (problem_type {config.problem_type}, "
                           f"{config.num_labels} output{'s' if config.num_labels != 1 else ''}); edgekit compresses "
                           f"single- and multi-label classifiers: give one, or add a finetune stage, which trains a "
                           f"classification head")
    if multi and not multi_label:
        raise EdgekitError(f"teacher {spec} has a multi-label head (problem_type {config.problem_type}) but the data "
                           f"gives one label per row; give its rows lists of labels (JSONL) or cells cut at "
                           f"data.label_separator, or add a finetune stage, which trains a single-label head")
    if multi_label and not multi:
        raise EdgekitError(f"the data is multi-label (rows with several labels or none) but teacher {spec} has a "
                           f"single-label head (problem_type {config.problem_type or 'not set'}); add a finetune "
                           f"stage, which trains a multi-label head, or give a teacher fine-tuned for multi-label "
                           f"(problem_type multi_label_classification)")
    have = families.label_names(config)
    if len(have) != len(labels) or (have != labels and not families.unnamed(have)):
        near = sorted(n.strip().lower() for n in have) == sorted(n.strip().lower() for n in labels)
        raise EdgekitError(f"teacher {spec} predicts [{', '.join(have)}] but the data's labels are "
                           f"[{', '.join(labels)}]{' (they differ only in case or spaces)' if near else ''}; "
                           f"add a finetune stage, which re-heads the teacher, or give data labelled as the teacher is")


ORDER_SAMPLE = 256  # sentences check_order scores


def check_order(source: Artifact, config, splits: data.Splits, spec: str, max_length: int) -> None:
    """A teacher whose classes were never named (LABEL_0, ...) is taken in the data's label order. Where it clearly
    scores well in another order and poorly in this one (a model fine-tuned with positive = 0 on data whose labels
    sort negative first), refuse: every stage would copy the mix-up and accuracy_retained would still read 1.0."""
    import numpy as np
    from scipy.optimize import linear_sum_assignment

    from edgekit import runtime
    from edgekit.stages.evaluate import predictions

    if not families.unnamed(families.label_names(config)) or splits.multi_label:  # labels are not one of k there
        return
    examples = (splits.validation + splits.train)[:ORDER_SAMPLE]
    k = len(splits.labels)
    counts = np.zeros((k, k))  # [true class, predicted output]
    for p, (_, y) in zip(predictions(runtime.load(source.path, max_length=max_length), examples, 32, False, ""),
                         examples):
        counts[y, p] += 1
    rows, cols = linear_sum_assignment(-counts)  # the order that scores best: true class r <-> output cols[r]
    given, best = np.trace(counts) / len(examples), counts[rows, cols].sum() / len(examples)
    majority = counts.sum(1).max() / len(examples)
    if best >= given + 0.3 and best >= majority + 0.2:
        order = ", ".join(f"LABEL_{c}={splits.labels[r]}" for r, c in sorted(zip(rows, cols), key=lambda rc: rc[1]))
        raise EdgekitError(f"teacher {spec} names no classes (LABEL_0, ...), so they are taken in the data's order "
                           f"[{', '.join(splits.labels)}], but on {len(examples)} of the data's sentences it scores "
                           f"{given:.2f} that way and {best:.2f} taking {order}; write its classes' names into "
                           f"its config.json (id2label), or add a finetune stage")


class Team:
    """Rank 0's side of a torchrun run: tells the other ranks which distributed stage to run with it."""

    def __init__(self, world: int):
        self.waiting, self.busy = world > 1, False

    def run(self, name: str, partial: Path, artifact: Artifact, teacher: Artifact, settings: dict) -> bool:
        if not self.waiting:
            return False
        from edgekit import training

        root = partial.parent
        training.tell({"run": name, "dir": partial.name, "input": artifact.to_json(root),
                       "teacher": teacher.to_json(root), "settings": settings})
        self.busy = True
        return True

    def release(self) -> None:
        """Tell the other ranks to return. Not from inside a stage that failed: they are training, not
        listening; rank 0's exit ends them (torchrun stops the group)."""
        if self.waiting and not self.busy:
            from edgekit import training

            training.tell({"done": True})
            self.waiting = False


def follow(recipe: dict, out: Path) -> None:
    """A rank > 0 under torchrun: run the distributed stages rank 0 names, in its folders, until it is done."""
    import torch

    from edgekit import training

    ctx = None
    while "run" in (message := training.tell(None)):
        if ctx is None:  # rank 0 has fetched the assets by now
            from transformers import AutoConfig

            names = families.label_names(AutoConfig.from_pretrained(resolve_model(recipe["teacher"]).path))
            ctx = Context(in_teacher_order(data.load(seed=recipe["seed"], **recipe["data"]), names), None,
                          recipe["seed"], recipe["max_length"], False, recipe["targets"], recipe["thresholds"])
        ctx.teacher = Artifact.from_json(message["teacher"], out)
        torch.manual_seed(ctx.seed)
        stages.entry(message["run"])(Artifact.from_json(message["input"], out), out / message["dir"], ctx,
                                     **message["settings"])
        torch.distributed.barrier()  # rank 0 renames the folder only after every rank is done with it
    return None


def _run(recipe: dict, out: Path, source: Artifact, splits: data.Splits, progress: bool, shared: Path = None,
         team: Team = None) -> dict:
    previous = read_manifest(out / "manifest.json")
    earlier = (previous.get("stages") or []) + previous.get("unchecked_stages", [])  # a stopped rerun's too
    manifest = {"schema": SCHEMA, "edgekit_version": edgekit.__version__, "status": "running", "recipe": recipe,
                "model": {"spec": recipe["teacher"], "path": str(source.path),
                          "fingerprint": assets.fingerprint(source.path)},
                "data": {"source": splits.source, "fingerprint": splits.fingerprint(), "labels": splits.labels,
                         "sizes": {s: len(getattr(splits, s)) for s in ("train", "validation", "test")}},
                "stages": [], "final": None, "budgets": []}
    ours = {f"{i:02d}-{name}" for i, name in enumerate(recipe["stages"], 1)}
    known = listed_folders(out / "manifest.json") or set()  # an earlier run's folders: listed until this run
    # replaces or removes them, so that a run stopped (or failed) half-way leaves none that the next would refuse as
    # not made here
    ctx = Context(splits, source, recipe["seed"], recipe["max_length"], progress, recipe["targets"],
                  recipe["thresholds"])
    artifact, input_print = source, manifest["model"]["fingerprint"]
    teacher_print = input_print
    for i, name in enumerate(recipe["stages"], 1):
        errors.stop_point()  # a stop signal Python dropped
        if team and not set(recipe["stages"][i - 1:]) & set(DISTRIBUTED):
            team.release()  # no training left for the other ranks
        settings = recipe.get(name) or {}
        key, legacy = (stage_key(name, settings, input_print, teacher_print, splits, recipe, legacy=flag)
                       for flag in (False, True))
        stage_dir = out / f"{i:02d}-{name}"
        manifest["earlier_stages"] = sorted((known | {stage_dir.name}) - made_here({"stages": manifest["stages"]}))
        manifest["unchecked_stages"] = earlier[i - 1:]  # a stop before they are checked (hashing a stage's files
        # takes seconds) leaves them to the next run, which retrained them all
        write_json(out / "manifest.json", manifest)  # before the stage: a stop inside it leaves its folder listed
        entry = reusable(earlier, i - 1, name, (key, legacy), out)
        if not entry and shared:
            entry = from_shared(shared, key, stage_dir)
            if entry:  # same key: same input content; paths are this run's own
                entry["input"] = artifact.to_json(out)
                if not entry["output"]["path"].startswith(stage_dir.name + "/"):  # a stage that measures only
                    entry["output"]["path"] = entry["input"]["path"]
                    for name_, o in (entry["output"].get("outputs") or {}).items():
                        o["path"] = entry["input"]["outputs"][name_]["path"]
        if entry:
            log(f"[{i}/{len(recipe['stages'])}] {name}: unchanged, reused {stage_dir.name}", progress)
            entry["reused"], entry["key"] = True, key
            artifact = Artifact.from_json(entry["output"], out)
            shutil.rmtree(stage_dir.with_name(stage_dir.name + ".partial"), ignore_errors=True)  # a stopped run's
            # of other settings (this folder holds one run: what it reuses is what it keeps)
        else:
            log(f"[{i}/{len(recipe['stages'])}] {name}", progress)
            started = time.time()
            artifact_in = artifact
            artifact = run_stage(name, artifact, stage_dir, key, ctx, settings,
                                 team if name in DISTRIBUTED else None, legacy)
            entry = {"name": name, "key": key, "input": artifact_in.to_json(out), "output": artifact.to_json(out),
                     "seconds": round(time.time() - started, 2), "metrics": artifact.metrics,
                     "files": {str(p.relative_to(out)): assets.sha256_file(p)
                               for p in sorted(stage_dir.rglob("*")) if p.is_file()}, "reused": False}
        manifest["stages"].append(entry)
        if entry["files"] and Path(artifact.path).is_relative_to(stage_dir):  # a new model: its files key the next
            input_print = hashlib.sha256(json.dumps(entry["files"], sort_keys=True).encode()).hexdigest()
        else:  # a stage that only measures: what it measured travels on, so new numbers re-run the stages after it
            input_print = hashlib.sha256(json.dumps([input_print, artifact.to_json(out)], sort_keys=True,
                                                    default=str).encode()).hexdigest()
        if name == "finetune":
            ctx.teacher, teacher_print = artifact, input_print
        manifest["unchecked_stages"] = earlier[i:]
        write_json(out / "manifest.json", manifest)  # at once: a stop before it retrains the stage
        if shared:  # a stage reused from this folder too, when a stop came while it was published
            to_shared(shared, entry, stage_dir)
    for final in (artifact, *artifact.outputs.values()):  # the files as they are now, to the byte (a reused stage
        final.metrics["size_mb"] = weights_mb(final.path)  # may have counted them otherwise); the last stage's
        # record is this dict too: its row in the summary shows the size
    manifest["final"] = artifact.to_json(out)
    manifest["budgets"] = check_budgets(recipe["budgets"], artifact.metrics)
    if artifact.outputs:  # every deployable artifact meets the budgets, not just the first
        manifest["budgets"] = [dict(row, artifact=name) for name, a in artifact.outputs.items()
                               for row in check_budgets(recipe["budgets"], a.metrics)]
    manifest["status"] = "complete" if all(b["ok"] for b in manifest["budgets"]) else "over_budget"
    files, before = gate.recorded_files(manifest), gate.recorded_files(previous)
    same_data = (previous.get("data") or {}).get("fingerprint") == manifest["data"]["fingerprint"]  # their accuracy
    kept = {name: d for name, d in (previous.get("devices") or {}).items()  # `edgekit bench` results of the same file
            if same_data and d.get("model") in files and files[d["model"]] == before.get(d["model"])}
    if kept:
        manifest["devices"] = kept
    for old in sorted(p for p in out.glob("[0-9][0-9]-*") if p.is_dir()):  # an earlier recipe's stages (run() has
        if old.name.removesuffix(".partial") not in ours and old.name.removesuffix(".partial")[3:] in stages.NAMES:
            shutil.rmtree(old)  # refused to start beside a stage-named folder no run made)
            log(f"removed {old.name}: a stage of an earlier recipe run into this folder", progress)
    manifest.pop("earlier_stages", None)
    manifest.pop("unchecked_stages", None)
    write_json(out / "manifest.json", manifest)
    return manifest


def run_stage(name: str, artifact: Artifact, stage_dir: Path, key: str, ctx: Context, settings: dict,
              team: Team = None, legacy: str = "") -> Artifact:
    """Run one stage in `NN-name.partial`, renamed to `NN-name` only when it finished; with `team` (torchrun)
    the other ranks run it too. `legacy`: the same stage's key as edgekit made it before (stage_key)."""
    partial = stage_dir.with_name(stage_dir.name + ".partial")
    if partial.exists() and (partial / ".key").is_file() and (partial / ".key").read_text() in (key, legacy or key):
        (partial / ".key").write_text(key)  # same stage, same inputs: a stopped run resumes from its checkpoint here
    else:
        if (partial / "checkpoint").is_dir():  # a stopped run's training, which this run cannot continue: say so
            print(f"edgekit: warning: {name}: the checkpoint in {partial.name} was made with other settings or inputs, "
                  f"or by an older edgekit; the stage starts over", file=sys.stderr, flush=True)
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(parents=True)
        (partial / ".key").write_text(key)
    import torch

    from edgekit import training

    together = team.run(name, partial, artifact, ctx.teacher, settings) if team else False
    training.ALONE = not together  # under torchrun, a stage rank 0 runs by itself trains single-process
    torch.manual_seed(ctx.seed)  # new heads and dropout start the same on every run and every resume
    try:
        result = stages.entry(name)(artifact, partial, ctx, **settings)
        if together:
            torch.distributed.barrier()  # every rank is done with the folder
            team.busy = False
    except (OSError, RuntimeError) as e:
        free_mb = shutil.disk_usage(partial).free / 1e6
        if free_mb < LOW_DISK_MB:  # torch and safetensors report a full disk as a bare RuntimeError
            raise EdgekitError(f"{name} could not write to {partial}: the disk is full ({free_mb:.1f} MB free); "
                               f"free space or choose another --out, then run the same command again") from e
        raise
    finally:
        training.ALONE = False
    shutil.rmtree(partial / "checkpoint", ignore_errors=True)  # the finished model is saved; optimizer state is not needed
    for left in sorted(partial.rglob("*.tmp")):  # a stopped writer's (the resume took another path) is not kept in
        remove(left)  # the stage
    (partial / ".key").unlink()
    if stage_dir.exists():
        shutil.rmtree(stage_dir)
    os.replace(partial, stage_dir)
    return result.moved(partial, stage_dir)


def read_manifest(path: Path) -> dict:
    if not path.is_file():
        return {}
    from edgekit import schemas

    try:
        manifest = json.loads(path.read_text())
        schemas.validate(manifest, schemas.MANIFEST, str(path))
    except (json.JSONDecodeError, UnicodeDecodeError, EdgekitError) as e:
        reason = " ".join(str(e).split())
        reason = reason if len(reason) <= 200 else reason[:200].rsplit(" ", 1)[0] + " ..."  # not cut mid-word
        log(f"edgekit: warning: {path} is unreadable or invalid ({reason}); every stage runs again", True)
        return {}  # an untrusted manifest is never used to skip work
    return manifest


TRAINING = ("finetune", "distill", "prune")  # they learn from the training split alone
RESUME_ONLY = ("checkpoint_every",)  # how often a stage saves, not what it makes


FILE_SETTINGS = ("student", "augment_model", "init_from", "transfer")  # may name a model folder or a file here


def local_prints(settings: dict) -> dict:
    """The contents of the local folders and files a stage's settings name (a student, an augment_model, init_from
    weights, a transfer .txt), so that editing one re-runs the stage; asset names and hub ids key by name."""
    prints = {}
    for k in FILE_SETTINGS:
        spec = settings.get(k)
        if isinstance(spec, str) and spec not in ("", "teacher") and not assets.is_asset(spec) \
                and (path := Path(spec).expanduser()).exists():
            prints[k] = assets.fingerprint(path)
    return prints


def this_machine() -> dict:
    """What the bench stage's latency depends on beyond its inputs: a run folder copied to another machine (or a CI
    runner of another CPU) measures again instead of keeping the first machine's milliseconds."""
    from edgekit import devices

    try:
        cpu = devices.this_cpu()
    except EdgekitError:  # a wheel install without device_bench (whose reader names the CPU): the kernel's line
        cpu = {"cpu": next((line.split(":", 1)[1].strip() for line in _cpuinfo().splitlines()
                            if line.startswith("model name")), platform.processor())}
    return {**cpu, "cores": os.cpu_count(), "machine": platform.machine()}


def _cpuinfo() -> str:
    try:
        return Path("/proc/cpuinfo").read_text()
    except OSError:  # macOS, or a sandbox without /proc
        return ""


def canonical(value):
    """Numbers as one value each: 2 and 2.0 key alike (a recipe's `temperature: 2` against the default 2.0)."""
    if isinstance(value, dict):
        return {k: canonical(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [canonical(v) for v in value]
    return int(value) if isinstance(value, float) and value.is_integer() else value


def stage_key(name: str, settings: dict, input_print: str, teacher_print: str, splits: data.Splits, recipe: dict,
              legacy: bool = False) -> str:
    """What a stage's output depends on. A training stage keys on the training split only (plus the evaluation
    texts, which a transfer set leaves out) and not on its resume-only settings, so `data.max_eval` or
    `checkpoint_every` redo no training. `legacy`: the key runs made before 2026-12-06 stored (every split, every
    setting), still accepted so that those runs are not retrained once for nothing."""
    cut = recipe.get("thresholds", 0.5) if splits.multi_label else 0.5  # a multi-label model's (evaluate.cuts_for)
    tuned = cut == "f1"
    if legacy or name not in TRAINING:
        data_print = splits.fingerprint()
    else:
        data_print = splits.fingerprint(evaluation=bool(settings.get("transfer")) or tuned)  # thresholds f1: tuned
        # on the validation split (evaluate.tune_folder)
        settings = {k: v for k, v in settings.items() if k not in RESUME_ONLY}
    if not legacy:
        settings = canonical(settings)
    return hashlib.sha256(json.dumps([name, settings, input_print, teacher_print, data_print, recipe["seed"],
                                      recipe["max_length"], edgekit.__version__]
                                     + ([recipe["targets"]] if name in ("export", "quantize") else [])
                                     + ([local] if not legacy and (local := local_prints(settings)) else [])
                                     + ([this_machine()] if name == "bench" else [])
                                     + ([f"revision {rev}"] if (rev := stages.revision(name)) > 1 else [])
                                     + ([f"thresholds {cut}"] if cut != 0.5 and not legacy else []),
                                     sort_keys=True, default=str).encode()).hexdigest()


def reusable(entries: list, index: int, name: str, keys: tuple, out: Path):
    """The earlier run's entry at `index`, when it is this stage with one of these keys and its files are intact."""
    if index >= len(entries):
        return None
    entry = entries[index]
    if entry.get("name") != name or entry.get("key") not in keys:
        return None
    for rel, sha in entry.get("files", {}).items():
        path = out / rel
        if not path.is_file() or assets.sha256_file(path) != sha:
            return None
    return entry


def to_shared(shared: Path, entry: dict, stage_dir: Path) -> None:
    """Publish a finished stage under its key (hard links: no copy of the weights)."""
    target = shared / entry["key"]
    if target.exists():
        return
    tmp = shared / f".{entry['key']}.{os.getpid()}.tmp"
    try:
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.copytree(stage_dir, tmp / "stage", copy_function=os.link)
        rel = {k: v for k, v in entry.items() if k != "reused"}
        write_json(tmp / "entry.json", {"stage_dir": stage_dir.name, **rel})
        os.replace(tmp, target)
    except OSError:  # another run published the same stage first
        pass
    finally:  # and after a Ctrl-C
        shutil.rmtree(tmp, ignore_errors=True)


def from_shared(shared: Path, key: str, stage_dir: Path):
    """Take a finished stage with this key from the shared folder, if its files are intact."""
    source = shared / key
    try:
        entry = json.loads((source / "entry.json").read_text())
    except (OSError, ValueError):
        return None
    old_dir = entry.pop("stage_dir")
    files = {}
    for rel, sha in entry["files"].items():
        path = source / "stage" / Path(rel).relative_to(old_dir)
        if not path.is_file() or assets.sha256_file(path) != sha:
            return None
        files[str(Path(stage_dir.name) / Path(rel).relative_to(old_dir))] = sha
    with through_temp(stage_dir, stage_dir.with_name(stage_dir.name + f".{os.getpid()}.tmp")) as tmp:
        shutil.copytree(source / "stage", tmp, copy_function=os.link)

    entry["files"] = files
    root = stage_dir.parent
    entry["output"] = Artifact.from_json(entry["output"], root).moved(root / old_dir, stage_dir).to_json(root)
    return entry


def check_budgets(budgets: dict, metrics: dict) -> list:
    return [recipes.with_note(recipes.budget_row(metric, *recipes.parse_bound(bound), metrics.get(metric),
                                                 metrics.get(f"{metric}_interval")), metrics)
            for metric, bound in budgets.items()]


def check_inputs(recipe: dict):
    """What --dry-run can tell without fetching anything or training: a local data file reads as the run will read
    it; a local or cached teacher is whole, and the distill and prune settings fit its shape, and without a finetune
    stage its head and its labels fit the local data file's (a hub id is only tried by a real run). Returns the local
    data file's Splits (None for a named dataset)."""
    data.check_source(recipe["data"]["source"])
    splits = None
    if recipe["data"]["source"] not in data.DATASETS:  # named datasets are known good; a file may not be
        splits = data.load(seed=recipe["seed"], **recipe["data"])
    multi = splits is not None and splits.multi_label  # a named dataset: one label each
    check_budget_kind(recipe["budgets"], multi, recipe.get("devices"))
    check_local_files(recipe)
    if teacher := on_disk(recipe["teacher"]):
        from transformers import AutoConfig

        config = AutoConfig.from_pretrained(teacher)  # read once for the shape and label checks
        check_shapes(recipe, config)
        if "finetune" not in recipe["stages"]:
            check_head(Path(teacher), config.architectures, recipe["teacher"])
            if splits is not None:  # as the run checks them, before its first stage
                check_labels(config, in_teacher_order(splits, families.label_names(config)).labels, recipe["teacher"],
                             splits.multi_label)
    return splits


def check_local_files(recipe: dict) -> None:
    """Before any stage (and with --dry-run): a distill student or augment_model given as a path is there and whole
    (a hub id is tried by its stage), init_from weights are there, and a transfer source is one (each was found
    only when its stage began, after the stages before it)."""
    settings = (recipe.get("distill") or {}) if "distill" in recipe["stages"] else {}
    for spec in (settings.get("student", "teacher"), settings.get("augment_model", "")):
        if spec and spec != "teacher" and not assets.is_asset(spec) and looks_local(spec):
            resolve_model(spec)
    if (init := settings.get("init_from")) and not Path(init).expanduser().exists():
        raise UsageError(f"distill.init_from {init}: no such file or folder; give a checkpoint folder, a model folder "
                         f"or a .safetensors file of an earlier run")
    for stage in ("distill", "prune"):
        if stage in recipe["stages"] and (source := (recipe.get(stage) or {}).get("transfer")):
            data.check_transfer(source)


def tell_data(splits, progress: bool, recipe: dict = None) -> None:
    """What was read (with progress) and what looks wrong in it, and settings that change nothing (always), on
    stderr."""
    log(data.describe(splits), progress)
    single = ["thresholds is set but does nothing: the data gives one label per text, and a single-label model takes "
              "its largest logit"] if recipe and not splits.multi_label and recipe.get("thresholds", 0.5) != 0.5 else []
    for warning in data.warnings(splits) + (recipes.ineffective(recipe) if recipe else []) + single:
        print(f"edgekit: warning: {warning}", file=sys.stderr, flush=True)


TELL_SAMPLE = 20_000  # training texts tell_length tokenizes at most


def tell_length(splits, source: Artifact, max_length: int, progress: bool) -> None:
    """How many training texts max_length cuts, by the teacher's tokenizer: a line with progress, a warning (always)
    when it is a tenth or more (long reviews at 128 tokens: the model never reads most of each)."""
    if source.kind != "hf":
        return
    tokenizer = families.load_tokenizer(source.path)
    step = -(-len(splits.train) // TELL_SAMPLE)  # every step-th text: on every run, reused or not, so a sample of a
    about = "about " if step > 1 else ""  # large set (tokenizing 240k texts took a minute before each run)
    encoded = data.encode(tokenizer, splits.train[::step], max_length, progress, "tokenize train")
    sep = tokenizer.sep_token_id
    if splits.pairs and sep is not None:  # a pair holds the template's separators; more: a text holds "[SEP]"
        template = tokenizer("a", "b")["input_ids"].count(sep)
        if held := sum(ids.count(sep) > template for ids, _ in encoded) * step:
            print(f"edgekit: warning: {about}{held} training pairs hold the separator's own text "
                  f"({tokenizer.sep_token}), which the tokenizer reads as a separator: the model sees more than two "
                  f"texts there; remove it from the texts unless it is meant as one", file=sys.stderr, flush=True)
    cut, sampled = data.cut_share(encoded, max_length)
    share, total = cut / sampled, len(splits.train)
    line = (f"{about}{min(cut * step, total)} of {total} training texts ({share:.0%}) reach max_length {max_length} "
            f"tokens and are cut there")
    if share >= 0.1:
        from transformers import AutoConfig

        most = min(512, families.max_tokens(AutoConfig.from_pretrained(source.path)))
        more = f"raise max_length (this model reads at most {most}) if their ends matter" if most > max_length \
            else f"this model reads at most {most} tokens"
        print(f"edgekit: warning: {line}; {more}", file=sys.stderr, flush=True)
    elif cut:
        log(f"data: {line}", progress)


def check_shapes(recipe: dict, config) -> None:
    """Settings that must fit the model each stage gets, as far as configs tell, before any stage runs (in
    --dry-run and in a real run): distill's layers, student_config and layer_map; prune's hidden_keep,
    heads_per_layer and embedding_rank. After a student checkpoint that is not on disk yet, its stage checks.
    `config`: the teacher's, which each caller has read already."""
    from transformers import AutoConfig

    from edgekit import distill_losses
    from edgekit.stages import distill, prune

    check_length(recipe["max_length"], config, f"the teacher {recipe['teacher']}")
    model = config  # the config of the model the next stage gets; None once unknown
    for name in recipe["stages"]:
        settings = recipe[name]
        if name == "distill":
            student = settings["student"]
            source = config if student == "teacher" else (path := on_disk(student)) and AutoConfig.from_pretrained(path)
            if source is None:
                model = None
                continue
            if student != "teacher":
                check_length(recipe["max_length"], source, f"student {student}")
            depth, shape = families.num_layers(source), settings["student_config"]
            layers = settings["layers"]
            if isinstance(layers, list) and not all(0 <= i < depth for i in layers):
                what = "the teacher" if student == "teacher" else f"student {student}"
                raise UsageError(f"distill.layers {layers}: {what} has {depth} layers (indices 0..{depth - 1})")
            try:  # what the distill stage would refuse, from the same functions
                keep = distill.student_layers(layers, depth, shape)
                model = families.student_config(source, shape or {}, keep)
                distill_losses.layer_map(settings["layer_map"], len(keep), families.num_layers(config))
            except EdgekitError as e:
                raise UsageError(str(e))
        if name == "prune" and model is not None:
            if settings["hidden_keep"] < 1 and model.model_type not in families.HIDDEN_FAMILIES:
                raise UsageError(f"prune.hidden_keep: hidden-width pruning supports {', '.join(families.HIDDEN_FAMILIES)}"
                                 f", not {model.model_type} (the model it prunes); leave hidden_keep at 1")
            width = getattr(model, "embedding_size", None) or families.hidden_width(model)  # ALBERT's is factorized
            heads = model.num_attention_heads
            if problem := (prune.heads_problem(settings["heads_per_layer"], heads, settings["scope"])
                           or prune.rank_problem(settings["embedding_rank"], width)):
                raise UsageError(problem)


def check_length(max_length: int, config, what: str) -> None:
    """max_length within the model's position table: past it, training fails with an index error mid-run."""
    if max_length > (most := families.max_tokens(config)):
        raise UsageError(f"max_length {max_length} is longer than {what} takes ({most} tokens); give max_length "
                         f"<= {most}")


def on_disk(spec: str):
    """The folder of a model already on disk (a local folder, checked whole, or a fetched asset); None for a hub id
    or an asset not fetched yet: nothing is fetched. A path that is not there is refused."""
    there = assets.cached_ok(spec) if assets.is_asset(spec) \
        else Path(spec).expanduser().exists() or looks_local(spec)  # a path that is not there: resolve_model says so
    return resolve_model(spec).path if there else None


def resolve(recipe: str, teacher: str = None, data: str = None, overrides: list = ()) -> dict:
    """The validated recipe, with --teacher and --data applied as the overrides they are."""
    if isinstance(overrides, str):  # list("a=1") would be three overrides of one character
        return recipes.load(recipe, overrides)  # which says so
    extra = list(overrides) + ([f"teacher={teacher}"] if teacher else []) + ([f"data.source={data}"] if data else [])
    return recipes.load(recipe, extra)


def context_of(run: Path, progress: bool = True) -> tuple:
    """(manifest, Context) of a finished run, for benchmarks over it: the same data and seed, the whole test
    split (max_eval dropped), the fine-tuned teacher (or the input model when the recipe had no finetune)."""
    from edgekit.gate import load_manifest

    manifest, run = load_manifest(Path(run))  # one line for a folder that is not a finished run
    recipe = manifest["recipe"]
    source = recipe["data"]["source"]
    if source not in data.DATASETS and not Path(source).expanduser().is_file():  # was: "dataset X not found", as if
        raise EdgekitError(f"the run's data file {source} is not there any more (the run was moved, or the file "  # typed
                           f"deleted): its test sentences are read from it; put the file back at that path")
    splits = data.load(seed=recipe["seed"], **{k: v for k, v in recipe["data"].items() if k != "max_eval"})
    splits = in_teacher_order(splits, manifest["data"].get("labels") or splits.labels)  # the order the run took
    teacher = next((Artifact.from_json(s["output"], run) for s in manifest["stages"] if s["name"] == "finetune"),
                   Artifact(Path(manifest["model"]["path"]), "hf"))
    return manifest, Context(splits, teacher, recipe["seed"], recipe["max_length"], progress,
                             thresholds=recipe.get("thresholds", 0.5))  # a run made before the setting: 0.5


def compress(recipe: str = "distilbert-int8", teacher: str = None, data: str = None, out=None,
             overrides: list = (), progress: bool = True):
    """Run a recipe; returns (final Artifact, manifest)."""
    resolved = resolve(recipe, teacher, data, overrides)
    out = Path(out) if out else Path("artifacts") / resolved["name"]
    manifest = run(resolved, out, progress)
    if manifest is None:  # a rank > 0 under torchrun: rank 0 holds the result
        return None, None
    return Artifact.from_json(manifest["final"], out.resolve()), manifest
