import fcntl
import functools
import importlib
import json
import shutil

import pytest

import edgekit
from edgekit import cli, data, devices, gate, pipeline, recipe, stages, testing
from edgekit.errors import EdgekitError


def run(tiny_recipe, out, *overrides):
    return pipeline.run(recipe.load(str(tiny_recipe), list(overrides)), out, progress=False)


def test_tiny_recipe_runs_every_stage_and_writes_the_manifest(tiny_recipe, tmp_path):
    out = tmp_path / "run"
    m = run(tiny_recipe, out)
    assert [s["name"] for s in m["stages"]] == ["finetune", "distill", "export", "quantize", "evaluate", "bench"]
    assert m["status"] == "complete" and m["edgekit_version"] == edgekit.__version__
    on_disk = json.loads((out / "manifest.json").read_text())
    assert on_disk["final"] == m["final"] and on_disk["recipe"]["name"] == "tiny"
    final = m["final"]["metrics"]
    for key in ("params", "size_mb", "accuracy", "accuracy_retained", "latency_ms_p50", "latency_ms_p90"):
        assert isinstance(final[key], (int, float)), key
    assert m["final"]["path"] == "04-quantize/model.onnx" and m["final"]["kind"] == "onnx"
    assert final["params"] < m["stages"][0]["metrics"]["params"]  # the student is smaller than the teacher
    assert m["stages"][3]["metrics"]["size_mb"] < m["stages"][2]["metrics"]["size_mb"] * 0.8  # INT8 (scales dominate a tiny model)
    assert m["budgets"] == [{"metric": "size_mb", "op": "<=", "target": 100.0, "actual": final["size_mb"], "ok": True}]
    for stage in m["stages"]:
        assert stage["files"] and all((out / rel).is_file() for rel in stage["files"])
    assert not list(out.glob("*.partial")) and not list(out.rglob("checkpoint"))
    meta = json.loads((out / "04-quantize" / "model.json").read_text())
    assert meta["labels"] == ["neg", "pos"] and meta["quantization"]["weights"] == "int8"
    isa = devices.runner_module().int8_isa()
    assert final["bench_int8_isa"] == isa and final["bench_cpu"]  # which CPU the latency belongs to
    assert f"latency measured on {final['bench_cpu']} ({isa or 'INT8 instructions unknown'}), 1 thread," in \
        cli.summary(m)
    low, high = final["accuracy_retained_interval"]  # the split's own noise around the share kept
    assert low <= final["accuracy_retained"] <= high
    assert f"retained {final['accuracy_retained']:.4f} (95% interval {low:.4f}-{high:.4f})" in cli.summary(m)
    assert gate.interval_note([low, high], 2.0).endswith(", bound outside)")
    row, = pipeline.check_budgets({"accuracy_retained": ">= 2"}, final)  # the budget row carries the interval
    assert row["interval"] == [low, high] and not row["ok"]
    assert gate.interval_note(final.get("size_mb_interval"), 100.0) == ""  # only the evaluate stage measures one


def test_bench_runs_without_device_bench_installed(tiny_recipe, tmp_path, monkeypatch):
    def missing():
        raise EdgekitError("device_bench is not found beside edgekit nor installed")

    monkeypatch.setattr(devices, "runner_source", missing)  # as in a wheel install of edgekit alone
    final = run(tiny_recipe, tmp_path / "run")["final"]["metrics"]
    assert final["latency_ms_p50"] > 0 and "bench_cpu" not in final
    assert pipeline.this_machine()["cores"] >= 1  # the bench stage's key names the machine without it too


