"""YAML -> a validated recipe. Every error is collected before anything runs and each names what is
accepted. Stage settings are checked by binding them to the stage's own `run` signature (names and types) and
against what the values may be: COMMON below, then the stage module's own LIMITS (data.LIMITS for data)."""
import copy
import difflib
import inspect
import math
import re
import types
import typing
from pathlib import Path

import yaml

from edgekit import data, stages, targets
from edgekit.errors import EdgekitError, UsageError

RECIPES = Path(__file__).parent / "recipes"
TOP_KEYS = ("name", "description", "teacher", "data", "max_length", "seed", "thresholds", "targets", "stages",
            "budgets", "devices") + stages.NAMES  # devices: where `edgekit bench` runs a finished run (edgekit.devices)
DATA_KEYS = tuple(p for p in inspect.signature(data.load).parameters if p != "seed")
METRICS = ("params", "size_mb", "accuracy", "accuracy_retained", "class_recall_retained", "f1_micro",
           "f1_micro_retained", "label_f1_retained", "latency_ms_p50", "latency_ms_p90", "latency_ms_p99",
           "peak_rss_mb", "max_abs_diff", "label_agreement")
OPS = ("<=", ">=", "<", ">")
FRACTIONS = ("accuracy", "accuracy_retained", "class_recall_retained", "f1_micro", "f1_micro_retained",
             "label_f1_retained", "label_agreement")  # 0.97, never 97
MULTI_LABEL_METRICS = ("f1_micro", "f1_micro_retained", "label_f1_retained")  # what only a multi-label run measures
MEASURED_BY = {"accuracy": ("evaluate",), "accuracy_retained": ("evaluate",), "class_recall_retained": ("evaluate",),
               "f1_micro": ("evaluate",), "f1_micro_retained": ("evaluate",), "label_f1_retained": ("evaluate",),
               "latency_ms_p50": ("bench",),
               "latency_ms_p90": ("bench",), "latency_ms_p99": ("bench",), "peak_rss_mb": ("bench",),
               "max_abs_diff": ("export", "quantize"), "label_agreement": ("export", "quantize"),
               "params": ("finetune", "distill", "prune", "export", "quantize")}  # size_mb: every run's final files
DEVICE_METRICS = ("size_mb", "accuracy", "accuracy_retained", "f1_micro", "f1_micro_retained", "latency_ms_p50",
                  "latency_ms_p90", "latency_ms_p99", "peak_rss_mb")  # what device_bench measures on a device (a
# target's budgets; f1_micro and f1_micro_retained for a multi-label model only)
NEEDS_HF = ("finetune", "distill", "prune", "export")  # stages that read a transformers folder
# What a setting may be, by its name in any stage: an interval for a number (inf: no upper end), a tuple of words
COMMON = {"epochs": "(0, inf)", "lr": "(0, inf)", "batch_size": "[1, inf)", "warmup": "[0, 1)",
          "weight_decay": "[0, inf)", "checkpoint_every": "[0, inf)", "temperature": "(0, inf)",
          "check_sentences": "[1, inf)", "transfer_examples": "[1, inf)"}


def names() -> list:
    return sorted(p.stem for p in RECIPES.glob("*.yaml"))


def find(name: str) -> Path:
    path = Path(name)
    if path.suffix in (".yaml", ".yml"):
        if not path.is_file():
            shipped = f"; the shipped recipe is named {path.stem} (no .yaml)" if path.stem in names() else ""
            raise UsageError(f"recipe file {path} not found{shipped}")
        return path
    if (RECIPES / f"{name}.yaml").is_file():
        return RECIPES / f"{name}.yaml"
    raise UsageError(f"unknown recipe '{name}'; shipped recipes: {', '.join(names())}, or give a .yaml path")


def load(name: str, overrides: list = ()) -> dict:
    if isinstance(overrides, str):
        raise UsageError(f"overrides must be a list of key=value strings, such as ['{overrides}'], not one string")
    path = find(name)
    try:
        text = path.read_text(encoding="utf-8")
        refuse_repeated_keys(yaml.compose(text, Loader=yaml.SafeLoader))
        recipe = yaml.safe_load(text)
    except UnicodeDecodeError as e:
        raise UsageError(f"recipe {path} is not UTF-8 text (byte {e.start}); save it as UTF-8")
    except yaml.YAMLError as e:
        raise UsageError(f"recipe {path} is not valid YAML ({yaml_problem(e)})")
    if not isinstance(recipe, dict):
        raise UsageError(f"recipe {path} must be a mapping of keys to settings")
    recipe.setdefault("name", path.stem)
    for item in overrides:
        apply_override(recipe, item)
    return validate(recipe)


