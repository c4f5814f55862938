"""device_bench, the on-device runner: results on real tiny ONNX and TFLite exports, predictions equal to
edgekit's own runtime, no torch or edgekit imported, and one-line errors for bad input with no result left."""
import csv
import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from edgekit import data, devices, runtime
from edgekit.artifact import Artifact
from edgekit.pipeline import Context
from edgekit.stages import export

RUNNER = Path(__file__).resolve().parent.parent / "device_bench"


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    from edgekit import testing

    tmp = tmp_path_factory.mktemp("db")
    model_dir = testing.make_model_dir(tmp / "tiny")
    reviews = testing.make_csv(tmp / "reviews.csv", n=120)
    ctx = Context(data.load(str(reviews)), Artifact(model_dir, "hf"), 0, 32, False)
    onnx = export.run(Artifact(model_dir, "hf"), tmp / "onnx", ctx, check_sentences=8).path
    tflite = export.run(Artifact(model_dir, "hf"), tmp / "tfl", ctx, format="tflite", buckets=[16, 32],
                        check_sentences=8).path
    from edgekit.stages import quantize

    full = tmp / "tfl-int8"  # full-integer TFLite (INT8 activations and logits), as quantize writes for arm64
    shutil.copytree(tmp / "tfl", full)
    quantize.tflite_quantize(Path(tflite), full / "model.tflite", "static", [t for t, _ in ctx.splits.train[:40]],
                             json.loads((full / "model.json").read_text()))
    labelled = tmp / "test.csv"  # the model's own label names (LABEL_0/LABEL_1) for the tiny config
    names = json.loads((Path(onnx).parent / "model.json").read_text())["labels"]
    with open(labelled, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["text", "label"])
        w.writerows((t, names[y]) for t, y in ctx.splits.test + ctx.splits.validation)
    return {"onnx": Path(onnx), "tflite": Path(tflite), "tflite-int8": full / "model.tflite", "data": labelled}


def run_runner(args, cwd=None, python=sys.executable, extra=""):
    """The runner from a copy of its folder alone; asserts it imported neither torch nor edgekit."""
    code = (f"import sys; {extra}from device_bench import runner; rc = runner.main({args!r}); "
            "bad = [m for m in ('torch', 'edgekit', 'transformers') if m in sys.modules]; "
            "assert not bad, f'runner imported {bad}'; sys.exit(rc)")
    return subprocess.run([python, "-c", code], capture_output=True, text=True, cwd=cwd)


@pytest.fixture
def alone(tmp_path):
    shutil.copytree(RUNNER / "device_bench", tmp_path / "device_bench")
    return tmp_path


@pytest.mark.parametrize("fmt", ["onnx", "tflite", "tflite-int8"])
def test_runner_measures_and_predicts_like_edgekit(exported, alone, fmt):
    out = alone / "result.json"
    done = run_runner([str(exported[fmt]), "--data", str(exported["data"]), "--out", str(out), "--runs", "7",
                       "--warmup", "2", "--batch", "4"], cwd=alone)
    assert done.returncode == 0, done.stderr
    assert "INFO: " not in done.stderr  # LiteRT's "INFO: Created TensorFlow Lite XNNPACK delegate for CPU." each run
    assert json.loads(done.stdout)["written"] == str(out)  # said: --out's default was written without a word
    r = json.loads(out.read_text())
    assert r["complete"] is True and r["format"] == fmt.split("-")[0] and r["runs"] == 7
    assert r["latency_ms"]["p50"] <= r["latency_ms"]["p90"] <= r["latency_ms"]["p99"]
    assert set(r["throughput"]) == {"batch_1", "batch_4"} and all(v > 0 for v in r["throughput"].values())
    assert r["size_mb"] == pytest.approx(exported[fmt].stat().st_size / 1e6, abs=1e-3)
    assert r["model_sha256"] == hashlib.sha256(exported[fmt].read_bytes()).hexdigest()  # what edgekit checks on merge
    assert r["peak_rss_mb"] >= r["rss_after_load_mb"] > 0 and r["load_s"] > 0
    assert r["runtime"] == {"onnx": "onnxruntime"}.get(fmt, "ai-edge-litert") and r["runtime_version"] != "?"
    assert r["machine"] and r["cpu"] and r["threads"] == 1 and r["emulated"] is False
    assert r["int8_isa"] == devices.runner_module().int8_isa()  # this machine's, as cpuinfo reports it
    with open(exported["data"]) as f:
        rows = list(csv.DictReader(f))
    model = runtime.load(exported[fmt])
    expected = [model.labels.index(label) for label in model([row["text"] for row in rows])["labels"]]
    assert r["predictions"] == expected  # tokenized on the device the same way edgekit tokenizes
    gold = [model.labels.index(row["label"]) for row in rows]
    assert r["accuracy"] == round(sum(p == g for p, g in zip(expected, gold)) / len(gold), 4)
    assert r["examples"] == len(rows)