def test_rerun_reuses_unchanged_stages_and_reruns_changed_ones(tiny_recipe, tmp_path):
    out = tmp_path / "run"
    first = run(tiny_recipe, out)
    benched = {"kind": "ssh", "complete": True, "model": first["final"]["path"], "metrics": {"latency_ms_p90": 9.0}}
    first["devices"] = {"pi": benched, "elsewhere": dict(benched, model="/tmp/other.onnx")}  # as edgekit bench adds
    (out / "manifest.json").write_text(json.dumps(first))
    again = run(tiny_recipe, out)
    assert all(s["reused"] for s in again["stages"])
    assert again["final"] == first["final"]
    assert again["devices"] == {"pi": benched}  # the same model file: its device results stay (they were dropped)
    changed = run(tiny_recipe, out, "distill.epochs=1")
    assert [s["reused"] for s in changed["stages"]] == [True, False, False, False, False, False]
    assert "devices" not in changed  # another model: the old device numbers are not its
    (out / "manifest.json").write_text(json.dumps(dict(changed, devices={"pi": dict(benched, model=changed["final"]
                                                                                     ["path"])})))
    fewer = run(tiny_recipe, out, "distill.epochs=1", "data.max_eval=10")
    assert fewer["final"]["path"] == changed["final"]["path"] and "devices" not in fewer  # its accuracy: other text


def test_a_moved_run_quantizes_torchscript_again_and_its_sidecars_name_no_build_path(tiny_recipe, tmp_path):
    import shutil

    first = run(tiny_recipe, tmp_path / "run", "export.format=torchscript")
    meta = json.loads((tmp_path / "run" / first["final"]["path"]).with_name("model.json").read_text())
    assert meta["source"] == "../02-distill/model"  # the distilled student, inside the run folder
    shutil.move(tmp_path / "run", tmp_path / "moved")  # the old path is gone
    again = run(tiny_recipe, tmp_path / "moved", "export.format=torchscript", "quantize.max_accuracy_drop=0.5")
    assert [s["reused"] for s in again["stages"]] == [True, True, True, False, False, False]
    assert again["status"] == "complete" and again["final"]["path"].endswith("model.pt")
    both = run(tiny_recipe, tmp_path / "two", "targets=[x86,x86-avx2]")  # one export folder, a quantize folder each
    for name, out in both["final"]["outputs"].items():  # was ../02-distill/model: a folder one level too shallow
        sidecar = (tmp_path / "two" / out["path"]).with_name("model.json")
        assert (sidecar.parent / json.loads(sidecar.read_text())["source"] / "config.json").is_file(), name


def test_evaluation_only_and_resume_only_changes_redo_no_training(tiny_recipe, tmp_path, monkeypatch):
    out, key = tmp_path / "run", pipeline.stage_key
    monkeypatch.setattr(pipeline, "stage_key", lambda *a, legacy=False: key(*a, legacy=True))
    run(tiny_recipe, out)  # the keys edgekit stored before 2026-12-06
    monkeypatch.setattr(pipeline, "stage_key", key)
    assert all(s["reused"] for s in run(tiny_recipe, out)["stages"])  # such a run is not retrained for nothing
    again = run(tiny_recipe, out, "distill.checkpoint_every=7", "finetune.checkpoint_every=3")
    assert all(s["reused"] for s in again["stages"])  # how often a stage saves is not what it makes
    fewer = run(tiny_recipe, out, "data.max_eval=10")  # was: every stage again, fine-tuning first
    assert [s["reused"] for s in fewer["stages"]] == [True, True, False, False, False, False]
    assert fewer["data"]["sizes"]["test"] == 10 and fewer["final"]["metrics"]["accuracy"] is not None
    assert [s["reused"] for s in run(tiny_recipe, out, "data.max_train=100")["stages"]][:2] == [False, False]


def test_a_different_recipe_into_the_same_folder_removes_the_earlier_recipes_stages(model_dir, csv_file, tmp_path):
    from edgekit import testing

    path, out = tmp_path / "r.yaml", tmp_path / "run"
    path.write_text(testing.tiny_recipe(model_dir, csv_file, stages=("export", "quantize", "evaluate")))
    pipeline.run(recipe.load(str(path)), out, progress=False)
    (out / "05-prune.partial").mkdir()  # a stopped stage of yet another recipe (its .key says a run made it)
    (out / "05-prune.partial" / ".key").write_text("k")
    (out / "07-notes").mkdir()  # not a stage's name: the user's, kept
    path.write_text(testing.tiny_recipe(model_dir, csv_file, stages=("export", "evaluate")))
    second, real = recipe.load(str(path)), pipeline.stages.entry

    def stopped(name):  # the new recipe stopped in its second stage: the old stages stay listed until it finishes
        if name == "evaluate":
            raise KeyboardInterrupt
        return real(name)
    pipeline.stages.entry = stopped
    try:
        with pytest.raises(KeyboardInterrupt):
            pipeline.run(second, out, progress=False)
    finally:
        pipeline.stages.entry = real
    assert json.loads((out / "manifest.json").read_text())["earlier_stages"] == ["02-evaluate", "02-quantize",
                                                                              "03-evaluate"]  # and the one being made
    m = pipeline.run(recipe.load(str(path)), out, progress=False)
    assert [s["reused"] for s in m["stages"]] == [True, False] and "earlier_stages" not in m
    assert sorted(p.name for p in out.iterdir() if p.is_dir()) == ["01-export", "02-evaluate", "07-notes"]


