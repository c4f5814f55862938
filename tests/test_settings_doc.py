"""docs/settings.md against the code: a row for every setting, none for a setting the code lacks, and the defaults
and ranges the code has. Reads signatures and tables only: no model, no data."""
import inspect
import re
from pathlib import Path

import yaml

from edgekit import data, devices, recipe, stages, testing

DOC = Path(__file__).resolve().parent.parent / "docs" / "settings.md"
SKIP = ("artifact", "out_dir", "ctx")
REQUIRED = inspect.Parameter.empty
UNKNOWN = object()  # a default the code applies where it is used (devices: spec.get(key, default)): not compared


def tables(text: str) -> dict:
    """{section heading: {setting: {"default": cell, "allowed": cell}}} of every table under a '## ' heading."""
    return {heading: {key: {"default": cells[0], "allowed": cells[1]} for key, cells in rows.items()}
            for heading, rows in testing.doc_tables(text).items()}


def literal(cell: str):
    """The value a default cell gives in backticks (`5.0e-5`, `null`, `[x86]`), or REQUIRED when it gives none."""
    if not cell.startswith("`"):
        return REQUIRED
    value = yaml.safe_load(cell.split("`")[1])
    if isinstance(value, str):
        try:
            return float(value)  # 5e-05: text to YAML 1.1
        except ValueError:
            return None if value.lower() == "none" else value
    return value


def same(doc, code) -> bool:
    if isinstance(code, bool) or code is None or isinstance(doc, bool) or doc is None:
        return doc is code
    if isinstance(code, (int, float)):
        return isinstance(doc, (int, float)) and float(doc) == float(code)
    return doc == code


def problems(rows: dict, defaults: dict, limits: dict = None, every_default: bool = False) -> list:
    """What the rows get wrong about `defaults` ({setting: default, REQUIRED or UNKNOWN}) and `limits` (recipe.outside's).
    A default given in backticks must be the code's; one given in words only where the code's is None or none."""
    found = [f"{k}: no row" for k in defaults if k not in rows]
    found += [f"{k}: a row, but the code has no such setting" for k in rows if k not in defaults]
    for key, code in defaults.items():
        if key not in rows:
            continue
        doc = literal(rows[key]["default"])
        if code is not UNKNOWN and (doc is not REQUIRED or code is not None or every_default) and not same(doc, code):
            found.append(f"{key}: documented default {rows[key]['default']}, the code's {code!r}")
        limit = (limits or {}).get(key)
        words = limit if isinstance(limit, tuple) else [limit] if limit else []
        found += [f"{key}: allowed values do not say {w}" for w in words if w not in rows[key]["allowed"]]
    return found


def stage_defaults(name: str) -> dict:
    return {k: p.default for k, p in inspect.signature(stages.entry(name)).parameters.items() if k not in SKIP}


def stage_problems(doc: dict, name: str) -> list:
    return problems(doc.get(f"Stage: {name}", {}), stage_defaults(name), {**recipe.COMMON, **stages.limits(name)},
                    every_default=True)


DOC_TABLES = tables(DOC.read_text(encoding="utf-8"))


def test_every_stage_setting_has_a_row_with_its_default_and_range():
    assert [(name, p) for name in stages.NAMES for p in stage_problems(DOC_TABLES, name)] == []


def test_every_top_level_and_data_key_has_a_row_with_its_default():
    given = {"teacher": "minilm-l6", "data": "rt-polarity", "stages": ["evaluate"]}
    resolved = recipe.validate(dict(given))  # fills in the top-level defaults
    defaults = {k: resolved.get(k, REQUIRED) if k not in given and k not in stages.NAMES else None
                for k in recipe.TOP_KEYS}
    assert problems(DOC_TABLES["Top level"], defaults) == []
    params = {k: p.default for k, p in inspect.signature(data.load).parameters.items() if k in recipe.DATA_KEYS}
    assert problems(DOC_TABLES["data"], params, data.LIMITS, every_default=True) == []


def test_every_budget_metric_has_a_row():
    assert sorted(DOC_TABLES["budgets"]) == sorted(recipe.METRICS)


def test_every_device_target_key_has_a_row_with_its_defaults():
    assert problems(DOC_TABLES["Device targets: every kind"], dict.fromkeys(devices.COMMON, UNKNOWN),
                    devices.LIMITS) == []
    for kind in (k for k in devices.KINDS if devices.FIELDS[k]):  # manual has no keys of its own: no table
        assert problems(DOC_TABLES[f"Device targets: {kind}"], dict.fromkeys(devices.FIELDS[kind], UNKNOWN),
                        devices.LIMITS) == [], kind
    device_rows = {}  # a key's rows in every device table
    for heading, rows in DOC_TABLES.items():
        if heading.startswith("Device targets"):
            for key, row in rows.items():
                device_rows.setdefault(key, []).append(row["default"])
    source = inspect.getsource(devices)  # spec.get("runs", 50): the defaults the harness applies
    for key, value in re.findall(r"""spec\.get\(["'](\w+)["'], ("[^"]*"|'[^']*'|\d+|\[\]|\{\})\)""", source):
        shown = [literal(f"`{s}`") for cell in device_rows.get(key, []) for s in cell.split("`")[1::2]]
        assert any(same(s, yaml.safe_load(value)) for s in shown), (key, value, device_rows.get(key))


def test_every_device_bench_flag_has_a_row_with_its_default():
    flags = {(a.option_strings or ["MODEL"])[0]: REQUIRED if a.required else a.default
             for a in devices.runner_module().parser()._actions if a.dest != "help"}
    assert problems(DOC_TABLES["device_bench flags"], flags) == []


def test_the_checks_fail_on_a_new_setting_or_a_changed_default(monkeypatch):
    text = DOC.read_text(encoding="utf-8")
    changed = tables(text.replace("| `epochs` | `1.0` |", "| `epochs` | `3.0` |", 1))
    assert any("epochs: documented default" in p for p in stage_problems(changed, "finetune"))
    dropped = tables(text.replace("| `cache_teacher` |", "| `not_a_setting` |", 1))
    assert {"cache_teacher: no row", "not_a_setting: a row, but the code has no such setting"} <= \
        set(stage_problems(dropped, "distill"))

    original = stages.entry("evaluate")

    def run(artifact, out_dir, ctx, *, split: str = "validation", batch_size: int = 1, new_knob: int = 3):
        return original  # a stand-in: its signature is what is checked

    monkeypatch.setattr(stages, "entry", lambda name: run)
    assert set(stage_problems(DOC_TABLES, "evaluate")) == {
        "new_knob: no row", "split: documented default `test`, the code's 'validation'"}


def test_defaults_are_compared_as_values():
    assert same(literal("`5.0e-5`"), 5e-05) and same(literal("`5e-05`"), 5e-05)
    assert same(literal("`null`"), None) and same(literal("`None`"), None) and not same(literal("`0`"), None)
    assert same(literal("`true`"), True) and not same(literal("`1`"), True)
    assert same(literal("`[x86]`"), ["x86"]) and same(literal('`""`'), "") and same(literal("`2`"), 2.0)
    assert literal("required") is REQUIRED