def sidecar_copy(src: Path, into: Path, change) -> Path:
    into.mkdir()
    for p in src.parent.iterdir():
        shutil.copy(p, into / p.name)
    meta = json.loads((into / "model.json").read_text())
    change(meta)
    (into / "model.json").write_text(json.dumps(meta))
    return into / src.name


@pytest.mark.parametrize("fmt, change, message", [
    ("onnx", lambda m: m.update(format="tflite"), "is a onnx file but model.json says tflite: the sidecar does not match"),
    ("tflite", lambda m: m.update(format="onnx"), "is a tflite file but model.json says onnx"),
    ("onnx", lambda m: m["inputs"][0].update(name="ids"), "lists inputs ['ids', 'attention_mask'] but model.onnx takes"),
    ("tflite", lambda m: m.update(signatures={"16": "seq16", "32": "seq99"}), "names signatures"),
    ("onnx", lambda m: m.update(labels=["a", "b", "c"]), "returns 2 scores but model.json lists 3 labels"),
    ("onnx", lambda m: m.update(tokenizer="vocab.json"), "names tokenizer 'vocab.json', which is not beside"),
    ("onnx", lambda m: m.pop("pad_id"), "lacks pad_id"),
    ("onnx", lambda m: m.update(onnxruntime={"disabled_optimizers": "SkipLayerNormFusion"}),
     "onnxruntime.disabled_optimizers is 'SkipLayerNormFusion'; give a list"),
    ("onnx", lambda m: m.update(quantization={"mode": "static"}, target="arm64", anything="new"), None),
])
def test_sidecar_that_does_not_match_is_one_line(exported, alone, tmp_path, fmt, change, message):
    model = sidecar_copy(exported[fmt], tmp_path / "m", change)
    out = alone / "result.json"
    done = run_runner([str(model), "--out", str(out), "--runs", "2", "--warmup", "0"], cwd=alone)
    if message is None:  # unknown keys are ignored
        assert done.returncode == 0, done.stderr
        return
    assert done.returncode == 1
    lines = [l for l in done.stderr.splitlines() if l.startswith("device_bench: error:")]
    assert len(lines) == 1 and message in lines[0], done.stderr
    assert not out.exists()


def test_unknown_labels_and_missing_runtime(exported, alone, tmp_path):
    bad = tmp_path / "bad.csv"
    bad.write_text("text,label\ngood film,great\nbad film,awful\n")
    out = alone / "result.json"
    done = run_runner([str(exported["onnx"]), "--data", str(bad), "--out", str(out), "--runs", "2"], cwd=alone)
    assert done.returncode == 1 and "does not know (awful, great; the first on line 2); the model's labels: neg, pos" \
        in done.stderr and not out.exists()
    done = run_runner([str(exported["onnx"]), "--out", str(out)], cwd=alone, extra="sys.modules['onnxruntime'] = None; ")
    assert done.returncode == 1 and "onnxruntime is not installed for" in done.stderr and "venv: true" in done.stderr
    assert not out.exists()
    done = run_runner([str(exported["tflite"]), "--out", str(out)], cwd=alone,
                      extra="sys.modules['ai_edge_litert'] = sys.modules['tflite_runtime'] = None; ")
    assert done.returncode == 1 and "ai-edge-litert is not installed" in done.stderr