def test_a_run_never_replaces_or_removes_a_stage_named_folder_it_did_not_make(model_dir, csv_file, tmp_path):
    """Was: a user's 07-prune/ or 01-finetune/ in --out deleted without a word; a symlink named like a stage ended a
    finished run in 'Cannot call rmtree on a symbolic link'."""
    from edgekit import testing
    from edgekit.errors import UsageError

    path, out = tmp_path / "r.yaml", tmp_path / "run"
    path.write_text(testing.tiny_recipe(model_dir, csv_file, stages=("export", "evaluate")))
    for name, make in (("07-prune", lambda p: p.mkdir()), ("01-export", lambda p: p.mkdir()),
                       ("10-bench.partial", lambda p: p.mkdir()), ("03-quantize", lambda p: p.symlink_to(tmp_path))):
        out.mkdir(exist_ok=True)
        make(out / name)
        if not (out / name).is_symlink():
            (out / name / "notes.txt").write_text("mine")
        with pytest.raises(UsageError, match=f"holds {name}, named like a stage but not made by an edgekit run here"):
            pipeline.run(recipe.load(str(path)), out, progress=False)
        assert (out / name).is_symlink() or (out / name / "notes.txt").read_text() == "mine"
        assert sorted(p.name for p in out.iterdir()) == [name]  # no manifest, no .lock left in the user's folder
        (out / name).unlink() if (out / name).is_symlink() else shutil.rmtree(out / name)
    (out / "01-export").mkdir()
    (out / "manifest.json").write_text("{bad")  # said as such: it was "no manifest.json lists it"
    with pytest.raises(UsageError, match="holds 01-export, named like a stage but its manifest.json cannot be read"):
        pipeline.run(recipe.load(str(path)), out, progress=False)
    (out / "manifest.json").write_text('{"schema": 1, "stages": []}')  # readable, and lists none of them
    with pytest.raises(UsageError, match="holds 01-export, named like a stage but not made by an edgekit run here"):
        pipeline.run(recipe.load(str(path)), out, progress=False)


@pytest.mark.parametrize("name", stages.NAMES)
def test_a_stage_revision_is_the_last_change_its_comment_lists(name):
    """A fix listed as `# 3: ...` beside REVISION = 2 (quantize, until stop 52) left runs reusing what the old code
    wrote: the number is what decides, the list says why."""
    import inspect
    import re

    source = inspect.getsource(importlib.import_module(f"edgekit.stages.{name}"))
    found = re.search(r"^REVISION = (\d+)(.*?)\n\n", source, re.S | re.M)
    listed = [int(n) for n in re.findall(r"(?:#|;)\s*(\d+): ", found.group(2))] if found else []
    assert listed == list(range(2, stages.revision(name) + 1))


def test_the_budgets_check_the_final_files_sizes_not_a_reused_stages_record(model_dir, csv_file, tmp_path):
    """An export stage made before sizes were counted to the byte recorded 6.0 for 6,000,499 bytes; reused, it passed
    `size_mb <= 6` in compress while `edgekit gate` failed the same file."""
    from edgekit import artifact

    out, path = tmp_path / "run", tmp_path / "r.yaml"
    path.write_text(testing.tiny_recipe(model_dir, csv_file, stages=("export",)))
    run(path, out, "budgets.size_mb=<= 0.001")
    manifest = json.loads((out / "manifest.json").read_text())
    for record in (manifest["stages"][0]["metrics"], manifest["stages"][0]["output"]["metrics"]):
        record["size_mb"] = 0.0  # as an older edgekit counted it; a reuse carries the stage's record
    (out / "manifest.json").write_text(json.dumps(manifest))
    second = run(path, out, "budgets.size_mb=<= 0.001")
    assert [s["reused"] for s in second["stages"]] == [True]
    size = artifact.weights_mb(out / second["final"]["path"])
    assert second["final"]["metrics"]["size_mb"] == size > 0.001
    assert second["status"] == "over_budget" and second["budgets"][0]["actual"] == size


