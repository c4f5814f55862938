import io
import os
import subprocess
import sys
from pathlib import Path

import pytest

from edgekit import cli, errors, testing
from edgekit.errors import EdgekitError


def edgekit(*args, env=None):
    return subprocess.run([sys.executable, "-m", "edgekit.cli", *args], capture_output=True, text=True,
                          env=None if env is None else {**os.environ, **env})


def test_python_dash_m_edgekit_is_the_command():
    done = subprocess.run([sys.executable, "-m", "edgekit", "recipes"], capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout.startswith("distilbert-int8 "), done.stderr  # was: no __main__
    assert subprocess.run([sys.executable, "-m", "edgekit", "gate"], capture_output=True).returncode == 2


def test_recipes_list_and_show():
    listed = edgekit("recipes")
    assert listed.returncode == 0 and listed.stdout.startswith("distilbert-int8")
    shown = edgekit("recipes", "show", "distilbert-int8")
    assert shown.returncode == 0 and "stages: [finetune, distill" in shown.stdout


def test_dry_run_prints_the_resolved_recipe():
    done = edgekit("compress", "--dry-run", "distill.epochs=1", "--teacher", "mpnet-base")
    assert done.returncode == 0
    assert "teacher: mpnet-base" in done.stdout and "epochs: 1" in done.stdout


def test_version():
    import edgekit as package

    done = edgekit("--version")
    assert done.returncode == 0 and done.stdout == f"edgekit {package.__version__}\n"


def test_bench_scripts_end_as_commands_do(tmp_path):
    """A bench script given a folder that is not a finished run says so in one line (was a traceback)."""
    root = Path(__file__).parent.parent
    for script in ("peers.py", "roofline.py", "quantize.py"):
        done = subprocess.run([sys.executable, str(root / "bench" / script), str(tmp_path / "no-run")],
                              capture_output=True, text=True)
        assert done.returncode == 1 and done.stderr.startswith(f"{script}: error: ") and "no-run" in done.stderr
        assert done.stderr.count("\n") == 1, done.stderr


def test_usage_errors_exit_2_with_one_line():
    for args in (["compress", "--recipe", "nope"], ["compress", "--dry-run", "distill.epoch=3"], ["frobnicate"]):
        done = edgekit(*args)
        assert done.returncode == 2, args
        assert len(done.stderr.strip().splitlines()) <= 3 and "Traceback" not in done.stderr


def test_errors_of_ranks_after_the_first_say_which_rank(monkeypatch, capsys):
    monkeypatch.setenv("WORLD_SIZE", "2")
    for rank, prefix in (("1", "edgekit: error (rank 1): "), ("0", "edgekit: error: ")):
        monkeypatch.setenv("RANK", rank)
        assert cli.main(["compress", "--recipe", "nope"]) == 2
        assert capsys.readouterr().err.startswith(prefix)


def test_runtime_errors_exit_1_and_verbose_shows_the_traceback(tmp_path):
    (tmp_path / "empty.csv").write_text("")
    args = ["compress", "--data", str(tmp_path / "empty.csv"), "--out", str(tmp_path / "o")]
    done = edgekit(*args, env={"EDGEKIT_CACHE": str(tmp_path / "cold")})  # on a fresh machine: was a 90 MB fetch
    assert done.returncode == 1 and done.stderr.count("\n") == 1 and "empty.csv is empty" in done.stderr  # first
    assert not (tmp_path / "o").exists() and not any((tmp_path / "cold").rglob("*.whl"))
    verbose = edgekit("-v", *args)
    assert "Traceback" in verbose.stderr and verbose.returncode == 1
    verbose = edgekit("-v", "recipes", "show", "nope")  # a usage error stays exit 2 with -v (was 1: uncaught)
    assert "Traceback" in verbose.stderr and verbose.returncode == 2 and "edgekit: error: " in verbose.stderr


def test_sigterm_ends_a_run_like_ctrl_c_and_says_what_resumes(model_dir, csv_file, tmp_path):
    import signal
    import time

    recipe = tmp_path / "r.yaml"  # long enough to be stopped inside fine-tuning
    recipe.write_text(testing.tiny_recipe(model_dir, csv_file, ("finetune", "export"))
                      .replace("{epochs: 4,", "{epochs: 400,", 1))
    args = [sys.executable, "-m", "edgekit.cli", "compress", "--recipe", str(recipe), "--out", str(tmp_path / "run")]
    run = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    while not list((tmp_path / "run").glob("01-finetune.partial/checkpoint*")) and run.poll() is None:
        time.sleep(0.2)  # waits for the first checkpoint: a test that waits, never one that times
    run.send_signal(signal.SIGTERM)
    time.sleep(0.05)
    run.send_signal(signal.SIGTERM)  # CI's cancel, then its second: a traceback, a temp file left, or exit -15
    out, err = run.communicate(timeout=120)
    assert run.returncode == 143, err  # was -15: no message, no cleanup
    assert err.rstrip().endswith("edgekit: terminated; run the same command again to resume")
    assert err.count("edgekit: terminated") == 1 and "Traceback" not in err, err
    assert not list((tmp_path / "run").rglob("*.tmp"))


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")  # the dropped stop, as Python says it
def test_a_stop_python_dropped_still_ends_the_run(model_dir, csv_file, tmp_path, capsys, monkeypatch):
    """A signal handler's exception raised inside a __del__ or weakref callback is printed as "Exception ignored"
    and dropped: the run went on to the end and exited 0."""
    import functools
    import signal

    from edgekit.stages import finetune

    class Dropping:
        def __del__(self):
            os.kill(os.getpid(), signal.SIGTERM)  # the handler runs here, inside __del__
            sum(range(1000))

    real = finetune.run

    @functools.wraps(real)  # the recipe's settings are checked against its signature
    def run(*args, **kwargs):
        Dropping()
        return real(*args, **kwargs)
    monkeypatch.setattr(finetune, "run", run)
    recipe = tmp_path / "r.yaml"
    recipe.write_text(testing.tiny_recipe(model_dir, csv_file, ("finetune", "export")))
    assert cli.main(["compress", "--recipe", str(recipe), "--out", str(tmp_path / "run"), "--quiet"]) == 143
    err = capsys.readouterr().err
    assert err.rstrip().endswith("terminated; run the same command again to resume")  # was exit 0, run complete
    assert not (tmp_path / "run" / "01-finetune").exists()  # stopped at its first training step
    assert cli.main(["recipes"]) == 0  # the next command in the same process is not stopped by the old signal
    errors.STOP.update(at=1.0, signal=signal.SIGTERM)  # one left by a signal after a command's cleanup
    assert cli.main(["recipes"]) == 0
    real, installed = signal.signal, []
    monkeypatch.setattr(cli.signal, "signal", lambda s, h: installed.append((s, h)) or real(s, h))
    ignored = real(signal.SIGINT, signal.SIG_IGN)  # `edgekit compress ... &` in a script: Ctrl-C is not for it
    try:
        assert cli.main(["recipes"]) == 0
    finally:
        real(signal.SIGINT, ignored)
    assert (signal.SIGTERM, cli._stop) in installed and (signal.SIGINT, cli._stop) not in installed


def test_over_budget_exits_3(tiny_recipe, tmp_path, capsys):
    code = cli.main(["compress", "--recipe", str(tiny_recipe), "--out", str(tmp_path / "r"), "--quiet",
                     "budgets.size_mb=<= 0.0001"])
    out = capsys.readouterr().out
    assert code == 3 and "OVER BUDGET" in out and "| quantize |" in out


def test_assets_list():
    done = edgekit("assets")
    assert done.returncode == 0
    assert all(name in done.stdout for name in ("minilm-l6", "mpnet-base", "rt-polarity"))


def test_file_errors_say_what_to_do_by_their_kind():
    import errno

    full = cli.os_problem(OSError(errno.ENOSPC, "No space left on device", "/r/02-distill/model.safetensors"))
    assert full.startswith("cannot write /r/02-distill/model.safetensors: No space left on device; free space")
    assert "permissions" in cli.os_problem(OSError(errno.EACCES, "Permission denied", "/r"))
    assert "stages" not in cli.os_problem(OSError(errno.ENOSPC, "No space left on device", "<stdout>"), "gate")
    assert cli.os_problem(OSError(errno.EROFS, "Read-only file system", "/r/report"), "report").endswith(
        "choose another folder (--out)")  # a read-only run: report --out elsewhere works
    assert "bench writes its results into the run folder" in \
        cli.os_problem(OSError(errno.EROFS, "Read-only file system", "/r/.lock"), "bench")
    gone = cli.os_problem(OSError(errno.ENOENT, "No such file or directory", "/missing/dir/g.xml.tmp"))
    assert gone.startswith("/missing/dir/g.xml.tmp does not exist") and "free space" not in gone
    # transformers raises a bare OSError: said to be a disk or permissions problem before
    bare = cli.os_problem(OSError("Error no file named model.safetensors found in directory /m.\nmore"))
    assert bare == "cannot read or write: Error no file named model.safetensors found in directory /m."


def test_gate_junit_into_a_missing_folder_is_one_line(tiny_recipe, tmp_path, capsys):
    model = tmp_path / "model.onnx"
    model.write_bytes(b"0" * 1000)
    code = cli.main(["gate", str(model), "--max-size-mb", "1", "--junit", str(tmp_path / "no" / "g.xml")])
    out, err = capsys.readouterr()
    assert code == 2 and err.count("\n") == 1 and "g.xml: its folder does not exist" in err and "--out" not in err
    assert out == ""  # refused before the budgets were printed as if checked


def test_dry_run_refuses_out_of_range_values_with_exit_2():
    done = edgekit("compress", "--dry-run", "prune.heads_keep=1.5", "distill.alpha=2", "evaluate.split=train")
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert "distill.alpha must be in [0, 1], got 2" in done.stderr
    assert "evaluate.split must be one of validation, test" in done.stderr
    assert "prune has settings but is not in stages" in done.stderr  # distilbert-int8 has no prune stage


def test_accuracy_bounds_are_fractions(tmp_path):
    model = tmp_path / "model.onnx"
    model.write_bytes(b"0" * 1000)
    done = edgekit("gate", str(model), "--min-accuracy-retained", "97")
    assert done.returncode == 2 and "accuracy_retained 97 is not a fraction: 0.97 means 97%" in done.stderr
    done = edgekit("compress", "--dry-run", "budgets.accuracy_retained=>= 97")
    assert done.returncode == 2 and "not a fraction" in done.stderr
    from edgekit import recipe
    assert "label_agreement 99 is not a fraction" in recipe.bound_problem("label_agreement", 99)  # was always OVER


def test_usage_mistakes_outside_recipes_exit_2_and_help_names_the_exit_codes():
    for args in (["recipes", "show"], ["assets", "fetch", "nope"], ["compare", "minilm-l6", "--threads", "0"],
                 ["compare", "minilm-l6", "--threads", "-2"]):
        done = edgekit(*args)
        assert done.returncode == 2 and "Traceback" not in done.stderr, (args, done.stderr)
    assert "assets fetch needs a NAME from: minilm-l6" in edgekit("assets", "fetch", "nope").stderr
    for args in (["--help"], ["gate", "--help"], ["compare", "--help"]):
        assert "3 over budget" in " ".join(edgekit(*args).stdout.split())
    assert "0.97 keeps 97%" in " ".join(edgekit("gate", "--help").stdout.split())


def test_dry_run_checks_the_data_and_a_local_teacher_folder(tmp_path):
    done = edgekit("compress", "--dry-run", "--data", str(tmp_path / "missing.csv"))
    assert done.returncode == 2 and "missing.csv not found; give rt-polarity, vader-amazon" in done.stderr
    done = edgekit("compress", "--dry-run", "--data", "nothere.csv")  # said without the folder it was read from
    assert done.returncode == 2 and f"dataset nothere.csv not found (looked for {Path.cwd() / 'nothere.csv'}: a " \
        "relative path is read from the current folder, not the recipe's)" in done.stderr
    (tmp_path / "home").mkdir()
    (tmp_path / "home" / "d.csv").write_text(testing.make_csv(tmp_path / "d.csv").read_text())
    done = edgekit("compress", "--dry-run", "--data", "~/d.csv", env={"HOME": str(tmp_path / "home")})
    assert done.returncode == 0, done.stderr  # --dry-run refused ~ (the run took it)
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text("{")
    done = edgekit("compress", "--dry-run", "--teacher", str(tmp_path / "m"))
    assert done.returncode == 1 and "config.json is not valid JSON" in done.stderr


@pytest.mark.parametrize("override, line", [
    ("distill.transfer=foo.csv", "transfer source 'foo.csv' is not tweets-3class nor a local .txt file"),
    ("prune.transfer=nothere.txt", "transfer source 'nothere.txt' is not tweets-3class nor a local .txt file"),
    ("distill.init_from=nothere.safetensors", "distill.init_from nothere.safetensors: no such file or folder"),
])
def test_dry_run_checks_the_files_distill_and_prune_settings_name(model_dir, csv_file, tmp_path, override, line):
    """Each passed --dry-run and failed only when its stage began, after fine-tuning."""
    recipe = tmp_path / "r.yaml"
    recipe.write_text(testing.tiny_recipe(model_dir, csv_file, ("finetune", "distill", "prune")))
    done = edgekit("compress", "--recipe", str(recipe), "--dry-run", override)
    assert done.returncode == 2 and line in done.stderr and done.stderr.count("\n") == 1, done.stderr
    assert cli.main(["compress", "--recipe", str(recipe), "--out", str(tmp_path / "run"), "--quiet", override]) == 2
    assert not (tmp_path / "run" / "01-finetune").exists()


def test_dry_run_refuses_a_teacher_whose_labels_are_not_the_datas(model_dir, csv_file, tmp_path, capsys):
    """Without a finetune stage: --dry-run passed it, and the real run refused it after loading the teacher."""
    import json

    config = json.loads((model_dir / "config.json").read_text())
    config.update(id2label={"0": "negative", "1": "positive"}, label2id={"negative": 0, "positive": 1})
    (model_dir / "config.json").write_text(json.dumps(config))
    recipe = tmp_path / "r.yaml"
    recipe.write_text(testing.tiny_recipe(model_dir, csv_file, ("distill", "export")))
    assert cli.main(["compress", "--recipe", str(recipe), "--dry-run"]) == 1
    err = capsys.readouterr().err
    assert "predicts [negative, positive] but the data's labels are [neg, pos]" in err and err.count("\n") == 1
    named = testing.make_csv(tmp_path / "named.csv", labels=("positive", "negative"))  # the teacher's, other order
    assert cli.main(["compress", "--recipe", str(recipe), "--dry-run", f"data.source={named}"]) == 0


def test_a_label_column_of_ids_or_texts_is_said_as_such(tmp_path):
    """It read as 'has no test rows' (each value a class of one row, moved into training) in a file of 3,000 rows."""
    import csv

    from edgekit import data

    with open(tmp_path / "t.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["tweet_id", "tweet", "sentiment"])
        w.writerows([i, f"tweet {i} is {'good' if i % 2 else 'bad'}", "pos" if i % 2 else "neg"] for i in range(300))
    for text, label in (("tweet", "tweet_id"), ("sentiment", "tweet")):
        with pytest.raises(errors.UsageError, match=f"label column '{label}' holds 300 different values in 300 rows"):
            data.load(str(tmp_path / "t.csv"), text_column=text, label_column=label)
    assert data.load(str(tmp_path / "t.csv"), text_column="tweet", label_column="sentiment").labels == ["neg", "pos"]


def test_a_recipe_with_data_as_one_path_takes_data_overrides(model_dir, csv_file, tmp_path):
    """`data: FILE` (short for data.source) and data.max_train=10: 'data must name a source'."""
    recipe = tmp_path / "r.yaml"
    recipe.write_text(testing.tiny_recipe(model_dir, csv_file, ("finetune",))
                      .replace(f"data: {{source: {csv_file}}}", f"data: {csv_file}"))
    assert f"data: {csv_file}\n" in recipe.read_text()
    done = edgekit("compress", "--recipe", str(recipe), "--dry-run", "data.max_train=10")
    assert done.returncode == 0, done.stderr


def test_compare_refuses_a_sequence_longer_than_the_positions(model_dir, tmp_path, capsys):
    code = cli.main(["compare", str(model_dir), "--seq-len", "512", "--out", str(tmp_path / "c")])
    err = capsys.readouterr().err
    assert code == 2 and "--seq-len 512 is longer than" in err and "(128 tokens); lower --seq-len" in err


def test_an_error_starts_its_own_line_after_a_progress_bar_and_interrupts_say_what_resumes(monkeypatch, capsys):
    from tqdm import tqdm

    from edgekit import compare

    def fails(*args, **kwargs):
        bar = tqdm(total=10, desc="compare")
        bar.update(3)
        raise EdgekitError("boom")

    monkeypatch.setattr(compare, "run", fails)
    assert cli.main(["compare", "minilm-l6"]) == 1
    err = capsys.readouterr().err
    assert "\nedgekit: error: boom\n" in err and err.count("edgekit: error") == 1

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(compare, "run", interrupted)
    assert cli.main(["compare", "minilm-l6"]) == 130
    assert capsys.readouterr().err == "edgekit: interrupted\n"  # compare does not resume


def test_dry_run_catches_what_used_to_fail_after_fine_tuning(tiny_recipe, model_dir, tmp_path, capsys):
    from edgekit import testing

    def dry(recipe, *overrides):
        code = cli.main(["compress", "--recipe", str(recipe), "--dry-run", *overrides])
        return code, capsys.readouterr().err

    assert dry(tiny_recipe)[0] == 0
    roberta = testing.make_model_dir(tmp_path / "roberta", family="roberta")  # 128 positions, 126 tokens
    code, err = dry(tiny_recipe, f"teacher={roberta}", "max_length=128")  # was an index error inside distill
    assert code == 2 and "max_length 128 is longer than the teacher" in err and "(126 tokens); give max_length <= 126" in err
    code, err = dry(tiny_recipe, f"distill.student={roberta}", "max_length=128")
    assert code == 2 and f"max_length 128 is longer than student {roberta} takes (126 tokens)" in err
    code, err = dry(tiny_recipe, "distill.layers=[0, 7]")
    assert code == 2 and "distill.layers [0, 7]: the teacher has 4 layers (indices 0..3)" in err
    (tmp_path / "empty.csv").write_text("text,label\n")
    code, err = dry(tiny_recipe, f"data.source={tmp_path / 'empty.csv'}")
    assert code == 1 and "empty.csv is empty" in err
    code, err = dry(tiny_recipe, "distill.student=/nonexist")
    assert code == 2 and "model '/nonexist': no such folder (/nonexist)" in err
    code, err = dry(tiny_recipe, "teacher=./nonexist")  # --dry-run passed it (a real run refused it)
    assert code == 2 and "model './nonexist': no such folder" in err
    code, err = dry(tiny_recipe, "distill.student=~/nonexist")  # a path: the hub is not asked
    assert code == 2 and f"no such folder ({Path.home() / 'nonexist'})" in err and "hub could not" not in err
    out = tmp_path / "real"  # a real run refuses it before the first stage, and writes nothing
    assert cli.main(["compress", "--recipe", str(tiny_recipe), "--out", str(out), "teacher=./nonexist"]) == 2
    assert "model './nonexist': no such folder" in capsys.readouterr().err and not out.exists()
    assert cli.main(["compress", "--recipe", str(tiny_recipe), "--out", str(out), "distill.student=../x"]) == 2
    assert not out.exists()
    albert = testing.make_model_dir(tmp_path / "albert", family="albert")
    path = tmp_path / "prune.yaml"
    path.write_text(testing.tiny_recipe(albert, testing.make_csv(tmp_path / "d.csv"), ("finetune", "prune", "export")))
    code, err = dry(path, "prune.hidden_keep=0.5")
    assert code == 2 and "supports bert, roberta, xlm-roberta, camembert, data2vec-text, electra, not albert (the model it prunes)" in err


@pytest.mark.parametrize("overrides, message", [
    (["prune.heads_per_layer=5"], "prune.heads_per_layer=5: the model it prunes has 4 heads per layer; give 1..4"),
    (["distill.student_config={num_attention_heads: 2}", "prune.heads_per_layer=3"], "has 2 heads per layer; give 1..2"),
    (["prune.embedding_rank=32"], "prune.embedding_rank=32: give 1..31 (the embedding width is 32)"),
    (["distill.student_config={num_attention_heads: 5}"], "hidden_size 32 is not a multiple of num_attention_heads 5"),
    (["distill.student_config={num_hidden_layers: 3}", "distill.layers=[0, 1]"], "num_hidden_layers=3 but distill.layers lists 2"),
    (["distill.layer_map=[0, 9]"], "distill.layer_map [0, 9] does not fit: the student has 2 layers, the teacher 4"),
])
def test_settings_that_do_not_fit_the_model_are_refused_before_the_first_stage(model_dir, csv_file, tmp_path, capsys,
                                                                               overrides, message):
    recipe = tmp_path / "all.yaml"  # each used to fail when its stage began: after fine-tuning, or after distilling
    recipe.write_text(testing.tiny_recipe(model_dir, csv_file, ("finetune", "distill", "prune", "export")))
    for dry in (["--dry-run"], ["--out", str(tmp_path / "run")]):
        assert cli.main(["compress", "--recipe", str(recipe), *dry, *overrides]) == 2
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1
    assert not (tmp_path / "run").exists()
    assert cli.main(["compress", "--recipe", str(recipe), "--dry-run", *overrides[:-1]]) == 0


def test_native_banners_stay_out_of_a_quiet_tflite_compress(model_dir, csv_file, tmp_path):
    pytest.importorskip("litert_torch")
    recipe = tmp_path / "tfl.yaml"  # a new process: TensorFlow's import banner and XNNPACK's come once per process
    recipe.write_text(testing.tiny_recipe(model_dir, csv_file, stages=("export", "quantize", "evaluate"))
                      .replace("stages:", "targets: [arm64]\nstages:", 1).replace("{check_sentences: 16}", "{format: tflite}", 1))
    done = edgekit("compress", "--recipe", str(recipe), "--out", str(tmp_path / "run"), "--quiet")
    assert done.returncode == 0, done.stderr
    assert [line for line in done.stderr.splitlines() if not line.startswith("edgekit: warning: ")] == []  # was:
    # absl's "All log messages before absl::InitializeLog()", oneDNN, converter op (the random teacher is warned about)
    assert "model.tflite" in done.stdout and "INFO" not in done.stdout  # counts, quantizer bars, "Created ... XNNPACK"


def test_hidden_output_drops_native_writes_and_shows_them_only_when_something_unexpected_fails(capfd):
    from edgekit.errors import EdgekitError
    from edgekit.native import hidden_output

    with hidden_output():
        os.write(1, b"native banner\n")
        os.write(2, b"native log\n")
        print("python print")
        print("python warning", file=sys.stderr)
    print("after")
    assert capfd.readouterr() == ("after\n", "")
    with pytest.raises(EdgekitError), hidden_output():
        os.write(2, b"noise before a clear message\n")
        raise EdgekitError("one clear line")
    assert capfd.readouterr() == ("", "")
    with pytest.raises(ZeroDivisionError), hidden_output():
        os.write(2, b"F0000 converter.cc:12] the reason\n")
        1 / 0
    assert "the reason" in capfd.readouterr().err
    os.write(2, b"fd 2 is back\n")
    assert capfd.readouterr().err == "fd 2 is back\n"


@pytest.mark.parametrize("native_log", ["", "1"])
def test_a_native_crash_inside_hidden_output_is_said_on_the_real_stderr(tmp_path, native_log):
    """A converter or runtime that kills the process (SIGSEGV) while its output is hidden: Python's fatal error and
    traceback reach the real stderr (the process died saying nothing); EDGEKIT_NATIVE_LOG=1 leaves what the
    library wrote in place, and the host's stdout untouched."""
    script = tmp_path / "crash.py"
    script.write_text("import ctypes, os\nfrom edgekit.native import hidden_output\nwith hidden_output():\n"
                      "    os.write(2, b'F0000 converter.cc:12] the reason\\n')\n    ctypes.string_at(0)\n")
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          env={**os.environ, "EDGEKIT_NATIVE_LOG": native_log})
    assert done.returncode == -11 and done.stdout == "", done
    if native_log:
        assert "F0000 converter.cc:12] the reason" in done.stderr, done.stderr
    else:
        assert "Fatal Python error: Segmentation fault" in done.stderr, done.stderr
        assert f'File "{script}", line 5' in done.stderr and "the reason" not in done.stderr, done.stderr


def test_hidden_output_is_one_thread_at_a_time_and_takes_away_a_logging_handler_made_inside():
    """Two TFLite loads in two threads left fds 1 and 2 on a deleted file; litert_torch's logging.info() inside made
    the root handler of a host without logging configured write to that file ("--- Logging error ---")."""
    code = """if True:
        import logging, os, sys, threading, time
        from edgekit.native import hidden_output
        before, streams = (os.fstat(1).st_ino, os.fstat(2).st_ino), (sys.stdout, sys.stderr)
        def work():
            for _ in range(20):
                with hidden_output():
                    os.write(1, b"native")
                    time.sleep(0.002)
        threads = [threading.Thread(target=work) for _ in range(4)]
        [t.start() for t in threads]
        [t.join() for t in threads]
        assert (os.fstat(1).st_ino, os.fstat(2).st_ino) == before and (sys.stdout, sys.stderr) == streams
        with hidden_output():
            logging.info("inside")  # no handler yet: basicConfig, on the stderr of the moment
        logging.warning("after")
        print("done")
    """
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout == "done\n", done.stderr
    assert "Logging error" not in done.stderr and "after" in done.stderr


def test_what_was_read_is_told_and_labels_that_look_alike_are_warned_about(model_dir, tmp_path, capsys):
    rows = [("good film", "pos"), ("bad film", "neg"), ("great plot", "Pos"), ("dull plot", "neg"), ("", "pos")] * 30
    (tmp_path / "d.csv").write_text("text,label\n" + "".join(f"{t},{y}\n" for t, y in rows))
    recipe = tmp_path / "r.yaml"
    recipe.write_text(testing.tiny_recipe(model_dir, tmp_path / "d.csv", ("finetune", "evaluate")))
    assert cli.main(["compress", "--recipe", str(recipe), "--dry-run"]) == 0
    err = capsys.readouterr().err
    assert "data: 150 rows read, 30 skipped (empty text or label);" in err and "classes: Pos 30, neg 60, pos 30" in err
    assert "warning: labels 'Pos' and 'pos' differ only in case" in err and "does nothing" not in err
    assert cli.main(["compress", "--recipe", str(recipe), "--dry-run", "finetune.epochs=1"]) == 0
    assert cli.main(["compress", "--recipe", str(recipe), "--dry-run", "stages=[finetune,prune,export]",
                     "prune.lr=1e-3", "export.buckets=[16]"]) == 0  # each ran, silently changing nothing
    err = capsys.readouterr().err
    assert "warning: prune.lr is set but does nothing without prune.recover_epochs > 0" in err
    assert "warning: export.buckets is set but does nothing: no target exports TFLite" in err
    assert cli.main(["compress", "--recipe", str(recipe), "--out", str(tmp_path / "run"), "--quiet"]) == 0
    err = capsys.readouterr().err  # --quiet drops the counts, never the warning
    assert "data: 150 rows" not in err and "warning: labels 'Pos' and 'pos' differ only in case" in err
    import json  # a final transformers folder (no export) has a size: its size budget was "None OVER BUDGET", exit 3
    assert json.loads((tmp_path / "run" / "manifest.json").read_text())["final"]["metrics"]["size_mb"] > 0


@pytest.mark.parametrize("argv, message", [
    (["assets", "list", "extra"], "assets list takes no name (got 'extra')"),  # was ignored, exit 0
    (["recipes", "list", "x"], "recipes list takes no name (got 'x')"),
    (["assets", "fetch"], "assets fetch needs a NAME from: minilm-l6"),  # was "...; got None"
    (["recipes", "show", "distilbert-int8.yaml"], "the shipped recipe is named distilbert-int8 (no .yaml)"),
    (["compare", "minilm-l6", "--seq-len", "0"], "--seq-len 0: give a sequence length in [2, 512]"),  # was exit 1
    (["compress", "--dry-run", "--data", "/no/such.csv"], "dataset /no/such.csv not found"),  # these four: exit 1,
    (["compress", "--dry-run", "--data", "nosuchset"], "dataset nosuchset not found"),  # where --teacher /x was 2
    (["compress", "--dry-run", "--data", "minilm-l6"], "asset 'minilm-l6' is a model, not a dataset"),
])
def test_small_usage_mistakes_exit_2_and_say_what_to_do(argv, message, capsys):
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and "None" not in err and err.count("\n") == 1


def test_regressions_found_by_the_fourth_probe(tmp_path, monkeypatch, capsys, model_dir):
    from edgekit import native, recipe as recipes

    capsys.readouterr()  # the fixture's own output
    monkeypatch.setattr(sys, "stdout", None)  # Python started with fd 1 closed (`>&-`): TFLite steps crashed
    with native.hidden_output():
        os.write(2, b"hidden\n")
    monkeypatch.undo()
    assert capsys.readouterr().err == ""
    student = str(testing.make_model_dir(tmp_path / "student", layers=2))
    with pytest.raises(EdgekitError, match="student_config shapes a student made from the teacher"):  # was: after
        recipes.load("distilbert-int8", [f"distill.student={student}", "distill.student_config={hidden_size: 16}"])
    import edgekit  # the public load passes max_length on (was a TypeError)
    assert edgekit.load(model_dir, max_length=8).encode(["good " * 50])["input_ids"].shape[1] == 8
    assert cli.main(["recipes", "edge-small"]) == 2 and "edgekit recipes show edge-small" in capsys.readouterr().err
    assert cli.main(["assets", "minilm-l6"]) == 2 and "edgekit assets fetch minilm-l6" in capsys.readouterr().err
    done = subprocess.run(f"{sys.executable} -m edgekit.cli recipes | head -1", shell=True, capture_output=True,
                          text=True)  # a fixed test command line, no user input in it
    assert done.stdout.startswith("distilbert-int8") and done.stderr == ""  # was "cannot read or write: Broken pipe"


def test_a_closed_stderr_keeps_the_exit_code_and_stdout_clean(tmp_path, monkeypatch):
    """`edgekit ... 2>&-` in a script: the error line has nowhere to go; it must not land in stdout (the output a
    script reads), and the exit code still says usage (2)."""
    done = subprocess.run([sys.executable, "-m", "edgekit.cli", "compress", "--recipe", "no-such-recipe"],
                          capture_output=True, text=True, cwd=tmp_path, preexec_fn=lambda: os.close(2))
    assert (done.returncode, done.stdout) == (2, "")  # was the error line on stdout

    class Closed:  # a stderr whose descriptor went away after Python started (a wrapper script closed it): was exit 1
        def write(self, text):
            raise OSError(9, "Bad file descriptor")

        flush = write
    monkeypatch.setattr(sys, "stderr", Closed())
    assert cli.main(["compress", "--recipe", "no-such-recipe"]) == 2
    assert cli.main(["-v", "compress", "--recipe", "no-such-recipe"]) == 2


def test_a_data_column_the_file_lacks_is_a_wrong_recipe_exit_2(csv_file, capsys):
    assert cli.main(["compress", "--dry-run", "--data", str(csv_file), "data.text_column=sentence"]) == 2  # was 1
    assert "has no column 'sentence'; columns: 'text', 'label'" in capsys.readouterr().err


def test_the_edgekit_command_ignores_ctrl_c_once_it_has_its_exit_code():
    """A Ctrl-C in the moment a finished compress ends landed in torch's exit hooks: a traceback with exit 0, or a
    process killed by SIGINT. In-process callers (cli.main(argv)) keep their handler."""
    code = ("import signal, sys; from edgekit import cli; sys.argv = ['edgekit', 'recipes', 'list']; rc = cli.main(); "
            "print(rc, signal.getsignal(signal.SIGINT) is signal.SIG_IGN); "
            "signal.signal(signal.SIGINT, signal.default_int_handler); cli.main(['recipes', 'list']); "
            "print(signal.getsignal(signal.SIGINT) is signal.default_int_handler)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    lines = done.stdout.splitlines()
    assert "0 True" in lines and lines[-1] == "True", done.stderr


def test_tables_printed_to_a_terminal_line_up_and_stay_markdown():
    text = "head\n| a | bb |\n|---|---:|\n| long cell | 1 |\n| x |  |\n\nafter"
    assert cli.aligned(text) == ("head\n| a         |  bb |\n| --------- | --: |\n| long cell |   1 |\n"
                                 "| x         |     |\n\nafter")  # was printed as built: columns of every width
    wide = cli.aligned("| text | n |\n|---|---:|\n| good 😀 film | 1 |\n| 日本語 | 22 |\n| cafe\u0301 a\\|b | 3 |")
    assert wide.splitlines()[2:] == ["| good 😀 film |   1 |", "| 日本語       |  22 |", "| cafe\u0301 a\\|b    |   3 |"]
    # wide characters take two columns and a combining accent none: the rows end where a terminal shows them


def test_assets_list_shows_what_the_cache_takes_and_what_may_go(tmp_path, monkeypatch, capsys):
    """Was: no sizes, and the augmentation sets and qemu roots (430 MB each) not listed at all."""
    monkeypatch.setenv("EDGEKIT_CACHE", str(tmp_path))
    (tmp_path / "augment").mkdir()
    (tmp_path / "augment" / "a.json").write_bytes(b"x" * 2_500_000)
    assert cli.main(["assets", "list"]) == 0
    out = capsys.readouterr().out
    assert [line.split()[:4] for line in out.splitlines() if line.startswith("augment")] == \
        [["augment", "made", "cached", "2.5"]]
    assert "qemu-arm64    made" in out and out.splitlines()[-1].startswith("total 2.5 MB; edgekit assets clean NAME")
    assert cli.main(["assets", "clean", "augment"]) == 0 and not (tmp_path / "augment").exists()
    assert f"removed augment from {tmp_path}: 2.5 MB freed" in capsys.readouterr().out
    assert cli.main(["assets", "clean", "nothing"]) == 2
    assert "assets clean needs a NAME from: minilm-l6" in capsys.readouterr().err


def test_progress_bars_in_a_log_are_whole_lines_every_30_s_and_a_terminal_keeps_its_own(monkeypatch, capsys):
    """The library's bars as the command's (edgekit.compress from a script redrew once a step); no carriage-return
    redraws in a log (a warning printed meanwhile landed on the bar's line), and the user's TQDM_* settings stay."""
    from tqdm import tqdm

    from edgekit import progress
    for name in ("TQDM_MININTERVAL", "TQDM_MAXINTERVAL"):
        monkeypatch.delenv(name, raising=False)
    bar = progress.bar(total=4, desc="distill")
    assert (bar.mininterval, bar.maxinterval) == (30, 30) and progress.LOG_S == 30  # tqdm's own: 0.1 s, ~27k
    bar.update(1)  # redraws in 45 minutes
    tqdm.write("edgekit: warning: something", file=sys.stderr)
    bar.update(3)
    bar.close()
    err = capsys.readouterr().err
    assert "\r" not in err and "edgekit: warning: something\n" in err.splitlines(keepends=True)
    assert err.splitlines()[-1].startswith("distill: 100%") and all(line.strip() for line in err.splitlines())
    monkeypatch.setenv("TQDM_MININTERVAL", "60")
    assert (progress.bar(total=1).mininterval, progress.bar(total=1).maxinterval) == (60, 60)
    mine = io.StringIO()  # a caller's own settings win in a log too (they were a TypeError there alone)
    inner = progress.bar(total=2, file=mine, mininterval=1, position=1, desc="inner")
    assert inner.mininterval == 1
    inner.update(2)
    inner.close()
    assert "\x1b" not in mine.getvalue() and mine.getvalue().splitlines()[-1].startswith("inner: 100%")
    monkeypatch.setitem(sys.modules, "ipykernel", type(sys)("ipykernel"))  # a notebook renders \r: redrawn live
    assert progress.bar(total=1, file=io.StringIO()).mininterval == 0.1
    monkeypatch.delitem(sys.modules, "ipykernel")
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True, raising=False)
    monkeypatch.delenv("TQDM_MININTERVAL")
    assert progress.bar(total=1, file=io.StringIO()).mininterval == 0.1  # a terminal redraws as before


def test_a_bar_in_a_log_draws_no_stale_line_when_it_slows_down(monkeypatch, capsys):
    """tqdm's monitor thread redrew a bar that had slowed down with its last count and rate (distill: 107/200 at
    00:03, again 107/200 at 00:07, then 120/200 at 00:07): two lines for one moment, the first of them stale."""
    import re
    import time

    from tqdm import tqdm

    from edgekit import progress
    monkeypatch.setenv("TQDM_MININTERVAL", "0.3")
    monkeypatch.delenv("TQDM_MAXINTERVAL", raising=False)
    if tqdm.monitor is not None:  # the running monitor wakes every 10 s: one that wakes every 0.05 s
        tqdm.monitor.exit()
    monkeypatch.setattr(tqdm, "monitor_interval", 0.05)
    try:
        for i in progress.bar(range(60), desc="x"):
            time.sleep(0.001 if i < 40 else 0.05)
    finally:
        if tqdm.monitor is not None:
            tqdm.monitor.exit()
    lines = capsys.readouterr().err.splitlines()[:-1]  # the closing line may repeat the last count
    counts = [re.search(r"(\d+)/60", line).group(1) for line in lines]
    assert len(counts) >= 3 and len(counts) == len(set(counts)), lines  # 0.3 s apart over 1 s and more


def test_the_stop_handler_raises_once_then_again_only_after_the_repeat_window():
    import signal

    errors.STOP.update(at=None, signal=None)
    try:
        with pytest.raises(errors.Terminated):  # it raises itself: a stop during export or hashing ends it there
            cli._stop(signal.SIGTERM, None)
        cli._stop(signal.SIGINT, None)  # within REPEAT_S: the same stop, whose cleanup goes on
        errors.STOP["at"] -= cli.REPEAT_S + 1
        with pytest.raises(KeyboardInterrupt) as raised:  # later: the user cuts a slow cleanup short
            cli._stop(signal.SIGINT, None)
        assert type(raised.value) is KeyboardInterrupt
    finally:
        errors.STOP.update(at=None, signal=None)


def test_a_stop_dropped_during_any_command_ends_it_and_is_cleared_after(monkeypatch, capsys):
    import signal

    def dropped(args):  # the handler's exception swallowed (a __del__): the command itself finished
        errors.STOP.update(at=1.0, signal=signal.SIGTERM)
        return 0
    monkeypatch.setattr(cli, "cmd_recipes", dropped)
    assert cli.main(["recipes"]) == 143 and capsys.readouterr().err.strip() == "edgekit: terminated"
    assert errors.STOP["at"] is None  # a library call after it in the same process is not stopped
    errors.stop_point()


def test_recipes_list_wraps_on_a_terminal_and_keeps_a_line_each_in_a_pipe(monkeypatch, capsys):
    from edgekit import recipe

    assert cli.main(["recipes"]) == 0
    piped = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in piped] == recipe.names()  # awk '{print $1}' gives the names
    assert all(not line.split(None, 1)[1].startswith(line.split()[0] + ":") for line in piped)  # "edge-base  edge-base:"
    monkeypatch.setattr(sys.stdout, "isatty", lambda: True, raising=False)
    monkeypatch.setattr("shutil.get_terminal_size", lambda *a: os.terminal_size((80, 24)))
    assert cli.main(["recipes"]) == 0
    shown = capsys.readouterr().out.splitlines()
    assert len(shown) > len(piped) and max(map(len, shown)) <= 80  # lines of ~350 characters
    assert [line.split()[0] for line in shown if not line.startswith(" ")] == recipe.names()