def refuse_repeated_keys(node, visited=None) -> None:
    """A key given twice in one mapping is an error (safe_load keeps the last one silently). Reads the parsed nodes
    only: nothing is constructed. `visited`: nodes seen, as an alias may point back into its own anchor."""
    visited = set() if visited is None else visited
    if id(node) in visited or not isinstance(node, (yaml.MappingNode, yaml.SequenceNode)):
        return
    visited.add(id(node))
    seen = set()
    for item in node.value:
        if isinstance(node, yaml.MappingNode):
            key, item = item
            if (key.tag, key.value) in seen:
                raise yaml.constructor.ConstructorError(None, None, f"key '{key.value}' appears twice", key.start_mark)
            seen.add((key.tag, key.value))
        refuse_repeated_keys(item, visited)


def yaml_problem(e: yaml.YAMLError) -> str:
    """What is wrong and where: 'key 'seed' appears twice at line 4, column 1'."""
    mark = getattr(e, "problem_mark", None)
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
    return f"{getattr(e, 'problem', None) or str(e).splitlines()[0]}{where}"


def apply_override(recipe: dict, item: str) -> None:
    key, sep, raw = item.partition("=")
    if not sep or not key:
        raise UsageError(f"override '{item}' must look like key=value, for example distill.epochs=1")
    try:
        value = yaml.safe_load(raw) if raw else ""
    except yaml.YAMLError:
        value = raw
    parts = key.split(".")
    if parts[0] not in TOP_KEYS:
        raise UsageError(f"override '{key}': unknown key '{parts[0]}'{meant(parts[0], TOP_KEYS)}; accepted: "
                         f"{', '.join(TOP_KEYS)}")
    if parts == ["data"]:
        parts = ["data", "source"]  # data=FILE is short for data.source=FILE
    if parts[0] == "data" and isinstance(recipe.get("data"), str):  # `data: FILE` in the recipe, the same short form
        recipe["data"] = {"source": recipe["data"]}
    node = recipe
    for part in parts[:-1]:
        if not isinstance(node.get(part), dict):
            node[part] = {}
        node = node[part]
    node[parts[-1]] = value


def meant(key, accepted) -> str:
    """' (did you mean temperature?)' for a misspelt key, '' when none is close."""
    close = difflib.get_close_matches(str(key), list(accepted), n=1)
    return f" (did you mean {close[0]}?)" if close else ""


def validate(recipe: dict) -> dict:
    errors = []
    unknown = [k for k in recipe if k not in TOP_KEYS]
    if unknown:
        errors.append(f"unknown key {', '.join(f'{k}{meant(k, TOP_KEYS)}' for k in unknown)}; accepted: "
                      f"{', '.join(TOP_KEYS)}")
    if not isinstance(recipe.get("teacher"), str) or not recipe["teacher"]:
        errors.append("teacher must be a model: an asset name (minilm-l6, mpnet-base), a local folder or a hub id")
    recipe.setdefault("seed", 0)
    recipe.setdefault("max_length", 128)
    for key, lo, hi in (("seed", 0, 2**31), ("max_length", 8, 512)):
        if not _is(recipe[key], int) or not lo <= recipe[key] <= hi:
            errors.append(f"{key} must be an integer in [{lo}, {hi}], got {recipe[key]!r}")
    cut = recipe.setdefault("thresholds", 0.5)  # a multi-label model's decision per label (evaluate.cuts_for)
    if cut != "f1" and not (_is(cut, float) and 0 < cut < 1):
        errors.append(f"thresholds must be a probability in (0, 1), one for every label of a multi-label model (0.5, "
                      f"the default), or f1 (each label's tuned on the validation split for its best F1), got {cut!r}")
    try:
        recipe["targets"] = targets.check(recipe.setdefault("targets", ["x86"]))
    except EdgekitError as e:
        errors.append(str(e))
    errors += _check_data(recipe)
    errors += (stage_errors := _check_stages(recipe))
    if not errors:
        errors += _check_together(recipe)
    bench = recipe.get("bench") if isinstance(recipe.get("stages"), list) and "bench" in recipe["stages"] else None
    seq_len = bench.get("seq_len") if isinstance(bench, dict) else None
    if _is(seq_len, int) and _is(recipe["max_length"], int) and seq_len > recipe["max_length"]:
        errors.append(f"bench.seq_len {seq_len} is longer than max_length {recipe['max_length']}, where the "
                      f"exported model cuts its input; lower bench.seq_len or raise max_length")
    errors += _check_budgets(recipe, stages_ok=not stage_errors)
    if not isinstance(recipe.setdefault("devices", {}) or {}, dict):
        errors.append("devices must map device names to settings (kind: local, ssh, adb or qemu-arm64)")
    else:
        from edgekit import devices  # it imports this module: not at the top

        errors += [e for name, spec in (recipe["devices"] or {}).items() for e in devices.check_target(str(name), spec)]
    if errors:
        raise UsageError("; ".join(errors))
    return recipe