def test_a_rerun_stopped_while_it_checks_what_to_reuse_leaves_the_next_one_all_of_it(tiny_recipe, tmp_path,
                                                                                     monkeypatch):
    """The rerun wrote a manifest listing no stage before hashing the first one's files (seconds with real
    weights): stopped there, the next run trained every stage again."""
    from edgekit import assets

    out = tmp_path / "run"
    run(tiny_recipe, out)
    real, calls = assets.sha256_file, []

    def stops_in_the_third_stage(path):
        calls.append(path)
        if "03-export" in str(path):
            raise KeyboardInterrupt
        return real(path)
    monkeypatch.setattr(assets, "sha256_file", stops_in_the_third_stage)
    with pytest.raises(KeyboardInterrupt):
        run(tiny_recipe, out)
    monkeypatch.undo()
    stopped = json.loads((out / "manifest.json").read_text())
    assert len(stopped["stages"]) == 2 and len(stopped["unchecked_stages"]) == 4
    m = run(tiny_recipe, out)
    assert all(s["reused"] for s in m["stages"]) and "unchecked_stages" not in m


def test_a_stopped_writers_temp_files_never_enter_a_finished_stage(model_dir, csv_file, tmp_path, monkeypatch):
    """quantize's prepared.onnx.tmp (a whole FP32 copy) stayed in the .partial folder after a stop; when the resume
    took another path, the rename sealed it into the stage and the manifest recorded it."""
    import functools

    from edgekit.stages import export

    real = export.run

    @functools.wraps(real)
    def leaves_temp_files(artifact, out_dir, ctx, **settings):
        (out_dir / "prepared.onnx.tmp").write_bytes(b"half")
        (out_dir / "sub.tmp").mkdir(exist_ok=True)
        (out_dir / "sub.tmp" / "x").write_bytes(b"half")
        return real(artifact, out_dir, ctx, **settings)
    monkeypatch.setattr(export, "run", leaves_temp_files)
    path = tmp_path / "r.yaml"
    path.write_text(testing.tiny_recipe(model_dir, csv_file, stages=("export",)))
    m = run(path, tmp_path / "run")
    assert not list((tmp_path / "run").rglob("*.tmp")) and not [f for f in m["stages"][0]["files"] if ".tmp" in f]
    assert list((tmp_path / "run").iterdir()) and (tmp_path / "run" / m["final"]["path"]).is_file()


def test_a_stage_a_stop_kept_from_the_shared_folder_is_published_by_the_next_run(model_dir, csv_file, tmp_path,
                                                                                  monkeypatch):
    """Published after its manifest entry: a stop while it was linked into a sweep's shared folder, and the next
    run (reusing it from its own folder) never published it, so the other points trained it again."""
    path, out, shared = tmp_path / "r.yaml", tmp_path / "run", tmp_path / "shared"
    path.write_text(testing.tiny_recipe(model_dir, csv_file, stages=("finetune", "export")))
    real = pipeline.to_shared

    def stops(shared_dir, entry, stage_dir):
        raise KeyboardInterrupt
    monkeypatch.setattr(pipeline, "to_shared", stops)
    with pytest.raises(KeyboardInterrupt):
        pipeline.run(recipe.load(str(path)), out, progress=False, shared=shared)
    monkeypatch.setattr(pipeline, "to_shared", real)
    m = pipeline.run(recipe.load(str(path)), out, progress=False, shared=shared)
    assert m["stages"][0]["reused"] and (shared / m["stages"][0]["key"] / "entry.json").is_file()
    assert m["stages"][-1]["metrics"]["size_mb"] == m["final"]["metrics"]["size_mb"]  # the last stage's row too