def test_a_pair_column_for_a_single_text_model_is_refused_with_or_without_data(exported, alone):
    out = alone / "result.json"
    for given in ([], ["--data", str(exported["data"])]):
        done = run_runner([str(exported["onnx"]), "--text-pair-column", "hypothesis", "--out", str(out), *given],
                          cwd=alone)
        assert done.returncode == 2 and done.stderr.count("\n") == 1 and not out.exists()  # a wrong command line
        assert "--text-pair-column hypothesis given, but model.onnx reads single texts" in done.stderr


@pytest.mark.parametrize("flags, line", [
    (["--runs", "0"], "--runs 0: give a whole number >= 1"),
    (["--threads", "-1"], "--threads -1: give a whole number >= 0"),
    (["--seq-len", "1"], "--seq-len 1: give a whole number >= 2"),
    (["--runs", "abc"], "argument --runs: invalid int value: 'abc'"),
    (["--bogus"], "unrecognized arguments: --bogus"),
    (["--batch", "100000000"], "--batch 100000000: give a whole number from 1 to 4096"),  # np.repeat ran out of memory
])
def test_a_wrong_flag_is_one_line_naming_it(exported, alone, flags, line):
    done = subprocess.run([sys.executable, "-m", "device_bench", str(exported["onnx"]), *flags],
                          capture_output=True, text=True, cwd=alone)
    assert done.returncode == 2 and done.stderr == f"device_bench: error: {line}; see python -m device_bench --help\n"


def test_out_where_no_file_can_go_is_refused_before_the_benchmark_runs(exported, alone):
    for out, line in ((alone / "missing" / "r.json", f"folder {alone / 'missing'} does not exist; create it"),
                      (alone, f"--out {alone} is a folder; give the path of the result JSON file")):
        for model in (exported["onnx"], alone / "nothing.onnx"):  # found before the model is read
            done = run_runner([str(model), "--out", str(out), "--runs", "2", "--warmup", "0"], cwd=alone)
            assert done.returncode == 2 and done.stdout == "", done.stderr
            assert done.stderr.startswith("device_bench: error: --out ") and line in done.stderr
            assert done.stderr.count("\n") == 1, done.stderr
    assert sorted(p.name for p in alone.iterdir()) == ["device_bench"]


def test_a_result_that_cannot_be_written_is_one_line_and_leaves_nothing(tmp_path):
    runner = devices.runner_module()
    (tmp_path / "taken" / "x").mkdir(parents=True)  # a folder in the way: the rename onto it fails
    with pytest.raises(runner.BenchError, match="cannot write .*taken"):
        runner.write_result(tmp_path / "taken", {"complete": True})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["taken"]


def test_ctrl_c_while_the_result_is_written_leaves_no_temp_file(tmp_path, monkeypatch):
    runner = devices.runner_module()

    def interrupted(src, dst):
        raise KeyboardInterrupt
    monkeypatch.setattr(runner.os, "replace", interrupted)
    with pytest.raises(KeyboardInterrupt):
        runner.write_result(tmp_path / "result.json", {"complete": True})
    assert list(tmp_path.iterdir()) == []  # .result.json.PID.tmp stayed


def test_runner_command_line(exported, alone):
    done = subprocess.run([sys.executable, "-m", "device_bench", str(alone / "nothing.onnx")], capture_output=True,
                          text=True, cwd=alone)
    assert done.returncode == 1 and len(done.stderr.strip().splitlines()) == 1
    assert "cannot read nothing.onnx" in done.stderr.replace(str(alone) + "/", "")  # the file, not its model.json
    assert "model.json" not in done.stderr