# settings that do nothing unless another one is set: (stage, setting, the other's test, what to set)
NEEDS = (("distill", "augment_p", lambda s: s["augment"] > 0, "distill.augment > 0"),
         ("distill", "augment_k", lambda s: s["augment"] > 0, "distill.augment > 0"),
         *(("prune", k, lambda s: s["recover_epochs"] > 0, "prune.recover_epochs > 0")
           for k in ("lr", "temperature", "recover_from", "checkpoint_every")),
         ("prune", "importance_batches", lambda s: s["importance"] == "gradient", "prune.importance: gradient"),
         ("quantize", "calibration", lambda s: "static" in str(s["mode"]), "a quantize.mode of static"),
         ("quantize", "calibration_size", lambda s: "static" in str(s["mode"]), "a quantize.mode of static"),
         ("quantize", "fuse", lambda s: (s["mode"].get("onnx") if isinstance(s["mode"], dict) else s["mode"])
          in ("dynamic", "fp16"), "an ONNX quantize.mode of dynamic or fp16"))


def ineffective(recipe: dict) -> list:
    """Settings given that change nothing in this recipe (a stage ignores them without the setting they serve):
    said as warnings, since a recipe that sets them most likely meant something else."""
    out = []
    for stage, key, needed, what in NEEDS:
        if stage in recipe["stages"]:
            settings, default = recipe[stage], _defaults(stages.entry(stage)).get(key)
            if settings.get(key) != default and not needed(settings):
                out.append(f"{stage}.{key} is set but does nothing without {what}")
    if "export" in recipe["stages"] and recipe["export"].get("buckets") is not None and "tflite" not in \
            targets.formats_for(recipe["targets"], recipe["export"]["format"]):
        out.append("export.buckets is set but does nothing: no target exports TFLite, the only format with buckets")
    if (source := recipe["data"]["source"]) in data.DATASETS:  # their columns are fixed
        read = _defaults(data.load)
        out += [f"data.{key} is set but does nothing for the named dataset {source}, whose columns are fixed; it "
                f"applies to a local file" for key in ("text_column", "label_column", "split_column",
                                                        "label_separator", "label_columns")
                if recipe["data"].get(key, read[key]) != read[key]]
    return out


def _check_data(recipe: dict) -> list:
    spec = recipe.get("data")
    if isinstance(spec, str):
        spec = recipe["data"] = {"source": spec}
    if not isinstance(spec, dict) or "source" not in spec:
        return ["data must name a source: rt-polarity or a local .csv/.tsv/.jsonl file (data.source)"]
    return _bind("data", data.load, {k: v for k, v in spec.items()}, skip=("seed",), limits=data.LIMITS)


def _check_stages(recipe: dict) -> list:
    order = recipe.get("stages")
    if not isinstance(order, list) or not order or not all(isinstance(s, str) for s in order):
        return [f"stages must be a non-empty list of stage names from: {', '.join(stages.NAMES)}"]
    errors = [f"unknown stage '{s}'; stages: {', '.join(stages.NAMES)}" for s in order if s not in stages.NAMES]
    if errors:  # the rest would follow from the misspelling ("distill has settings but is not in stages")
        return errors
    if len(set(order)) != len(order):
        errors.append("each stage may appear once in stages")
    for name in stages.NAMES:
        if name not in recipe and name in order:
            recipe[name] = {}
        settings = recipe.get(name) or {}
        if not isinstance(settings, dict):
            errors.append(f"{name} settings must be a mapping, got {settings!r}")
            continue
        if settings and name not in order:
            errors.append(f"{name} has settings but is not in stages; add it to stages or drop its settings")
        if name in order:
            problems = _bind(name, stages.entry(name), settings, skip=("artifact", "out_dir", "ctx"),
                             limits=stages.limits(name))
            errors += problems
            if not problems:  # the resolved recipe shows every setting, defaults included
                recipe[name] = {**_defaults(stages.entry(name), skip=("artifact", "out_dir", "ctx")), **settings}
    kind = "hf"
    for name in order:
        if name in NEEDS_HF and kind != "hf":
            errors.append(f"{name} cannot follow export/quantize: it needs a transformers model; "
                          f"order: finetune, distill, prune, export, quantize, evaluate, bench")
        if name == "finetune" and order.index(name) != 0:
            errors.append("finetune must be the first stage (it makes the teacher)")
        if name == "quantize" and kind != "exported":
            errors.append("quantize needs an exported model; put export before quantize")
        if name == "export":
            kind = "exported"
    return errors