def test_a_rerun_stopped_while_it_publishes_a_stage_leaves_the_next_one_all_of_it(tiny_recipe, tmp_path, monkeypatch):
    """The stage just listed under `stages` must leave `unchecked_stages`: listed twice, every stage after it was
    compared with its neighbour's entry and retrained."""
    out, shared = tmp_path / "run", tmp_path / "shared"
    first = pipeline.run(recipe.load(str(tiny_recipe)), out, progress=False, shared=shared)

    def stops(shared_dir, entry, stage_dir):
        raise KeyboardInterrupt
    monkeypatch.setattr(pipeline, "to_shared", stops)
    with pytest.raises(KeyboardInterrupt):
        pipeline.run(recipe.load(str(tiny_recipe)), out, progress=False, shared=shared)
    monkeypatch.undo()
    stopped = json.loads((out / "manifest.json").read_text())
    assert [s["name"] for s in stopped["stages"] + stopped["unchecked_stages"]] == [s["name"] for s in first["stages"]]
    m = pipeline.run(recipe.load(str(tiny_recipe)), out, progress=False, shared=shared)
    assert all(s["reused"] for s in m["stages"])


def test_a_stage_whose_revision_rose_is_redone(tiny_recipe, tmp_path, monkeypatch):
    """A fix that changes a stage's output raises its REVISION: runs made before it redo that stage rather than
    reuse what the old code wrote. Stages after it follow the content: here export writes the same bytes again,
    so quantize onwards are reused."""
    from edgekit.stages import export

    out = tmp_path / "run"
    run(tiny_recipe, out)
    monkeypatch.setattr(export, "REVISION", export.REVISION + 1)
    m = run(tiny_recipe, out)
    assert [s["reused"] for s in m["stages"]] == [True, True, False, True, True, True]


def test_new_measurements_reach_the_final_metrics_through_the_stages_after_them(tiny_recipe, tmp_path, monkeypatch):
    """evaluate writes no model, only numbers: when it is redone (a fix raised its REVISION), bench after it is
    redone too, so the manifest's final metrics and budgets carry the new numbers, not the reused stage's old ones."""
    from edgekit.stages import evaluate

    out = tmp_path / "run"
    run(tiny_recipe, out)
    measure = evaluate.run

    @functools.wraps(measure)  # recipe keys are checked against the stage's signature
    def remeasured(*args, **kwargs):
        artifact = measure(*args, **kwargs)
        artifact.metrics["remeasured"] = True
        return artifact

    monkeypatch.setattr(evaluate, "REVISION", evaluate.REVISION + 1)
    monkeypatch.setattr(evaluate, "run", remeasured)
    m = run(tiny_recipe, out)
    assert [s["reused"] for s in m["stages"]] == [True, True, True, True, False, False]
    assert m["final"]["metrics"]["remeasured"] is True


def test_a_corrupted_output_is_not_reused(tiny_recipe, tmp_path):
    out = tmp_path / "run"
    run(tiny_recipe, out)
    onnx = out / "03-export" / "model.onnx"
    onnx.write_bytes(onnx.read_bytes()[:1000])  # truncated
    m = run(tiny_recipe, out)
    assert [s["reused"] for s in m["stages"]][:3] == [True, True, False]
    assert onnx.stat().st_size > 1000


def test_a_stopped_run_resumes_from_finished_stages(tiny_recipe, tmp_path, monkeypatch):
    out = tmp_path / "run"
    import onnxruntime.quantization

    def stopped(*a, **k):
        raise KeyboardInterrupt  # as if Ctrl-C arrived in the middle of quantization

    monkeypatch.setattr(onnxruntime.quantization, "quantize_dynamic", stopped)
    with pytest.raises(KeyboardInterrupt):
        run(tiny_recipe, out)
    partial = json.loads((out / "manifest.json").read_text())
    assert [s["name"] for s in partial["stages"]] == ["finetune", "distill", "export"]
    assert partial["status"] == "running" and partial["final"] is None
    monkeypatch.undo()
    m = run(tiny_recipe, out)
    assert [s["reused"] for s in m["stages"]] == [True, True, True, False, False, False]


