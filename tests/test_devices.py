"""edgekit bench: targets YAML, the local target end to end, ssh against a real sshd started here on 127.0.0.1
with a throwaway key, adb command construction and a recorded benchmark_model log (no Android device here), and
qemu-arm64 (slow) running ONNX and TFLite INT8 artifacts on arm64 builds of the runtimes."""
import csv
import getpass
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from edgekit import cli, devices, pipeline, recipe, testing
from edgekit.errors import EdgekitError, UsageError

DATA = Path(__file__).parent / "data"


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A finished tiny run (export to ONNX, evaluate): the final model, its accuracy and the teacher's."""
    tmp = tmp_path_factory.mktemp("devices")
    model_dir = testing.make_model_dir(tmp / "tiny")
    reviews = testing.make_csv(tmp / "reviews.csv")
    path = tmp / "tiny.yaml"
    path.write_text(testing.tiny_recipe(model_dir, reviews, stages=("export", "evaluate")))
    pipeline.run(recipe.load(str(path)), tmp / "run", progress=False)
    return tmp / "run"


def targets_file(tmp_path, targets: dict) -> Path:
    path = tmp_path / "targets.yaml"
    path.write_text(yaml.safe_dump({"devices": targets}))
    return path


def manifest(run):
    return json.loads((run / "manifest.json").read_text())


def test_local_target_merges_result_and_checks_budgets(run, tmp_path, capsys):
    budgets = {"size_mb": "<= 100", "accuracy_retained": ">= 0.5", "latency_ms_p90": "<= 60000"}
    file = targets_file(tmp_path, {"here": {"kind": "local", "runs": 5, "warmup": 1, "budgets": budgets}})
    assert cli.main(["bench", str(run), "--target", "here", "--targets", str(file), "--quiet"]) == 0
    entry = manifest(run)["devices"]["here"]
    final = manifest(run)["final"]["metrics"]
    assert entry["complete"] is True and entry["kind"] == "local" and entry["emulated"] is False
    assert entry["metrics"]["accuracy"] == pytest.approx(final["accuracy"], abs=1e-4)  # same split, same tokens
    assert entry["metrics"]["accuracy_retained"] == pytest.approx(final["accuracy"] / final["teacher_accuracy"], abs=1e-3)
    assert sorted(b["metric"] for b in entry["budgets"]) == sorted(budgets) and all(b["ok"] for b in entry["budgets"])
    assert entry["result"]["examples"] == manifest(run)["data"]["sizes"]["test"]
    assert len(entry["predictions"]) == entry["result"]["examples"]
    shown = capsys.readouterr().out
    assert "target here (local)" in shown
    assert f"throughput {entry['result']['throughput']['batch_1']:g}/s at batch 1, " in shown  # was a raw dict
    isa = devices.runner_module().int8_isa()
    assert entry["result"]["int8_isa"] == isa and (not isa or f"({isa})," in shown)  # the CPU's INT8 instructions
    over = targets_file(tmp_path, {"here": {"kind": "local", "runs": 3, "budgets": {"peak_rss_mb": "<= 1"}}})
    assert cli.main(["bench", str(run), "--target", "here", "--targets", str(over), "--quiet"]) == 3
    rows = manifest(run)["devices"]["here"]["budgets"]
    assert rows[0]["metric"] == "peak_rss_mb" and rows[0]["ok"] is False and rows[0]["actual"] > 1
    assert "OVER" in capsys.readouterr().out


def test_compress_benches_the_targets_marked_after_compress(tmp_path, capsys):
    model_dir = testing.make_model_dir(tmp_path / "tiny")
    reviews = testing.make_csv(tmp_path / "reviews.csv")
    path = tmp_path / "tiny.yaml"
    text = testing.tiny_recipe(model_dir, reviews, stages=("export", "evaluate"))
    path.write_text(text + "devices:\n  here: {kind: local, runs: 3, warmup: 1, after_compress: true, "
                    "budgets: {peak_rss_mb: '<= 1'}}\n  elsewhere: {kind: local}\n")
    code = cli.main(["compress", "--recipe", str(path), "--out", str(tmp_path / "run"), "--quiet"])
    assert code == 3  # the pipeline's budgets hold; the device's RSS budget cannot
    devices_run = manifest(tmp_path / "run")["devices"]
    assert set(devices_run) == {"here"} and devices_run["here"]["complete"] is True
    assert "target here (local)" in capsys.readouterr().out