def _check_together(recipe: dict) -> list:
    """Settings each right alone and wrong together, which their stage would refuse only when it starts: a format
    no target runs, TFLite buckets beyond max_length, quantize modes a format does not offer, intermediate-loss
    epochs without an intermediate loss."""
    from edgekit.stages import distill, export, quantize

    order = recipe["stages"]
    errors = []
    if "distill" in order:
        d = recipe["distill"]
        errors += [p for p in (distill.loss_problem(d["intermediate_epochs"], {k: d[k] for k in distill.INTERMEDIATE}),
                               distill.student_problem(d["student"], d["student_config"]),
                               distill.augment_problem(d["augment"], d["augment_model"])) if p]
    if problem := data.pair_problem(recipe["data"]["source"], recipe["data"].get("text_pair_column", "")):
        errors.append(problem)
    if recipe["data"].get("text_pair_column"):  # transfer texts are single texts
        errors += [f"{stage}.transfer adds single texts, and data.text_pair_column makes each example a text pair; "
                   f"leave {stage}.transfer out" for stage in ("distill", "prune")
                   if stage in order and recipe[stage]["transfer"]]
    if "export" not in order:
        return errors
    try:
        formats = targets.formats_for(recipe["targets"], recipe["export"]["format"])
    except EdgekitError as e:
        return errors + [str(e)]
    buckets = recipe["export"]["buckets"]
    if "tflite" in formats and buckets is not None and (problem := export.bucket_problem(buckets, recipe["max_length"])):
        errors.append(problem)
    if "quantize" in order:
        mode = recipe["quantize"]["mode"]
        errors += quantize.mode_problems(mode if isinstance(mode, dict) else {f: mode for f in formats}, formats,
                                         recipe["quantize"]["weights"])
    return errors


def _check_budgets(recipe: dict, stages_ok: bool = True) -> list:
    budgets = recipe.setdefault("budgets", {}) or {}
    if not isinstance(budgets, dict):
        return ["budgets must map a metric to a bound such as '<= 100'"]
    budgets = recipe["budgets"] = {k: v for k, v in budgets.items() if v is not None}  # budgets.X=null drops one
    errors = []
    for metric, bound in budgets.items():
        if metric not in METRICS:
            errors.append(f"budget on unknown metric '{metric}'; metrics: {', '.join(METRICS)}")
        elif parse_bound(bound) is None:
            errors.append(f"budget {metric}: {bound!r} must be an operator and a number, for example '<= 100' "
                          f"(operators: {', '.join(OPS)})")
        elif problem := bound_problem(metric, parse_bound(bound)[1]):
            errors.append(problem)
        elif stages_ok and not set(MEASURED_BY.get(metric, recipe["stages"])) & set(recipe["stages"]):
            errors.append(f"budget {metric}: no stage of this recipe measures it; add {' or '.join(MEASURED_BY[metric])}"
                          f" to stages, or drop the budget (budgets.{metric}=null)")
    return errors


def parse_bound(bound):
    text = str(bound).strip()
    for op in OPS:
        if text.startswith(op) and not text.startswith(op + "="):
            try:
                return op, float(text[len(op):])
            except ValueError:
                return None
    return None