def test_second_run_into_the_same_folder_is_refused(tiny_recipe, tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    with open(out / ".lock", "a+") as held:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        with pytest.raises(EdgekitError, match="another edgekit run is writing to"):
            run(tiny_recipe, out)


def test_out_pointing_at_a_file_leaves_nothing(tiny_recipe, tmp_path):
    target = tmp_path / "file"
    target.write_text("keep me")
    with pytest.raises(EdgekitError, match="is a file; give a folder path"):
        run(tiny_recipe, target)
    assert target.read_text() == "keep me"


def test_bad_data_fails_before_any_output(tiny_recipe, tmp_path):
    bad = tmp_path / "one-class.csv"
    bad.write_text("text,label\n" + "\n".join(f"s{i},a" for i in range(30)))
    out = tmp_path / "run"
    with pytest.raises(EdgekitError, match="one class"):
        run(tiny_recipe, out, f"data.source={bad}")
    assert not out.exists()


def test_a_teacher_folder_without_tokenizer_files_is_refused_before_any_output(tiny_recipe, model_dir, tmp_path):
    bare = tmp_path / "bare"  # transformers would make up a 5-token BertTokenizer and train on [UNK] only
    bare.mkdir()
    for f in ("config.json", "model.safetensors"):
        (bare / f).write_bytes((model_dir / f).read_bytes())
    with pytest.raises(EdgekitError, match="bare has no tokenizer files .*tokenizer.save_pretrained"):
        run(tiny_recipe, tmp_path / "run", f"teacher={bare}")
    assert not (tmp_path / "run").exists()
    (bare / "tokenizer.json").write_bytes((model_dir / "tokenizer.json").read_bytes())
    assert pipeline.resolve_model(str(bare)).path == bare.resolve()


def test_unreachable_hub_id_names_the_offline_assets(tiny_recipe, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(EdgekitError, match="offline model assets: minilm-l6, mpnet-base"):
        run(tiny_recipe, tmp_path / "run", "teacher=someone/not-a-local-model")
    assert not (tmp_path / "run").exists()


def test_over_budget_is_reported_not_hidden(tiny_recipe, tmp_path):
    m = run(tiny_recipe, tmp_path / "run", "budgets.size_mb=<= 0.0001", "budgets.latency_ms_p99=< 100000")
    assert m["status"] == "over_budget"
    assert [b["ok"] for b in m["budgets"]] == [False, True]


def test_python_api_compress_and_load_agree_across_formats(tiny_recipe, tmp_path):
    final, manifest = edgekit.compress(str(tiny_recipe), out=tmp_path / "run", progress=False)
    onnx = edgekit.load(final.path)
    hf = edgekit.load(tmp_path / "run" / "02-distill" / "model")
    texts = ["the movie was good", "awful plot", "a superb cast"]
    a, b = onnx(texts), hf(texts)
    assert a["labels"] == b["labels"] and set(a["labels"]) <= {"neg", "pos"}
    assert abs(a["probs"] - b["probs"]).max() < 0.1 and a["probs"].shape == (3, 2)
    with pytest.raises(EdgekitError, match="overrides must be a list of key=value strings, such as "
                                           "\\['distill.epochs=1'\\], not one string"):
        edgekit.compress(str(tiny_recipe), out=tmp_path / "run", overrides="distill.epochs=1")


def test_context_of_a_finished_run_reloads_its_data_whole_and_its_teacher(tiny_recipe, tmp_path):
    out = tmp_path / "run"
    small = run(tiny_recipe, out, "data.max_eval=5")
    manifest, ctx = pipeline.context_of(out.resolve(), progress=False)
    assert manifest["final"] == small["final"]
    assert len(ctx.splits.test) > 5  # benchmarks score the whole test split
    assert ctx.teacher.path == out.resolve() / "01-finetune" / "model"


def test_a_teacher_labelled_otherwise_needs_a_finetune_stage(tmp_path, model_dir, csv_file):
    from edgekit import families, testing

    model = families.load_model(model_dir)
    model.config.id2label, model.config.label2id = {0: "good", 1: "bad"}, {"good": 0, "bad": 1}  # the data: neg, pos
    model.save_pretrained(model_dir)  # (the same names in another order run: tests/test_labels.py)
    path = tmp_path / "no-finetune.yaml"
    path.write_text(testing.tiny_recipe(model_dir, csv_file, stages=("export", "evaluate")))
    with pytest.raises(EdgekitError, match=r"predicts \[good, bad\] but the data's labels are \[neg, pos\]; add"):
        edgekit.compress(str(path), out=tmp_path / "run", progress=False)
    assert not (tmp_path / "run").exists()  # refused before anything is written
    path.write_text(testing.tiny_recipe(model_dir, csv_file, stages=("finetune", "export", "evaluate")))
    edgekit.compress(str(path), out=tmp_path / "run", progress=False)  # finetune re-heads it: runs


def test_a_teacher_with_unnamed_labels_used_without_finetune_gives_artifacts_the_datas_names(model_dir, csv_file,
                                                                                          tmp_path):
    """Was: every model.json said LABEL_0 / LABEL_1, and device_bench refused the run's own data file."""
    from edgekit import testing

    path = tmp_path / "r.yaml"
    path.write_text(testing.tiny_recipe(model_dir, csv_file, stages=("distill", "export")))
    m = pipeline.run(recipe.load(str(path), ["distill.epochs=0.2"]), tmp_path / "run", progress=False)
    student = json.loads((tmp_path / "run" / "01-distill" / "model" / "config.json").read_text())
    exported = json.loads((tmp_path / "run" / "02-export" / "model.json").read_text())
    assert m["data"]["labels"] == ["neg", "pos"] and list(student["id2label"].values()) == ["neg", "pos"]
    assert exported["labels"] == ["neg", "pos"]
    assert edgekit.load(tmp_path / "run")(["a good film"])["labels"][0] in ("neg", "pos")


def test_editing_a_local_folder_or_file_a_setting_names_reruns_its_stage(model_dir, csv_file, tmp_path):
    """distill.student (and augment_model, init_from, a transfer .txt) keyed the stage by its path alone: a student
    folder saved again with other weights, or an edited transfer file, reused the old stage's output."""
    student = testing.make_model_dir(tmp_path / "student", layers=2)
    recipe_file = tmp_path / "r.yaml"
    recipe_file.write_text(testing.tiny_recipe(model_dir, csv_file, ("distill", "export")))
    out, over = tmp_path / "run", (f"distill.student={student}", "distill.layers=all", "distill.epochs=1")
    first = run(recipe_file, out, *over)
    assert [s["reused"] for s in run(recipe_file, out, *over)["stages"]] == [True, True]
    testing.make_model_dir(student, layers=2, seed=1)  # the same folder, other weights
    again = run(recipe_file, out, *over)
    assert [s["reused"] for s in again["stages"]] == [False, False]
    assert again["stages"][0]["files"] != first["stages"][0]["files"]
    texts = tmp_path / "more.txt"
    texts.write_text("a plain line\nanother plain line\n")
    prints = pipeline.local_prints({"transfer": str(texts), "student": "teacher", "augment_model": "minilm-l6"})
    texts.write_text("a plain line\nan edited line\n")
    assert list(prints) == ["transfer"] and pipeline.local_prints({"transfer": str(texts)}) != prints


@pytest.mark.parametrize("stop", ["in_a_changed_stage", "after_a_stage_before_its_manifest", "with_an_error",
                                  "manifest_of_another_schema"])
def test_a_run_stopped_half_way_leaves_a_folder_the_same_command_finishes(model_dir, csv_file, tmp_path, stop):
    """A re-run stopped inside a changed stage, one stopped between a stage's rename and the manifest that lists
    it, or one that failed, left stage folders the next run refused as 'not made by an edgekit run here' (the
    manifest listed only the stages done so far); so did a manifest edgekit could not use to reuse stages."""
    path, out = tmp_path / "r.yaml", tmp_path / "run"
    path.write_text(testing.tiny_recipe(model_dir, csv_file, ("finetune", "distill", "export")))
    first = run(path, out)
    real_entry, real_stage = pipeline.stages.entry, pipeline.run_stage

    def entry(name):
        @functools.wraps(real_entry(name))  # the recipe is bound to its signature
        def fail(*args, **kwargs):
            raise KeyboardInterrupt if stop == "in_a_changed_stage" else EdgekitError("distill failed")
        return fail if name == "distill" and stop != "after_a_stage_before_its_manifest" else real_entry(name)

    def stage_then_stop(name, *args, **kwargs):
        result = real_stage(name, *args, **kwargs)
        if name == "finetune" and stop == "after_a_stage_before_its_manifest":
            raise KeyboardInterrupt  # a signal after 01-finetune is renamed, before the manifest lists it
        return result
    if stop == "manifest_of_another_schema":
        (out / "manifest.json").write_text((out / "manifest.json").read_text().replace('"schema": 1', '"schema": 2'))
    else:
        if stop == "after_a_stage_before_its_manifest":  # the first run into a folder: no earlier manifest
            shutil.rmtree(out)
        pipeline.stages.entry, pipeline.run_stage = entry, stage_then_stop
        try:
            with pytest.raises((KeyboardInterrupt, EdgekitError)):
                run(path, out, "distill.temperature=3")
        finally:
            pipeline.stages.entry, pipeline.run_stage = real_entry, real_stage
    assert pipeline.foreign_folders(out) == []
    again = run(path, out)  # was: --out holds 02-distill, 03-export, named like a stage but not made by an edgekit run
    assert again["status"] == "complete" and again["final"]["path"] == first["final"]["path"]
    assert sorted(p.name for p in out.iterdir() if p.is_dir()) == ["01-finetune", "02-distill", "03-export"]


def test_numbers_key_alike_and_a_relative_data_path_is_recorded_whole(model_dir, csv_file, tmp_path, monkeypatch):
    """distill.temperature=2 against the default 2.0 re-ran distillation; a data file named relative to the folder
    compress ran in was recorded so, and edgekit bench from another folder said it was not there any more."""
    monkeypatch.chdir(csv_file.parent)
    path, out = tmp_path / "r.yaml", tmp_path / "run"
    path.write_text(testing.tiny_recipe(model_dir, csv_file.name, ("distill", "export")))
    first = run(path, out)
    assert first["recipe"]["data"]["source"] == str(csv_file.resolve()) == first["data"]["source"]
    again = run(path, out, "distill.temperature=2", "distill.epochs=3.0")  # the tiny recipe's 3; the default 2.0
    assert [s["reused"] for s in again["stages"]] == [True, True]
    monkeypatch.chdir(tmp_path.parent)
    assert pipeline.context_of(out, progress=False)[1].splits.test == data.load(str(csv_file)).test


def test_the_bench_stage_measures_again_on_another_machine(tiny_recipe, tmp_path, monkeypatch):
    """The bench stage's key held no machine: a run folder copied to another CPU (a CI runner of another kind) kept
    the first machine's latency as its own."""
    out = tmp_path / "run"
    run(tiny_recipe, out)
    assert all(s["reused"] for s in run(tiny_recipe, out)["stages"])
    monkeypatch.setattr(devices, "this_cpu", lambda: {"cpu": "Another CPU", "int8_isa": "Arm dot product"})
    assert [s["reused"] for s in run(tiny_recipe, out)["stages"]] == [True] * 5 + [False]


def test_an_unreadable_manifest_is_a_warning_in_edgekits_own_form_and_every_stage_runs(tmp_path, capsys,
                                                                                        monkeypatch):
    (tmp_path / "manifest.json").write_text("{bad")
    assert pipeline.read_manifest(tmp_path / "manifest.json") == {}
    said = capsys.readouterr().err
    assert said.startswith(f"edgekit: warning: {tmp_path / 'manifest.json'} is unreadable or invalid (Expecting "
                           f"property name enclosed in double quotes") and said.endswith("every stage runs again\n")
    from edgekit import schemas

    (tmp_path / "manifest.json").write_text("{}")
    monkeypatch.setattr(schemas, "validate", lambda *a: (_ for _ in ()).throw(EdgekitError("word " * 100)))
    assert pipeline.read_manifest(tmp_path / "manifest.json") == {}
    said = capsys.readouterr().err
    assert " ...); every stage runs again" in said and len(said) < 400  # cut at a word, and said to be cut