def test_a_failed_run_is_recorded_as_incomplete(run, tmp_path, capsys):
    bad = tmp_path / "bad"
    shutil.copytree(run / "01-export", bad)
    meta = json.loads((bad / "model.json").read_text())
    (bad / "model.json").write_text(json.dumps(dict(meta, labels=["a", "b", "c"])))
    assert cli.main(["bench", str(run), "--target", "local", "--model", str(bad / "model.onnx"), "--quiet"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "target local: the model returns 2 scores but model.json lists 3 labels" in err[0]
    entry = manifest(run)["devices"]["local"]
    assert entry["complete"] is False and "3 labels" in entry["error"] and "metrics" not in entry


@pytest.mark.parametrize("spec, message", [
    ({"kind": "phone"}, "kind must be one of local, ssh, adb, qemu-arm64"),
    ({"kind": "ssh"}, "missing key 'host'"),
    ({"kind": "ssh", "host": "-oProxyCommand=touch /tmp/x"}, "may hold only letters"),
    ({"kind": "ssh", "host": "pi", "user": "pi; rm -rf /"}, "may hold only letters"),
    ({"kind": "adb", "serial": "R58", "port": 5}, "unknown key 'port'; accepted for adb"),
    ({"kind": "local", "runs": "many"}, "runs must be int"),
    ({"kind": "local", "budgets": {"speed": "<= 3"}}, "budget on metric 'speed', which a device does not measure"),
    ({"kind": "local", "budgets": {"max_abs_diff": "<= 3"}}, "'max_abs_diff', which a device does not measure"),  # was
    ({"kind": "local", "budgets": {"params": "<= 3"}},
     "metrics: size_mb, accuracy, accuracy_retained, f1_micro, f1_micro_retained, latency"),  # OVER
    ({"kind": "local", "budgets": {"size_mb": "small"}}, "must be an operator and a number"),
    ({"kind": "qemu-arm64", "cpu": "max"}, "cpu 'max'; emulated CPUs: cortex-a72"),
    ({"kind": "local", "runs": -1}, "target t: runs must be >= 1, got -1"),  # was exit 1 naming --runs, a runner flag
    ({"kind": "local", "batch": 0}, "target t: batch must be >= 1"),
    ({"kind": "local", "threads": 0}, "target t: threads must be >= 1"),  # printed "0 thread(s)"
    ({"kind": "local", "budgets": {"accuracy_retained": ">= 97"}}, "accuracy_retained 97 is not a fraction"),
    ({"kind": "ssh", "host": "pi", "workdir": ""}, "workdir '' must be an absolute path"),  # was rm -rf /job
    ({"kind": "ssh", "host": "pi", "workdir": "~/bench"}, "use an absolute path such as /home/pi/edgekit-bench"),
    ({"kind": "adb", "serial": "R58", "workdir": "bench"}, "workdir 'bench' must be an absolute path"),
    ({"kind": "ssh", "host": "pi\n"}, "host 'pi.n' may hold only letters"),  # `$` matched before the newline
    ({"kind": "ssh", "host": "pi", "user": "pi\n"}, "user 'pi.n' may hold only letters"),
    ({"kind": "adb", "serial": "R58\n"}, "serial 'R58.n' may hold only letters"),
    ({"kind": "qemu-arm64", "release": "../x"}, "target t: release '../x' must be a Debian suite name"),  # was a root
    ({"kind": "qemu-arm64", "release": "--no-check-gpg"}, "use one such as bookworm"),  # outside the cache; an option
    ({"kind": "qemu-arm64", "release": "bookworm\n"}, "release 'bookworm.n' must be a Debian suite name"),
    ({"kind": "qemu-arm64", "mirror": "--no-check-gpg"}, "mirror '--no-check-gpg' must be an http://, https://"),
    ({"kind": "qemu-arm64", "mirror": "ftp://deb.debian.org/debian"}, "use one such as http://deb.debian.org/debian"),
    ({"kind": "manual", "after_compress": True}, "after_compress needs a target edgekit reaches itself"),
    ({"kind": "manual", "host": "pi"}, "unknown key 'host'; accepted for manual"),
    ({"kind": "ssh", "host": "pi", "usr": "pi"}, "unknown key 'usr' .did you mean user.*; accepted for ssh"),
])
def test_targets_are_validated(tmp_path, spec, message):
    with pytest.raises(UsageError, match=message.replace("(", r"\(")):
        devices.load_targets({}, targets_file(tmp_path, {"t": spec}))


def test_target_names_and_files(run, tmp_path, capsys):
    assert cli.main(["bench", str(run), "--target", "pi9", "--quiet"]) == 2
    assert "unknown target 'pi9'; targets: local, manual, qemu-arm64" in capsys.readouterr().err
    (tmp_path / "t.yaml").write_text("devices: [1, 2")
    with pytest.raises(UsageError, match="is not valid YAML"):
        devices.load_targets({}, tmp_path / "t.yaml")
    with pytest.raises(UsageError, match="cannot read targets file"):
        devices.load_targets({}, tmp_path / "none.yaml")
    # the recipe's `devices` and a file's plain mapping both work; the recipe's `targets` list is not ours
    found = devices.load_targets({"targets": ["x86"], "devices": {"a": {"kind": "local"}}},
                                 targets_file(tmp_path, {"b": {"kind": "qemu-arm64"}}))
    assert set(found) == {"a", "b"}
    with pytest.raises(UsageError, match="not an .onnx or .tflite file, which device_bench runs; give --model "
                                         "an exported file in the run"):
        devices.model_file(run, manifest(run), str(run / "02-evaluate"))
    outputs = {"x86-onnx": {"path": "01-export/model.onnx"}, "x86-torchscript": {"path": "01-export/model.pt"}}
    with pytest.raises(UsageError, match="give --model one of x86-onnx$"):  # said: add export to the recipe
        devices.model_file(run, {"final": {"path": "01-export", "outputs": outputs}}, "nope")
    here = Path.cwd()
    try:  # a path typed from the current folder, not from the run (was looked for at RUN/RUN/...)
        os.chdir(run.parent)
        chosen = devices.model_file(run, manifest(run), f"{run.name}/01-export/model.onnx")
        assert chosen == run / "01-export" / "model.onnx"
    finally:
        os.chdir(here)


# ---------------------------------------------------------------- manual: a device edgekit cannot reach

def test_a_manual_target_is_staged_run_by_hand_and_merged(run, tmp_path, capsys):
    import shlex

    file = targets_file(tmp_path, {"phone": {"kind": "manual", "runs": 3, "warmup": 1,
                                             "budgets": {"latency_ms_p90": "<= 0.000001"}}})
    base = ["bench", str(run), "--target", "phone", "--targets", str(file), "--quiet"]
    assert cli.main(base) == 2  # nothing to run here
    assert "target phone is run by hand" in capsys.readouterr().err
    job = tmp_path / "job"
    assert cli.main(base + ["--stage", str(job)]) == 0
    told = json.loads((job / "job.json").read_text())
    model = run / told["model"]
    assert told["model_sha256"] == devices.assets.sha256_file(model) and told["examples"] == 25
    printed = capsys.readouterr().out
    assert "--runs 3 --warmup 1" in told["command"] and told["command"] in printed and told["merge"] in printed
    max_length = json.loads((model.parent / "model.json").read_text())["max_length"]
    assert max_length < 128 and told["command"].endswith(f"--seq-len {max_length}")  # was 128, which the runner caps
    assert sorted(p.name for p in job.iterdir()) == ["device_bench", "job.json", "model", "test.csv"]
    assert (job / told["needs"].split("-r ")[1].rstrip(")")).is_file()  # the requirements it names are in the job
    assert (job.stat().st_mode & 0o077) == (0o777 & ~current_umask() & 0o077)  # not mkdtemp's 0700
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".job")]  # the temp folder became the job
    done = subprocess.run([sys.executable, *shlex.split(told["command"])[1:]], cwd=job, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    merge = shlex.split(told["merge"])  # as printed: the targets file it was staged with, the result
    assert merge[:2] == ["edgekit", "bench"] and merge[merge.index("--targets") + 1] == str(file.resolve())
    here = Path.cwd()
    try:
        os.chdir(job)
        assert cli.main(merge[1:] + ["--quiet"]) == 3  # merged, and over the target's budget
    finally:
        os.chdir(here)
    entry = manifest(run)["devices"]["phone"]
    assert entry["kind"] == "manual" and entry["complete"] and entry["model"] == told["model"]
    assert entry["metrics"]["accuracy_retained"] is not None and len(entry["predictions"]) == 25
    assert entry["budgets"][0]["metric"] == "latency_ms_p90" and not entry["budgets"][0]["ok"]
    # a result for other bytes under the same name (an older export, another run) is refused, nothing merged
    other = json.loads((job / "result.json").read_text())
    other["model_sha256"] = "0" * 64
    (tmp_path / "other.json").write_text(json.dumps(other))
    assert cli.main(base + ["--result", str(tmp_path / "other.json")]) == 1
    assert "the result is for another model.onnx than the run holds" in capsys.readouterr().err
    assert manifest(run)["devices"]["phone"] == entry
    other.pop("model_sha256")  # an older runner's: which bytes it measured is unknown
    (tmp_path / "other.json").write_text(json.dumps(other))
    assert cli.main(base + ["--result", str(tmp_path / "other.json")]) == 1
    assert "the result has no model_sha256" in capsys.readouterr().err
    (tmp_path / "cut.json").write_text(json.dumps(other)[:40])
    assert cli.main(base + ["--result", str(tmp_path / "cut.json")]) == 2
    assert "cut.json is not JSON" in capsys.readouterr().err
    assert cli.main(base + ["--stage", str(job)]) == 2  # a job is never written over
    assert "exists and is not an empty folder" in capsys.readouterr().err


def current_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_a_job_staged_with_another_model_is_merged_with_the_same_model(run, tmp_path, capsys):
    import shlex

    job = tmp_path / "job"
    assert cli.main(["bench", str(run), "--target", "manual", "--model", "01-export/model.onnx", "--stage", str(job)]) == 0
    told = json.loads((job / "job.json").read_text())
    assert shlex.split(told["merge"])[-4:] == ["--model", "01-export/model.onnx", "--result", "result.json"]
    result = {"model": "model.tflite", "format": "tflite", "model_sha256": told["model_sha256"], "complete": True,
              "latency_ms": {"p50": 1.0, "p90": 1.0, "p99": 1.0}}
    (job / "result.json").write_text(json.dumps(result))  # a result for another file than --model chooses
    assert cli.main(["bench", str(run), "--target", "manual", "--result", str(job / "result.json")]) == 1
    assert "give --result the same --model the job was staged with" in capsys.readouterr().err
    for bad, said in (("", "give the name of a new folder"), (str(run / "manifest.json" / "job"), "is not a folder")):
        assert cli.main(["bench", str(run), "--target", "manual", "--stage", bad or "."]) == 2
        assert said in capsys.readouterr().err


def test_a_stage_waits_for_a_compress_writing_the_run(run, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(devices, "MERGE_WAIT_S", 0)
    held = pipeline.lock(run)  # a compress replacing the model while it would be copied
    try:
        assert cli.main(["bench", str(run), "--target", "manual", "--stage", str(tmp_path / "job")]) == 1
    finally:
        held.close()
    assert "is writing to" in capsys.readouterr().err and list(tmp_path.iterdir()) == []


def test_a_stage_that_fails_leaves_no_folder(run, tmp_path, monkeypatch):
    def broken(*args, **kw):
        raise EdgekitError("disk full")

    monkeypatch.setattr(devices, "stage_job", broken)
    with pytest.raises(EdgekitError, match="disk full"):
        devices.stage(run, "manual", tmp_path / "job")
    assert list(tmp_path.iterdir()) == []


# ---------------------------------------------------------------- ssh against a real sshd

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def sshd(tmp_path_factory):
    binary = shutil.which("sshd") or "/usr/sbin/sshd"
    if not Path(binary).is_file() or not shutil.which("ssh-keygen") or not shutil.which("ssh"):
        pytest.skip("no sshd/ssh here: apt-get install openssh-server openssh-client (.ci/run does)")
    tmp = tmp_path_factory.mktemp("sshd")
    for name in ("host", "client", "stranger"):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp / name)], check=True)
    shutil.copy(tmp / "client.pub", tmp / "authorized_keys")
    port = free_port()
    (tmp / "sshd_config").write_text(
        f"Port {port}\nListenAddress 127.0.0.1\nHostKey {tmp / 'host'}\nAuthorizedKeysFile {tmp / 'authorized_keys'}\n"
        f"PasswordAuthentication no\nKbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\n"
        f"PermitRootLogin prohibit-password\nPidFile {tmp / 'sshd.pid'}\nAcceptEnv LANG\n")
    if os.geteuid() == 0:
        Path("/run/sshd").mkdir(exist_ok=True)  # sshd's privilege separation folder
    proc = subprocess.Popen([binary, "-D", "-e", "-f", str(tmp / "sshd_config")], stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60  # a loaded CI machine: every ssh test then failed as "cannot reach"
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            break
        except OSError:
            if proc.poll() is not None:
                pytest.skip(f"sshd did not start: {proc.stderr.read()[-200:]}")
            if time.monotonic() > deadline:
                proc.kill()
                pytest.fail(f"sshd did not listen on port {port} within 60 s")
            time.sleep(0.1)
    yield {"kind": "ssh", "host": "127.0.0.1", "port": port, "user": getpass.getuser(), "key": str(tmp / "client"),
           "known_hosts": str(tmp / "known_hosts"), "python": sys.executable, "runs": 3, "warmup": 1,
           "workdir": str(tmp / "remote"), "connect_timeout": 5, "_dir": tmp}
    proc.terminate()
    proc.wait(10)


def ssh_spec(sshd, **changes):
    return {k: v for k, v in {**sshd, **changes}.items() if not k.startswith("_")}


def test_ssh_target_runs_on_a_real_sshd(run, sshd, tmp_path):
    file = targets_file(tmp_path, {"box": ssh_spec(sshd, budgets={"accuracy_retained": ">= 0.5"})})
    entry = devices.bench(run, "box", file, progress=False)
    local = devices.bench(run, "local", progress=False)
    assert entry["complete"] is True and entry["kind"] == "ssh" and entry["budgets"][0]["ok"]
    assert entry["predictions"] == local["predictions"] and entry["metrics"]["accuracy"] == local["metrics"]["accuracy"]
    assert (Path(sshd["workdir"]) / "job" / "result.json").is_file()  # it really went through the remote folder


@pytest.mark.parametrize("change, message", [
    (lambda s, d: dict(s, key=str(d / "stranger")), "127.0.0.1:{port} refused the key"),
    (lambda s, d: dict(s, port=free_port()), "cannot reach {user}@127.0.0.1"),
    (lambda s, d: dict(s, python="/nonexistent/python3"), "does not run on 127.0.0.1"),
    (lambda s, d: dict(s, python=str(d / "bare" / "bin" / "python")), "is not installed for"),
])
def test_ssh_failures_are_one_line(run, sshd, tmp_path, capsys, change, message):
    if "bare" in message or message == "is not installed for":
        if not (sshd["_dir"] / "bare").is_dir():
            subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(sshd["_dir"] / "bare")], check=True)
    spec = change(ssh_spec(sshd), sshd["_dir"])
    file = targets_file(tmp_path, {"box": spec})
    started = time.time()
    assert cli.main(["bench", str(run), "--target", "box", "--targets", str(file), "--quiet"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("edgekit: error: target box: ")
    assert message.format(port=sshd["port"], user=sshd["user"]) in err[0], err[0]
    assert time.time() - started < 60
    assert manifest(run)["devices"]["box"]["complete"] is False


def test_ssh_venv_on_a_python_too_old_for_the_pins_is_said_before_copying(run, sshd, tmp_path, capsys):
    old = tmp_path / "python3"  # Raspberry Pi OS bullseye's: numpy 2.4 has no wheel for it
    old.write_text("#!/bin/sh\necho 3.9.2\n")
    old.chmod(0o755)
    file = targets_file(tmp_path, {"old": ssh_spec(sshd, venv=True, python=str(old), workdir=str(tmp_path / "w"))})
    assert cli.main(["bench", str(run), "--target", "old", "--targets", str(file), "--quiet"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "need Python 3.11 or newer" in err[0] and "is 3.9.2" in err[0], err
    assert not (tmp_path / "w").exists()


def test_ssh_argv_is_a_list_and_remote_words_are_quoted():
    spec = {"host": "pi", "user": "pi", "port": 2222, "key": "/k/id", "connect_timeout": 7}
    argv = devices.ssh_command(spec, ["python3", "-c", "print('a b'); $(boom)"])
    assert argv[:9] == ["ssh", "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=accept-new", "-o",
                        "ConnectTimeout=7", "-p", "2222"]
    assert argv[-2:] == ["pi@pi", "python3 -c 'print('\"'\"'a b'\"'\"'); $(boom)'"]
    assert "--" in argv and argv.index("--") == len(argv) - 3


@pytest.mark.slow
def test_ssh_target_creates_a_virtual_environment(run, sshd, tmp_path):
    """venv: true makes a --without-pip virtual environment there and installs the runner's pinned packages
    (from the package index, as a device would)."""
    file = targets_file(tmp_path, {"fresh": ssh_spec(sshd, venv=True, python=shutil.which("python3") or sys.executable)})
    entry = devices.bench(run, "fresh", file, progress=False)
    assert entry["complete"] is True and entry["result"]["runtime"] == "onnxruntime"
    venv = Path(sshd["workdir"]) / "venv"
    assert (venv / "bin" / "python").exists() and not (venv / "bin" / "pip").exists()


# ---------------------------------------------------------------- adb: no device here

def test_parse_recorded_benchmark_model_output():
    r = devices.parse_benchmark_model((DATA / "benchmark_model_seq128.txt").read_text())
    assert r["latency_ms"] == {"p50": 18.774, "p90": 20.511, "p99": 22.417}  # the timed run, not the warm-up
    assert r["mean_ms"] == 18.956 and r["load_s"] == 0.0384 and r["first_inference_ms"] == 25.104
    assert r["runs"] == 55 and r["peak_rss_mb"] == 44.0117 and r["size_mb"] == 17.4193
    with pytest.raises(ValueError):
        devices.parse_benchmark_model("ERROR: Could not open '/data/local/tmp/x.tflite'.\n")


def test_adb_benchmark_model_argv():
    meta = {"inputs": [{"name": "args_0"}, {"name": "args_1"}], "pad_id": 0, "buckets": [32, 64, 128],
            "signatures": {"32": "seq32", "64": "seq64", "128": "seq128"}, "max_length": 128}
    argv = devices.adb_benchmark_argv({"serial": "R58M", "threads": 4, "runs": 30, "warmup": 5, "seq_len": 64},
                                      "/data/local/tmp/edgekit-bench/model.tflite", meta)
    assert argv[:4] == ["adb", "-s", "R58M", "shell"] and len(argv) == 5
    assert argv[4] == ("/data/local/tmp/benchmark_model --graph=/data/local/tmp/edgekit-bench/model.tflite "
                       "--num_threads=4 --num_runs=30 --warmup_runs=5 --input_layer_value_range=args_0,1,100:args_1,1,1 "
                       "--signature_to_run_for_invoke=seq64")


FAKE_ADB = '''#!{python}
"""A stand-in for adb: logs its argv, answers like a phone without Python that has benchmark_model."""
import json, sys
args = sys.argv[1:]
with open({log!r}, "a") as f:
    f.write(json.dumps(args) + "\\n")
if args[2:] == ["get-state"]:
    print({state!r})
    sys.exit(0 if {state!r} == "device" else 1)
if args[2] == "shell" and "benchmark_model" in args[3]:
    print(open({sample!r}).read())
'''


def fake_adb(tmp_path, state="device") -> Path:
    path = tmp_path / "adb"
    path.write_text(FAKE_ADB.format(python=sys.executable, log=str(tmp_path / "adb.log"), state=state,
                                    sample=str(DATA / "benchmark_model_seq128.txt")))
    path.chmod(0o755)
    return path


def test_adb_target_without_python_uses_benchmark_model(run, tmp_path, capsys):
    from edgekit.artifact import Artifact
    from edgekit.stages import export

    _, ctx = pipeline.context_of(run, progress=False)
    lite = export.run(Artifact(Path(manifest(run)["model"]["path"]), "hf"), tmp_path / "lite", ctx, format="tflite",
                      buckets=[16, 32], check_sentences=8)
    file = targets_file(tmp_path, {"phone": {"kind": "adb", "serial": "R58M", "adb": str(fake_adb(tmp_path)),
                                             "seq_len": 16, "budgets": {"latency_ms_p90": "<= 25"}}})
    assert cli.main(["bench", str(run), "--target", "phone", "--targets", str(file), "--model", str(lite.path),
                     "--quiet"]) == 0
    entry = manifest(run)["devices"]["phone"]
    assert entry["complete"] is True and entry["metrics"]["latency_ms_p90"] == 20.511 and "accuracy" not in entry["metrics"]
    calls = [json.loads(l) for l in (tmp_path / "adb.log").read_text().splitlines()]
    assert calls[0] == ["-s", "R58M", "get-state"] and calls[1] == ["-s", "R58M", "shell", "command -v python3"]
    assert calls[-2][:3] == ["-s", "R58M", "push"] and calls[-1][3].endswith("--signature_to_run_for_invoke=seq16")
    # the same model as ONNX cannot go through benchmark_model: one line saying what to do
    file = targets_file(tmp_path, {"phone": {"kind": "adb", "serial": "R58M", "adb": str(fake_adb(tmp_path))}})
    assert cli.main(["bench", str(run), "--target", "phone", "--targets", str(file), "--quiet"]) == 1
    assert "benchmark_model runs only .tflite files" in capsys.readouterr().err
    file = targets_file(tmp_path, {"phone": {"kind": "adb", "serial": "R58M", "adb": str(fake_adb(tmp_path, "offline"))}})
    assert cli.main(["bench", str(run), "--target", "phone", "--targets", str(file), "--quiet"]) == 1
    assert "target phone: no device R58M" in capsys.readouterr().err


# ---------------------------------------------------------------- qemu-arm64

def int8_artifacts(run: Path, into: Path) -> dict:
    """ONNX dynamic INT8 (onnxruntime) and TFLite dynamic-range INT8 (ai-edge-quantizer) of the run's model."""
    from ai_edge_quantizer import quantizer, recipe as qrecipe

    from edgekit.artifact import Artifact
    from edgekit.stages import export, quantize

    _, ctx = pipeline.context_of(run, progress=False)
    onnx_dir = into / "onnx-int8"
    onnx_dir.mkdir(parents=True)
    quantize.int8_dynamic(run / "01-export" / "model.onnx", onnx_dir / "model.onnx")
    for name in ("model.json", "tokenizer.json"):
        shutil.copy(run / "01-export" / name, onnx_dir / name)
    lite = export.run(Artifact(Path(manifest(run)["model"]["path"]), "hf"), into / "tflite", ctx, format="tflite",
                      buckets=[16, 32], check_sentences=8)
    lite_dir = into / "tflite-int8"
    shutil.copytree(into / "tflite", lite_dir)
    (lite_dir / "model.tflite").unlink()
    quantizer.Quantizer(str(lite.path), qrecipe.dynamic_wi8_afp32()).quantize().export_model(
        str(lite_dir / "model.tflite"), overwrite=True)
    return {"onnx": onnx_dir / "model.onnx", "tflite": lite_dir / "model.tflite"}


@pytest.mark.slow
def test_qemu_arm64_runs_int8_onnx_and_tflite_like_x86(run, tmp_path):
    if os.geteuid() != 0:
        pytest.skip("qemu-arm64 runs a chroot, which needs root")
    for tool in ("debootstrap", "dpkg-deb", "qemu-aarch64-static"):
        if not shutil.which(tool):
            pytest.skip(f"no {tool}: apt-get install -y debootstrap qemu-user-static (.ci/run does)")
    models = int8_artifacts(run, tmp_path)
    for fmt, model in models.items():
        arm = devices.bench(run, "qemu-arm64", model=str(model), progress=False)
        x86 = devices.bench(run, "local", model=str(model), progress=False)
        assert arm["complete"] and arm["emulated"] is True and arm["result"]["machine"] == "aarch64"
        assert arm["result"]["emulated_cpu"] == "cortex-a72" and arm["result"]["cpu"] == "Cortex-A72 (part 0xd08)"
        assert arm["result"]["int8_isa"] == "Arm NEON without dot product"  # read from the cpuinfo written for it
        assert arm["result"]["runtime"] == {"onnx": "onnxruntime", "tflite": "ai-edge-litert"}[fmt]
        assert x86["result"]["machine"] == "x86_64" or x86["result"]["machine"] != "aarch64"
        agree = sum(a == b for a, b in zip(arm["predictions"], x86["predictions"])) / len(x86["predictions"])
        assert len(arm["predictions"]) == len(x86["predictions"]) > 0 and agree >= 0.99, (fmt, agree)


def test_staged_test_split_carries_label_names_the_runner_reads_back(tmp_path, monkeypatch):
    """Numeric label names ("1", "2") must not be confused with label ids: the job's CSV holds names."""
    model_dir = testing.make_model_dir(tmp_path / "tiny")
    path = tmp_path / "tiny.yaml"
    path.write_text(testing.tiny_recipe(model_dir, testing.make_csv(tmp_path / "stars.csv", labels=("1", "2")),
                                        stages=("finetune", "export")))
    pipeline.run(recipe.load(str(path)), tmp_path / "run", progress=False)
    man, ctx = pipeline.context_of(tmp_path / "run", progress=False)
    model = devices.model_file(tmp_path / "run", man, None)
    (tmp_path / "job").mkdir()
    devices.stage_job(tmp_path / "run", man, model, tmp_path / "job")
    monkeypatch.syspath_prepend(str(tmp_path / "job"))  # the runner as it travels
    from device_bench.runner import read_labelled

    with open(tmp_path / "job" / "test.csv", newline="") as f:
        assert {r["label"] for r in csv.DictReader(f)} <= {"1", "2"}
    texts, ids = read_labelled(tmp_path / "job" / "test.csv", ctx.splits.labels, "text", "label")
    assert list(zip(texts, ids)) == [tuple(e) for e in ctx.splits.test]


@pytest.mark.parametrize("name", ["../etc", "a/b", "..", "x..y", "-oops", "pi 4", "pi\n"])
def test_target_names_that_could_leave_their_folder_are_refused(tmp_path, name):
    """A name goes into /tmp/edgekit-bench-NAME and the qemu job folder, which are removed."""
    with pytest.raises(UsageError, match="may hold only letters, digits, '.', '_' and '-'"):
        devices.load_targets({}, targets_file(tmp_path, {name: {"kind": "local"}}))


def test_valid_qemu_release_and_mirror_are_accepted(tmp_path):
    found = devices.load_targets({}, targets_file(tmp_path, {
        "a": {"kind": "qemu-arm64", "release": "bookworm", "mirror": "https://deb.debian.org/debian"},
        "b": {"kind": "qemu-arm64", "release": "stable-backports", "mirror": "file:///srv/mirror"}}))
    assert set(found) == {"a", "b"}


def test_a_qemu_root_failure_names_the_target_and_keeps_nothing(tmp_path, monkeypatch):
    """debootstrap gets the release as its first argument after the options; a failure names the target (it said
    `target qemu-arm64` for every qemu target)."""
    (tmp_path / "bin").mkdir()
    fake = tmp_path / "bin" / "debootstrap"
    fake.write_text(f"#!/bin/sh\nprintf '%s\\n' \"$@\" > {tmp_path / 'argv'}\necho 'E: no such suite' >&2\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake.parent}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("EDGEKIT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(devices.shutil, "which", lambda tool: tool)  # dpkg-deb and qemu need not be installed
    with pytest.raises(EdgekitError, match=r"^target q1: debootstrap \(needs the Debian mirror\) failed "
                                           r"\(E: no such suite\); the root was not kept"):
        devices.qemu_root({"kind": "qemu-arm64", "release": "trixie"}, progress=False, name="q1")
    argv = (tmp_path / "argv").read_text().splitlines()
    assert argv[4] == "trixie" and argv[5].startswith(str(tmp_path / "cache" / "qemu-arm64" / "trixie-"))
    assert list((tmp_path / "cache" / "qemu-arm64").iterdir()) == []


# ---------------------------------------------------------------- fake ssh and adb: devices that misbehave

FAKE_SSH = """#!{python}
import subprocess, sys
mode, command = {mode!r}, sys.argv[-1]
def out(data, code=0, err=b""):
    sys.stdout.buffer.write(data); sys.stderr.buffer.write(err); sys.exit(code)
if mode == "denied":
    out(b"", 255, b"pi@board: Permission denied (publickey).\\n")
if mode == "garbage":
    out(bytes(range(128, 256)), 0, bytes(range(128, 256)))
if "-m device_bench" in command and mode == "segv":
    out(b"", 139, b"Segmentation fault\\n")
if "-m device_bench" in command and mode == "noresult":
    out(b"all good\\nloaded the model\\n")
if "-m device_bench" in command and mode.startswith("{{"):
    out(b"")
if command.startswith("cat ") and mode.startswith("{{"):
    out(mode.encode())
sys.exit(subprocess.run(["sh", "-c", command]).returncode)
"""


def fake_ssh(tmp_path, monkeypatch, mode: str) -> dict:
    """ssh on PATH that runs the remote command here with sh -c, or plays `mode`; the spec of a target using it."""
    (tmp_path / "bin").mkdir(exist_ok=True)
    path = tmp_path / "bin" / "ssh"
    path.write_text(FAKE_SSH.format(python=sys.executable, mode=mode))
    path.chmod(0o755)
    monkeypatch.setenv("PATH", f"{path.parent}{os.pathsep}{os.environ['PATH']}")
    return {"kind": "ssh", "host": "board", "user": "pi", "python": sys.executable, "workdir": str(tmp_path / "remote"),
            "runs": 2, "warmup": 0}


def bench_error(run, tmp_path, target: str, spec: dict, capsys, *extra) -> str:
    """The one line `edgekit bench` printed for a failed bench (exit 1); the failure is recorded as incomplete."""
    file = targets_file(tmp_path, {target: spec})
    code = cli.main(["bench", str(run), "--target", target, "--targets", str(file), "--quiet", *extra])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1 and len(err) == 1 and err[0].startswith(f"edgekit: error: target {target}: "), err
    assert manifest(run)["devices"][target]["complete"] is False
    return err[0]


@pytest.mark.parametrize("mode, said, unsaid", [
    ("denied", "refused your default ssh key", "-i your default key"),  # was an invalid ssh-copy-id command
    ("segv", "the benchmark runner crashed with exit code 139, SIGSEGV (Segmentation fault); to see what the runtime "
     "wrote before it died, run again with DEVICE_BENCH_NATIVE_LOG=1 set for edgekit", None),  # was just the signal
    ("noresult", "the runner printed: all good loaded the model", "run again with -v"),  # -v did not show it
    ("garbage", "no readable result.json", None),  # was a UnicodeDecodeError traceback
])
def test_ssh_device_failures_are_one_line_that_says_what_to_do(run, tmp_path, monkeypatch, capsys, mode, said, unsaid):
    line = bench_error(run, tmp_path, "pi", fake_ssh(tmp_path, monkeypatch, mode), capsys)
    assert said in line and (unsaid is None or unsaid not in line), line
    if mode == "denied":
        assert "(ssh-copy-id pi@board)" in line


def test_a_runner_killed_by_a_signal_is_named_with_faulthandler_s_first_line_and_innermost_frame(monkeypatch):
    """A runtime that dies in native code: the signal by name, Python's fatal error and the frame it died in (the
    end of faulthandler's report is a list of extension modules), and how to see what the runtime wrote."""
    report = ("Fatal Python error: Segmentation fault\n\nCurrent thread 0x7f (most recent call first):\n"
              '  File "/job/device_bench/runner.py", line 197 in logits\n  File "/job/device_bench/runner.py", line 455 '
              "in bench\n\nExtension modules: numpy._core._multiarray_umath, ai_edge_litert (total: 2)\n")
    said = devices.runner_failure("pi", subprocess.CompletedProcess([], -11, "", report))
    assert said == ('target pi: the benchmark runner crashed with exit code -11, SIGSEGV (Fatal Python error: '
                    'Segmentation fault; innermost: File "/job/device_bench/runner.py", line 197 in logits); to see '
                    'what the runtime wrote before it died, run again with DEVICE_BENCH_NATIVE_LOG=1 set for edgekit')
    assert ", SIGILL (" in devices.runner_failure("pi", subprocess.CompletedProcess([], 132, "", ""))  # over a shell
    killed = devices.runner_failure("pi", subprocess.CompletedProcess([], -9, "", ""))
    assert ", SIGKILL (no output)" in killed and "NATIVE_LOG" not in killed  # no runtime words to see
    assert "SIG" not in devices.runner_failure("pi", subprocess.CompletedProcess([], 1, "Traceback: boom", ""))
    monkeypatch.setenv("DEVICE_BENCH_NATIVE_LOG", "1")  # already set: not said again
    assert "NATIVE_LOG" not in devices.runner_failure("pi", subprocess.CompletedProcess([], -6, "", ""))
    assert devices.runner_args({"_model": "model/m.onnx"}, "/j")[-1] == "--native-log"  # passed on to any device


def test_a_hanging_connection_names_the_setting_that_limits_it(tmp_path, monkeypatch):
    def hang(argv, **kw):
        raise subprocess.TimeoutExpired(argv, kw["timeout"])

    monkeypatch.setattr(devices.subprocess, "run", hang)
    with pytest.raises(EdgekitError) as e:
        devices.run_ssh("pi", {"kind": "ssh", "host": "board", "connect_timeout": 2}, tmp_path)
    assert "connect took longer than 32 s" in str(e.value) and "connect_timeout" in str(e.value)
    assert "timeout_s" not in str(e.value)  # which does not limit it


@pytest.mark.parametrize("result, field", [
    ({"latency_ms": {"p50": float("nan"), "p90": 1, "p99": 1}}, "latency_ms.p50 is nan"),
    ({"latency_ms": {"p50": 1, "p90": -1, "p99": 1}}, "latency_ms.p90 is -1"),
    ({"latency_ms": {"p50": 1, "p90": 1, "p99": float("inf")}}, "latency_ms.p99 is inf"),
    ({"latency_ms": {"p50": "fast", "p90": None, "p99": 1}}, "latency_ms.p50 is 'fast'"),
    ({"latency_ms": {"p50": 1}}, "latency_ms is {'p50': 1}, not p50, p90 and p99"),
    ({"size_mb": -3}, "size_mb is -3"),
    ({"peak_rss_mb": "lots"}, "peak_rss_mb is 'lots'"),
    ({"throughput": {"batch_1": float("nan")}}, "throughput.batch_1 is nan"),
    ({"accuracy": 7}, "accuracy is 7, not a fraction in [0, 1]"),
    ({"accuracy": float("nan")}, "accuracy is nan"),
    ({"f1_micro": 1.5}, "f1_micro is 1.5, not a fraction in [0, 1]"),
    ({"f1_micro": "high"}, "f1_micro is 'high', not a fraction in [0, 1]"),
    ({"model": "model.tflite", "format": "tflite"}, "the result is for model 'model.tflite', not the 'model.onnx' sent"),
])
def test_device_results_that_no_device_measures_are_refused(result, field):
    good = {"complete": True, "latency_ms": {"p50": 1.0, "p90": 2.0, "p99": 3.0}, "accuracy": 0.9, "size_mb": 4.0,
            "model": "model.onnx", "format": "onnx"}
    spec = {"_model": "model/model.onnx", "_format": "onnx"}
    assert devices.check_result("pi", good, spec) == good
    with pytest.raises(EdgekitError) as e:
        devices.check_result("pi", {**good, **result}, spec)
    assert str(e.value).startswith("target pi: the result") and field in str(e.value), str(e.value)


def test_a_device_result_with_nonsense_numbers_is_not_merged(run, tmp_path, monkeypatch, capsys):
    result = '{"complete": true, "latency_ms": {"p50": NaN, "p90": -1, "p99": 1e309}, "accuracy": 7}'
    line = bench_error(run, tmp_path, "pi", fake_ssh(tmp_path, monkeypatch, result), capsys)
    assert "the result's latency_ms.p50 is nan, not a finite number >= 0" in line  # was merged, and gate passed


DEVICE_ADB = """#!{python}
import json, os, shutil, subprocess, sys
mode, (verb, *rest) = {mode!r}, sys.argv[3:]
with open({log!r}, "a") as f:
    f.write(json.dumps(sys.argv[1:]) + "\\n")
def out(data, code=0, err=b""):
    sys.stdout.buffer.write(data); sys.stderr.buffer.write(err); sys.exit(code)
if mode == "garbage":
    out(bytes(range(128, 256)), 0, bytes(range(128, 256)))
if verb == "get-state":
    out(b"device\\n")
if verb == "push":
    if mode == "pushfail":
        out(b"", 1, b"adb: error: failed to copy 'model.tflite': remote No space left on device\\n")
    src, dst = rest
    shutil.copytree(src[:-2], dst, dirs_exist_ok=True) if src.endswith("/.") else shutil.copy(src, dst)
    out(b"1 file pushed\\n")
command = rest[0]
if "-m device_bench" in command and mode == "lost":  # an adb that loses the exit status (before Android 7)
    out(b"", 0, b"Traceback: MemoryError\\n")
if "-m device_bench" in command and mode == "stale":
    with open(command.split("--out ")[1].split()[0], "w") as f:
        f.write({stale!r})
    out(b"")
if "--graph=" in command:
    if mode == "bm_garbage":
        out(b"INFO: count=abc avg=xyz\\nINFO: Inference timings in us: Init: 1, First inference: 2, "
            b"Warmup (avg): 3, Inference (avg): 4\\nSegmentation fault\\n")
    graph = command.split("--graph=")[1].split()[0]
    out(open({sample!r}, "rb").read() if os.path.isfile(graph) else b"ERROR: Could not open the model\\n")
sys.exit(subprocess.run(["sh", "-c", command]).returncode)
"""
STALE = json.dumps({"complete": True, "latency_ms": {"p50": 1.0, "p90": 1.0, "p99": 1.0}, "model": "model.tflite",
                    "format": "tflite", "runtime": "ai-edge-litert"})


def device_adb(tmp_path, mode: str, python: str = sys.executable) -> dict:
    """An adb that runs shell commands here with sh -c (the phone's folders are folders here), or plays `mode`."""
    path = tmp_path / "adb"
    path.write_text(DEVICE_ADB.format(python=sys.executable, mode=mode, log=str(tmp_path / "adb.log"), stale=STALE,
                                      sample=str(DATA / "benchmark_model_seq128.txt")))
    path.chmod(0o755)
    return {"kind": "adb", "serial": "R58M", "adb": str(path), "python": python, "workdir": str(tmp_path / "phone"),
            "runs": 2, "warmup": 0}


def fake_tflite(run, into: Path) -> Path:
    """The run's ONNX file dressed as a .tflite with its model.json: benchmark_model is faked, never run."""
    shutil.copytree(run / "01-export", into)
    (into / "model.onnx").rename(into / "model.tflite")
    meta = json.loads((into / "model.json").read_text())
    (into / "model.json").write_text(json.dumps(dict(meta, format="tflite")))
    return into / "model.tflite"


def test_adb_benchmark_model_never_measures_a_model_left_on_the_phone(run, tmp_path, capsys):
    model = fake_tflite(run, tmp_path / "lite")
    spec = device_adb(tmp_path, "pushfail", python="/nonexistent/python3")
    (tmp_path / "phone" / "job").mkdir(parents=True)
    shutil.copy(model, tmp_path / "phone" / "job" / "model.tflite")  # an earlier bench's model, maybe another one
    line = bench_error(run, tmp_path, "phone", spec, capsys, "--model", str(model))  # was exit 0, merged as complete
    assert "adb push of the model on R58M failed with exit code 1" in line and "No space left on device" in line
    assert not (tmp_path / "phone" / "job" / "model.tflite").exists()  # the job folder is replaced, as over ssh
    # a good push: measured and shown with only what benchmark_model tells
    file = targets_file(tmp_path, {"phone": device_adb(tmp_path, "ok", python="/nonexistent/python3")})
    assert cli.main(["bench", str(run), "--target", "phone", "--targets", str(file), "--model", str(model),
                     "--quiet"]) == 0
    shown = capsys.readouterr().out
    assert "latency p50/p90/p99 18.77/20.51/22.42 ms" in shown and "random token ids" in shown
    assert "?" not in shown and "None" not in shown  # said: at ? tokens, on ? , ? thread(s), accuracy None


def test_adb_a_malformed_benchmark_model_log_is_one_line(run, tmp_path, capsys):
    text = "INFO: count=abc avg=xyz\nINFO: Inference timings in us: Init: 1, First inference: 2, Warmup (avg): 3, " \
           "Inference (avg): 4\n"
    with pytest.raises(ValueError):  # was KeyError: 'count'
        devices.parse_benchmark_model(text)
    model = fake_tflite(run, tmp_path / "lite")
    line = bench_error(run, tmp_path, "phone", device_adb(tmp_path, "bm_garbage", python="/nonexistent/python3"),
                       capsys, "--model", str(model))
    assert "benchmark_model gave no timings" in line and "Segmentation fault" in line


@pytest.mark.parametrize("mode, said", [
    ("lost", "no readable result.json (the runner printed: Traceback: MemoryError)"),
    ("stale", "the result is for model 'model.tflite', not the 'model.onnx' sent"),
    ("garbage", "no device R58M"),  # was a UnicodeDecodeError traceback
])
def test_adb_an_old_result_on_the_phone_is_never_merged(run, tmp_path, capsys, mode, said):
    (tmp_path / "phone" / "job").mkdir(parents=True)
    (tmp_path / "phone" / "job" / "result.json").write_text(STALE.replace("tflite", "onnx"))  # an earlier bench's
    line = bench_error(run, tmp_path, "phone", device_adb(tmp_path, mode), capsys)  # was merged as this one's
    assert said in line, line


def test_a_run_being_written_is_named_as_such_and_a_bench_says_its_result_was_not_saved(run, tmp_path, capsys,
                                                                                       monkeypatch):
    from edgekit import gate

    file = targets_file(tmp_path, {"here": {"kind": "local", "runs": 2, "warmup": 0, "sentences": 4}})
    monkeypatch.setattr(devices, "MERGE_WAIT_S", 0.5)
    before = json.loads((run / "manifest.json").read_text())
    held = pipeline.lock(run)  # as a compress of the same folder holds it while it runs
    try:  # the merge used to say "another edgekit run is writing" without saying the measurement was lost
        assert cli.main(["bench", str(run), "--target", "here", "--targets", str(file), "--quiet"]) == 1
        err = capsys.readouterr().err
        assert "this result of target here was not saved; run edgekit bench again when it has finished" in err
        (run / "manifest.json").write_text(json.dumps(dict(before, status="running")))
        with pytest.raises(EdgekitError, match="is being written by an edgekit run now; wait for it to finish"):
            gate.load_manifest(run)  # was: "run the same compress command to finish it", which the lock refuses
    finally:
        held.close()
        (run / "manifest.json").write_text(json.dumps(before))
    assert gate.being_written(run) is False


def test_a_device_keeps_to_the_sentences_evaluate_scored_so_retained_divides_like_for_like(tmp_path):
    """With data.max_eval the run's teacher accuracy is on that many test sentences; the device scored the whole
    test split and divided by it (a model that kept 100% read 95.6% and gate --target said OVER)."""
    model_dir = testing.make_model_dir(tmp_path / "tiny")
    path = tmp_path / "tiny.yaml"
    path.write_text(testing.tiny_recipe(model_dir, testing.make_csv(tmp_path / "r.csv", n=400),
                                        stages=("export", "evaluate")))
    pipeline.run(recipe.load(str(path), ["data.max_eval=7"]), tmp_path / "run", progress=False)
    final = manifest(tmp_path / "run")["final"]["metrics"]
    assert final["eval_examples"] == 7
    entry = devices.bench(tmp_path / "run", "local", progress=False)
    assert entry["result"]["examples"] == 7
    assert entry["metrics"]["accuracy"] == pytest.approx(final["accuracy"], abs=1e-4)
    assert entry["metrics"]["accuracy_retained"] == pytest.approx(final["accuracy_retained"], abs=1e-3)
    file = targets_file(tmp_path, {"few": {"kind": "local", "runs": 3, "sentences": 5}})
    few = devices.bench(tmp_path / "run", "few", file, progress=False)  # other sentences than the teacher's: no share
    assert few["result"]["examples"] == 5 and "accuracy" in few["metrics"] and "accuracy_retained" not in few["metrics"]


def test_bench_says_what_the_target_will_run_before_the_wait(run, capsys):
    """Was: nothing until the runner ended (seconds here, minutes on a phone or under qemu)."""
    devices.bench(run, "local", progress=True)
    scored = manifest(run)["final"]["metrics"]["eval_examples"]
    assert f"target local: model.onnx, {scored} test sentences and 50 timed runs\n" in capsys.readouterr().err


def test_a_moved_run_whose_data_file_is_gone_says_so(tmp_path):
    model_dir = testing.make_model_dir(tmp_path / "tiny")
    path = tmp_path / "tiny.yaml"
    path.write_text(testing.tiny_recipe(model_dir, testing.make_csv(tmp_path / "r.csv"), stages=("export",)))
    pipeline.run(recipe.load(str(path)), tmp_path / "run", progress=False)
    (tmp_path / "r.csv").unlink()
    with pytest.raises(EdgekitError, match=r"the run's data file .*r.csv is not there any more .*put the file back"):
        devices.bench(tmp_path / "run", "local", progress=False)  # was: "dataset ... not found; give rt-polarity"


def test_a_result_for_a_file_a_compress_rewrote_meanwhile_is_not_merged(run, tmp_path, monkeypatch, capsys):
    """edgekit bench measured the old file while a compress into the run wrote a new one; the old file's numbers
    were merged under the new final model, and gate --target passed on them."""
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    file = targets_file(tmp_path, {"there": {"kind": "local", "runs": 3, "warmup": 1}})
    real = devices.run_local

    def compress_meanwhile(*args):
        result = real(*args)
        m = manifest(copy)
        final = m["final"]["path"]
        for stage in m["stages"]:
            if final in stage["files"]:
                stage["files"][final] = "0" * 64  # the new file's hash, as the compress records it
        (copy / "manifest.json").write_text(json.dumps(m))
        return result
    monkeypatch.setattr(devices, "run_local", compress_meanwhile)
    assert cli.main(["bench", str(copy), "--target", "there", "--targets", str(file), "--quiet"]) == 1
    assert "changed while target there ran" in capsys.readouterr().err
    assert "there" not in manifest(copy).get("devices", {})



def test_a_boolean_is_not_a_count_in_a_target():
    """`runs: true` is refused (bool is an int in Python): the runner would be given --runs True."""
    assert devices.check_target("t", {"kind": "local", "runs": True}) == ["target t: runs must be int, got True"]


def test_a_cpu_that_is_not_a_name_is_one_line_not_a_traceback():
    """`cpu: [cortex-a72]` was looked up in the CPU list: TypeError, unhashable type: 'list'."""
    assert devices.check_target("t", {"kind": "qemu-arm64", "cpu": ["cortex-a72"]}) == [
        "target t: cpu must be str, got ['cortex-a72']"]


def test_a_manual_target_may_say_after_compress_false():
    """Only after_compress: true is refused on a manual target; false says what a manual target does anyway."""
    assert devices.check_target("t", {"kind": "manual", "after_compress": False}) == []


def test_runner_args_defaults_and_the_emulated_flag():
    """Each setting goes to its own flag with its own default; qemu adds --emulated, nothing else does."""
    args = devices.runner_args({"_model": "model/m.onnx", "runs": 7}, "/j")
    assert args == ["/j/model/m.onnx", "--data", "/j/test.csv", "--out", "/j/result.json", "--runs", "7",
                    "--warmup", "10", "--batch", "8", "--threads", "1", "--seq-len", "128"]
    assert devices.runner_args({"_model": "model/m.onnx"}, "/j", emulated=True)[-1] == "--emulated"


def test_a_result_that_names_no_model_nor_sha_is_checked_not_refused():
    """benchmark_model's result names no format and an older runner records no sha: absent is not a mismatch,
    and an accuracy of exactly 1 is a fraction."""
    result = {"complete": True, "latency_ms": {"p50": 1.0, "p90": 2.0, "p99": 3.0}, "accuracy": 1.0}
    spec = {"_model": "model/model.onnx", "_format": "onnx", "_sha": "a" * 64}
    assert devices.check_result("pi", result, spec) == result


def test_metrics_of_takes_every_percentile_and_retained_from_the_counts():
    """latency_ms_p99 is a device metric; accuracy_retained divides the counts (969/999 right), not the rounded
    scores (0.7341 / 0.7568 read 0.970005 and passed `>= 0.97`)."""
    manifest = {"final": {"metrics": {"teacher_accuracy": 0.7568, "eval_split": "test", "eval_examples": 1320}}}
    result = {"latency_ms": {"p50": 1.0, "p90": 2.0, "p99": 3.0}, "accuracy": 0.7341, "examples": 1320}
    metrics = devices.metrics_of(result, manifest)
    assert (metrics["latency_ms_p50"], metrics["latency_ms_p90"], metrics["latency_ms_p99"]) == (1.0, 2.0, 3.0)
    assert metrics["accuracy_retained"] == 969 / 999


def test_a_benchmark_model_log_with_a_zero_average_is_no_timed_run():
    """An average of 0 us is refused as no timings (ValueError), not divided by (throughput)."""
    log = ("count=50 first=0 curr=0 min=0 max=0 avg=0 std=0\n"
           "Inference timings in us: Init: 100, First inference: 0, Warmup (avg): 0, Inference (avg): 0\n")
    with pytest.raises(ValueError, match="no 'Inference timings in us' line"):
        devices.parse_benchmark_model(log)


def test_model_given_on_the_command_line_wins_over_the_targets_model(run, tmp_path):
    """--model beats the target's own `model:` setting."""
    file = targets_file(tmp_path, {"t": {"kind": "local", "model": "nope"}})
    *_, path = devices.chosen(run, "t", file, model="01-export/model.onnx")
    assert path == run / "01-export" / "model.onnx"


def test_a_model_path_in_the_run_wins_over_the_same_path_in_the_current_folder(run, tmp_path):
    """A relative --model that names a file in the run is the run's, even where the current folder has one too."""
    (tmp_path / "01-export").mkdir()
    (tmp_path / "01-export" / "model.onnx").write_bytes(b"not the run's")
    here = Path.cwd()
    try:
        os.chdir(tmp_path)
        assert devices.model_file(run, manifest(run), "01-export/model.onnx") == run / "01-export" / "model.onnx"
    finally:
        os.chdir(here)


def test_a_complete_result_without_latencies_is_incomplete():
    """read_result refuses a result without latency_ms on its own (not only when check_result runs after it)."""
    with pytest.raises(EdgekitError, match="target pi: the runner's result is incomplete"):
        devices.read_result("pi", json.dumps({"complete": True, "accuracy": 0.9}))