def test_ctrl_c_is_one_line_and_leaves_the_earlier_result(exported, tmp_path, monkeypatch, capsys):
    runner = devices.runner_module()
    out = tmp_path / "result.json"
    out.write_text("{}")

    def interrupted(*args):
        raise KeyboardInterrupt

    monkeypatch.setattr(runner, "bench", interrupted)
    assert runner.main([str(exported["onnx"]), "--out", str(out)]) == 130
    err = capsys.readouterr().err
    assert err.startswith("device_bench: interrupted; no result written") and err.count("\n") == 1
    assert out.read_text() == "{}" and sorted(p.name for p in tmp_path.iterdir()) == ["result.json"]


def test_a_failed_run_says_the_result_at_out_is_an_earlier_runs(exported, alone, tmp_path):
    out = alone / "result.json"
    out.write_text('{"complete": true}')  # an earlier run's, same model: edgekit would merge it
    for args in ([str(alone / "nothing.onnx")], [str(exported["onnx"]), "--data", str(tmp_path / "no.csv")]):
        done = run_runner([*args, "--out", str(out), "--runs", "2", "--warmup", "0"], cwd=alone)
        assert done.returncode == 1 and done.stderr.count("\n") == 1, done.stderr
        assert done.stderr.rstrip().endswith(f"({out} is an earlier run's result, not this one's)"), done.stderr
    assert out.read_text() == '{"complete": true}'
    out.unlink()
    done = run_runner([str(alone / "nothing.onnx"), "--out", str(out)], cwd=alone)
    assert done.returncode == 1 and "earlier run" not in done.stderr and not out.exists()


def test_out_a_pipe_is_written_into_not_replaced(exported, tmp_path, monkeypatch, capsys):
    import os
    import stat
    import threading

    runner = devices.runner_module()
    fifo = tmp_path / "pipe"  # as --out /dev/stdout is: the rename replaced /dev/stdout itself, for root
    os.mkfifo(fifo)
    got = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_text()), daemon=True)
    reader.start()
    monkeypatch.setattr(runner.os, "access", lambda path, mode: Path(path) == fifo)  # /dev, not writable: no matter
    assert runner.main([str(exported["onnx"]), "--out", str(fifo), "--runs", "2", "--warmup", "0"]) == 0
    reader.join(30)
    assert json.loads(got[0])["complete"] is True and stat.S_ISFIFO(fifo.stat().st_mode)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pipe"]  # no temp file beside it
    monkeypatch.setattr(runner.os, "access", lambda path, mode: False)
    with pytest.raises(SystemExit):
        runner.main([str(exported["onnx"]), "--out", str(fifo)])
    assert f"--out {fifo} cannot be written by this user" in capsys.readouterr().err


def test_out_dev_stdout_is_the_result_alone_and_a_link_under_dev_or_proc_is_written_into(exported, alone, tmp_path):
    """The closing line followed the result on stdout (not JSON any more); `--out /dev/stdout > result.json` took
    the rename (/dev/stdout links to a regular file then): refused for a user (/dev is not writable), and for root
    the rename replaced /dev/stdout itself."""
    import os

    done = run_runner([str(exported["onnx"]), "--out", "/dev/stdout", "--runs", "2", "--warmup", "0"], cwd=alone)
    assert done.returncode == 0 and json.loads(done.stdout)["complete"] is True, done.stderr
    assert json.loads(done.stderr.splitlines()[-1])["written"] == "/dev/stdout"
    runner = devices.runner_module()
    (tmp_path / "w").mkdir()
    target = tmp_path / "w" / "result.json"
    fd = os.open(target, os.O_WRONLY | os.O_CREAT)  # /proc/self/fd/N: a link to a regular file, as /dev/stdout is
    try:
        out = Path(f"/proc/self/fd/{fd}")
        assert runner.written_into(out) and runner.written_into(Path("/dev/stdout")) and runner.earlier(out) == ""
        os.write(fd, b"before\n")  # what the shell's redirect already holds stays (opened for writing, it went)
        runner.write_result(out, {"complete": True})
    finally:
        os.close(fd)
    before, result = target.read_text().split("\n", 1)
    assert before == "before" and json.loads(result) == {"complete": True} and \
        [p.name for p in target.parent.iterdir()] == [target.name]
    target.write_text("")
    (tmp_path / "link.json").symlink_to(target)  # a user's link: the file it points to is replaced, the link stays
    runner.write_result(tmp_path / "link.json", {"complete": False})
    assert (tmp_path / "link.json").is_symlink() and json.loads(target.read_text()) == {"complete": False}