def measure(value) -> bool:
    """Whether `value` is what every metric is: a finite number >= 0 (not a bool, not text)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value >= 0


def bound_problem(metric: str, bound: float) -> str:
    """'' for a bound a metric can meet; every metric is a number >= 0, accuracies are fractions."""
    if not measure(bound):
        return f"budget {metric} {bound:g}: give a finite number >= 0"
    if metric in FRACTIONS and bound > 1.5:
        return f"budget {metric} {bound:g} is not a fraction: 0.97 means 97%; give for example {metric} >= 0.97"
    return ""


def budget_row(metric: str, op: str, bound: float, actual, interval=None) -> dict:
    """One budget checked: an unmeasured metric (None) never holds. `interval`: the metric's 95% interval where one
    was measured (the evaluate stage's, for accuracy_retained), carried on the row for the reports."""
    ok = actual is not None and {"<=": actual <= bound, ">=": actual >= bound, "<": actual < bound,
                                 ">": actual > bound}[op]
    row = {"metric": metric, "op": op, "target": bound, "actual": actual, "ok": bool(ok)}
    return dict(row, interval=interval) if interval else row


def with_note(row: dict, metrics: dict) -> dict:
    """The row, with a note where its number says less than it seems: the lowest class's share of its teacher's
    recall (or label's share of its F1) measured on only some of the classes (the teacher gets no example of the
    others right)."""
    measured, of = metrics.get("class_recall_measured") or (0, 0)  # the classes (labels) the teacher gets right:
    if row["metric"] in ("class_recall_retained", "label_f1_retained") and measured < of:  # those with F1 too
        what = "labels" if row["metric"] == "label_f1_retained" else "classes"
        return dict(row, note=f"{measured} of {of} {what} measured: the teacher gets none of the others right")
    return row


FLOAT_TEXT = re.compile(r"[-+]?[0-9][0-9_]*[eE][-+]?[0-9]+")


def _bind(section: str, fn, settings: dict, skip=(), limits=None) -> list:
    params = {n: p for n, p in inspect.signature(fn).parameters.items() if n not in skip}
    limits = {**COMMON, **(limits or {})}
    errors = []
    for key, value in settings.items():
        if key not in params:
            errors.append(f"{section}: unknown key '{key}'{meant(key, params)}; accepted: {', '.join(params)}")
            continue
        want = typing.get_type_hints(fn).get(key)
        if isinstance(value, str) and FLOAT_TEXT.fullmatch(value) and want and _is(1.0, want) and not _is("", want):
            value = settings[key] = float(value)  # 1e-4: PyYAML (YAML 1.1) reads it as text, YAML 1.2 as a float
        if want is not None and not _is(value, want):
            errors.append(f"{section}.{key} must be {_type_name(want)}, got {value!r}")
        elif allowed := outside(value, limits.get(key)):
            errors.append(f"{section}.{key} must be {allowed}, got {value!r}")
    missing = [n for n, p in params.items() if p.default is inspect.Parameter.empty and n not in settings]
    errors += [f"{section}: missing key '{n}'" for n in missing]
    return errors


def outside(value, limit) -> str:
    """'' when `value` is allowed, else what is: `limit` is an interval such as '(0, 1]' or '[1, inf)' for a number,
    or a tuple of words (for a word, or each value of a mapping: quantize.mode per format). Lists and None pass."""
    if limit is None or value is None or isinstance(value, (bool, list)):
        return ""
    if isinstance(limit, tuple):
        words = value.values() if isinstance(value, dict) else [value]
        return "" if all(w in limit for w in words if isinstance(w, str)) else f"one of {', '.join(limit)}"
    if isinstance(value, dict | str):
        return ""
    lo, hi = (float(x) for x in limit[1:-1].split(","))
    if (lo <= value if limit[0] == "[" else lo < value) and (value <= hi if limit[-1] == "]" else value < hi):
        return ""
    if hi == float("inf"):
        return f"{'a finite number ' if math.isinf(value) else ''}{'>=' if limit[0] == '[' else '>'} {lo:g}"
    return f"in {limit}"


def _defaults(fn, skip=()) -> dict:
    return {n: copy.deepcopy(p.default) for n, p in inspect.signature(fn).parameters.items()
            if n not in skip and p.default is not inspect.Parameter.empty}


def _is(value, want) -> bool:
    if isinstance(want, types.UnionType) or typing.get_origin(want) is typing.Union:
        return any(_is(value, w) for w in typing.get_args(want))
    want = typing.get_origin(want) or want
    if want is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if want is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, want)


def _type_name(want) -> str:
    if isinstance(want, types.UnionType):
        return " or ".join(_type_name(w) for w in typing.get_args(want))
    return getattr(typing.get_origin(want) or want, "__name__", str(want))


def dump(recipe: dict) -> str:
    shown = {k: v for k, v in recipe.items() if k not in stages.NAMES or k in recipe["stages"]}
    return yaml.safe_dump(shown, sort_keys=False)