def python_of(version: str):
    """An interpreter of this Python version on PATH or under pyenv (whose shims exist and fail for other versions)."""
    found = [shutil.which(f"python{version}")] + sorted(Path.home().glob(f".pyenv/versions/{version}.*/bin/python"))
    for python in filter(None, found):
        done = subprocess.run([str(python), "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                              capture_output=True, text=True)
        if done.returncode == 0 and done.stdout.strip() == version:
            return str(python)
    return None


@pytest.mark.slow
@pytest.mark.parametrize("version", ["3.9", "3.10"])
def test_the_runner_installs_and_runs_on_the_oldest_pythons_it_declares(exported, tmp_path, version):
    """pyproject says requires-python >= 3.9: pip install of the runner's folder there (numpy, tokenizers and both
    runtimes from the package index, about 30 s), then each format measured and predicted as edgekit predicts."""
    python = python_of(version)
    if python is None:
        pytest.skip(f"no Python {version} on PATH or under pyenv")
    shutil.copytree(RUNNER, tmp_path / "src", ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    subprocess.run([python, "-m", "venv", str(tmp_path / "venv")], check=True)
    venv = str(tmp_path / "venv" / "bin" / "python")
    pip = subprocess.run([venv, "-m", "pip", "install", "-q", f"{tmp_path / 'src'}[onnx,tflite]"], capture_output=True,
                         text=True, timeout=900)
    assert pip.returncode == 0, pip.stderr[-2000:]
    with open(exported["data"]) as f:
        texts = [row["text"] for row in csv.DictReader(f)]
    for fmt in ("onnx", "tflite", "tflite-int8"):
        out = tmp_path / f"{fmt}.json"
        done = run_runner([str(exported[fmt]), "--data", str(exported["data"]), "--out", str(out), "--runs", "3",
                           "--warmup", "1", "--batch", "2"], cwd=tmp_path, python=venv)  # the installed package
        assert done.returncode == 0 and done.stderr == "", done.stderr
        r = json.loads(out.read_text())
        assert r["python"].startswith(version + ".") and r["complete"] is True
        model = runtime.load(exported[fmt])
        assert r["predictions"] == [model.labels.index(label) for label in model(texts)["labels"]]


def test_a_header_without_the_columns_says_what_it_has(tmp_path):
    runner = devices.runner_module()
    (tmp_path / "t.csv").write_text("sentence,polarity\ngood,pos\n")
    with pytest.raises(runner.BenchError, match="needs a header with columns text, label and at least one row; it has "
                                                "sentence, polarity; --text-column and --label-column name others"):
        runner.read_labelled(tmp_path / "t.csv", ["neg", "pos"], "text", "label")


@pytest.mark.parametrize("cpuinfo, expected", [
    ("flags\t\t: fpu sse2 avx2 fma avx512f avx512bw avx512_vnni amx_int8\n", "AMX-INT8"),
    ("flags\t\t: fpu sse2 avx2 fma avx512f avx512bw avx512_vnni\n", "AVX512-VNNI"),
    ("flags\t\t: fpu sse2 avx2 fma avx_vnni\n", "AVX-VNNI"),
    ("flags\t\t: fpu sse2 avx2 fma avx512f avx512bw\n", "AVX-512 without VNNI"),
    ("model name\t: AMD EPYC\nflags\t\t: fpu sse2 avx2 fma\n", "AVX2 without VNNI"),
    ("Features\t: fp asimd evtstrm crc32 cpuid\nCPU part\t: 0xd08\n", "Arm NEON without dot product"),
    ("Features\t: fp asimd aes crc32 atomics asimdrdm lrcpc dcpop asimddp\n", "Arm dot product"),
    ("Features\t: fp asimd asimddp sve i8mm bf16\n", "Arm I8MM"),
    ("processor\t: 0\n", ""),
])
def test_int8_isa_names_the_best_int8_instructions_the_cpu_reports(cpuinfo, expected):
    assert devices.runner_module().int8_isa(cpuinfo) == expected


def test_labelled_csv_with_a_byte_order_mark_reads(tmp_path):
    runner = devices.runner_module()
    path = tmp_path / "excel.csv"
    path.write_bytes("\ufefftext,label\ngood film,pos\nbad film,neg\n".encode("utf-8"))
    assert runner.read_labelled(path, ["neg", "pos"], "text", "label") == (["good film", "bad film"], [1, 0])


def test_labelled_csv_labels_are_read_as_edgekit_compress_reads_them(tmp_path):
    runner = devices.runner_module()
    path = tmp_path / "test.csv"  # was: "labels the model does not know (pos )", the space unseen
    path.write_text("text,label\ngood film,pos \nbad film, ne\u0301g\n", encoding="utf-8")
    assert runner.read_labelled(path, ["n\u00e9g", "pos"], "text", "label") == (["good film", "bad film"], [1, 0])


def test_the_runner_reads_tsv_and_jsonl_as_compress_does(tmp_path):
    """--data took CSV only: a TSV or JSONL file (which compress reads) failed with 'needs a header with columns
    text, label' though they were there; a plain TSV's quotes are text there as in compress."""
    sys.path.insert(0, str(Path(__file__).parents[1] / "device_bench"))
    try:
        from device_bench import runner
    finally:
        sys.path.pop(0)
    rows = [('"Best film ever, 5" stars', "pos"), ("a plain one", "neg"), ('"He said ""hi"""', "pos"),
            ("nan", "neg"), ("a film", "nan")]  # a text "nan" is one (the device left it out); a label nan is not
    (tmp_path / "d.tsv").write_text("text\tlabel\n" + "".join(f"{t}\t{y}\n" for t, y in rows))
    (tmp_path / "d.jsonl").write_text("".join(json.dumps({"text": t, "label": y}) + "\n" for t, y in rows))
    read = {}
    for name in ("d.tsv", "d.jsonl"):
        compress = data._read_file(tmp_path / name, "text", "label", "")[0]
        read[name], ids = runner.read_labelled(tmp_path / name, ["neg", "pos"], "text", "label")
        assert read[name] == [t for t, _, _ in compress] and ids == [1, 0, 1, 0], name
    assert read["d.tsv"] == ['"Best film ever, 5" stars', "a plain one", 'He said "hi"', "nan"]  # quoting undone
    assert read["d.jsonl"] == [t for t, _ in rows[:-1]]


def test_every_labelled_row_is_read_as_compress_reads_it_and_checked_before_anything_is_timed(tmp_path, exported,
                                                                                              monkeypatch):
    runner = devices.runner_module()
    labels = ["false", "true"]
    (tmp_path / "d.jsonl").write_text('{"text": "good film", "label": true}\n{"text": "", "label": false}\n'
                                      '{"text": "nope", "label": null}\n{"text": "bad film", "label": false}\n')
    compress = [(t, y) for t, y, _ in data._read_file(tmp_path / "d.jsonl", "text", "label", "")[0]]
    assert runner.read_labelled(tmp_path / "d.jsonl", labels, "text", "label") == (["good film", "bad film"], [1, 0])
    assert compress == [("good film", "true"), ("bad film", "false")]  # JSON's true was read as True and refused
    for body, line in (('{"text": "a", "label": 0}\n{"text": "half \\ud800 an emoji", "label": 1}\n',
                        "line 2 holds half a character"),  # a TypeError traceback after the whole benchmark
                       ('{"text": "a", "label": 0}\n{"label": 1, "text": ["a", "b"]}\n', "line 2 gives a list"),
                       ('{"text": "a", "label": 0}\n{"text": "b", "label": 1\n', "line 2 is not JSON"),  # said 1
                       ("text,label\na,0\nb,2\n", "line 3 has label 2, outside 0..1"),
                       ("label,text\n0,a\n1\n", "line 3 has 1 field, the header has 2"),  # text None: TypeError
                       ("text,label\na,0\nb,1,extra\n", "line 3 has 3 fields, the header has 2")):
        path = tmp_path / ("bad.jsonl" if body.startswith("{") else "bad.csv")
        path.write_text(body)
        with pytest.raises(runner.BenchError, match=line):
            runner.read_labelled(path, labels, "text", "label")
    monkeypatch.setattr(runner, "timed", lambda *a: pytest.fail("timed before the data was read"))
    args = runner.parser().parse_args([str(exported["onnx"]), "--data", str(tmp_path / "bad.csv")])
    with pytest.raises(runner.BenchError, match="line 3 has 3 fields"):
        runner.bench(exported["onnx"], runner.read_sidecar(exported["onnx"]), args)


def test_an_export_folder_runs_its_model_and_tflite_says_which_bucket_ran(exported, alone):
    out = alone / "r.json"
    done = run_runner([str(exported["tflite"].parent), "--out", str(out), "--runs", "2", "--warmup", "0",
                       "--seq-len", "20"], cwd=alone)  # a folder said '.../model.json not found' one level up
    assert done.returncode == 0, done.stderr
    result = json.loads(out.read_text())
    assert (result["model"], result["seq_len"], result["bucket"]) == ("model.tflite", 20, 32)  # buckets 16, 32
    (alone / "two").mkdir()
    for name in ("a.onnx", "b.onnx"):
        (alone / "two" / name).write_bytes(b"x")
    done = run_runner([str(alone / "two"), "--out", str(out)], cwd=alone)
    assert done.returncode == 1 and "is a folder holding 2 model files (a.onnx, b.onnx); give the .onnx" in done.stderr


def test_native_info_lines_are_dropped_and_anything_else_is_passed_on(capfd):
    import os

    runner = devices.runner_module()
    with runner.native_info_dropped():
        os.write(2, b"INFO: Created TensorFlow Lite XNNPACK delegate for CPU.\nERROR: a real problem\n")
        print("from python", file=sys.stderr)
    with pytest.raises(RuntimeError), runner.native_info_dropped():  # what a failed invoke wrote stays readable
        os.write(2, b"INFO: x\nwhy it failed\n")
        raise RuntimeError
    err = capfd.readouterr().err  # (pytest's sys.stderr is not fd 2: its line may come first)
    assert sorted(err.splitlines()) == ["ERROR: a real problem", "from python", "why it failed"]
    os.environ["DEVICE_BENCH_NATIVE_LOG"] = "1"  # everything, as written (a crash inside lost the runtime's words)
    try:
        with runner.native_info_dropped():
            os.write(2, b"INFO: kept\n")
    finally:
        del os.environ["DEVICE_BENCH_NATIVE_LOG"]
    assert capfd.readouterr().err == "INFO: kept\n"


@pytest.mark.parametrize("keep", [False, True])
def test_a_crash_in_the_runtime_s_first_call_is_reported_on_the_real_stderr(tmp_path, keep):
    """A native crash while the runtime's output is kept apart: Python's fatal error and traceback reach the real
    stderr (they went into the log that died with the process: nothing was said); --native-log shows the runtime's
    own words as well."""
    script = tmp_path / "crash.py"
    script.write_text(f"import ctypes, os\nfrom edgekit import devices\nrunner = devices.runner_module()\n"
                      f"with runner.native_info_dropped({keep}):\n    os.write(2, b'ERROR: op 12 failed\\n')\n"
                      f"    ctypes.string_at(0)\n")
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True)
    assert done.returncode == -11 and "Fatal Python error: Segmentation fault" in done.stderr, done.stderr
    assert ("ERROR: op 12 failed" in done.stderr) == keep


def test_runner_percentiles_time_units_and_memory_are_exact(monkeypatch):
    """The device's p90/p99 equal to its p50, latencies in µs and kB / 1000 as MiB all passed the suite (it checked
    p50 <= p90 <= p99 and signs only)."""
    runner = devices.runner_module()
    assert runner.percentiles(list(range(1, 101))) == {"p50": 50.5, "p90": 90.1, "p99": 99.01}
    clock = iter(i * 0.002 for i in range(100))  # each call of fn takes 2 ms
    monkeypatch.setattr(runner.time, "perf_counter", lambda: next(clock))
    assert runner.timed(lambda: None, 3, 1) == pytest.approx([2.0] * 3)
    monkeypatch.setattr(runner, "Path", lambda p: type("F", (), {"read_text": lambda self: "VmRSS:\t   20480 kB\n"})())
    assert runner.memory_mb("VmRSS") == 20.0  # kB / 1000 read 20.5


def test_runner_throughput_counts_sentences_per_second_at_batch_1_and_n(exported, monkeypatch):
    runner = devices.runner_module()
    calls = []

    def fixed(fn, runs, warmup):  # batch 1 (warmup 0 here): 2 ms a call; batch 4 (warmup 1): 8 ms a call
        calls.append(fn())
        return [2.0 if warmup == 0 else 8.0] * runs

    monkeypatch.setattr(runner, "timed", fixed)
    model = exported["onnx"]
    args = runner.parser().parse_args([str(model), "--runs", "5", "--warmup", "0", "--batch", "4", "--threads", "2"])
    result = runner.bench(model, runner.read_sidecar(model), args)
    assert result["throughput"] == {"batch_1": 500.0, "batch_4": 500.0}  # 4 sentences in 8 ms: 500 a second
    assert [len(c) for c in calls] == [1, 4] and result["latency_ms"]["p50"] == 2.0


def test_the_onnx_runner_runs_on_the_threads_it_reports(exported, monkeypatch):
    import onnxruntime

    runner = devices.runner_module()
    seen = {}
    real = onnxruntime.InferenceSession

    def session(path, options=None, **kw):
        seen.update(intra=options.intra_op_num_threads, inter=options.inter_op_num_threads)
        return real(path, options, **kw)

    monkeypatch.setattr(onnxruntime, "InferenceSession", session)
    model = exported["onnx"]
    runner.OnnxRunner(model, runner.read_sidecar(model), 3)
    assert seen == {"intra": 3, "inter": 1}  # was every core, while the result said threads: 3


def test_tflite_runner_picks_the_smallest_bucket_that_holds_the_row(exported, alone):
    """A row exactly as long as a bucket ran in the next one (slower, and not the signature edgekit runs)."""
    import numpy as np

    runner = devices.runner_module()
    model = exported["tflite"]
    tfl = runner.TFLiteRunner(model, runner.read_sidecar(model), 1)
    used = []
    for b, run in list(tfl.runners.items()):
        tfl.runners[b] = lambda b=b, run=run, **inputs: (used.append(b), run(**inputs))[1]
    for n in (16, 17, 32, 40):
        tfl.logits(np.ones((1, n), np.int64), np.ones((1, n), np.int64))
    assert tfl.buckets == [16, 32] and used == [16, 32, 32, 32]  # 40 tokens: cut to the largest bucket
    out = alone / "result.json"
    done = run_runner([str(model), "--out", str(out), "--runs", "2", "--warmup", "0", "--seq-len", "16"], cwd=alone)
    assert done.returncode == 0, done.stderr
    assert json.loads(out.read_text())["bucket"] == 16  # the result named 32 for 16 tokens
