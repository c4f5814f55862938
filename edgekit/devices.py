"""edgekit bench RUN --target NAME: run a finished run's model on a device with device_bench, merge the result
into the run's manifest under `devices.NAME`, and check the target's budgets (exit 3 when over, as `gate`).

Targets are YAML, under `devices:` in the recipe or in a file given with --targets:

    devices:
      here: {kind: local}
      pi4: {kind: ssh, host: 192.168.1.20, user: pi, key: ~/.ssh/id_ed25519, venv: true,
            budgets: {latency_ms_p90: "<= 40", accuracy_retained: ">= 0.97"}}
      phone: {kind: adb, serial: R58M123ABC}
      arm64: {kind: qemu-arm64}

`local`, `qemu-arm64` and `manual` work without a file. A `manual` target is a device edgekit cannot reach (a
phone without adb, an air-gapped board): `--stage DIR` writes the job and the command to run there, `--result FILE`
merges the result.json it wrote. The harness copies device_bench (no edgekit, no torch), the model,
its model.json and tokenizer and the run's test split as a CSV, runs it and fetches the result JSON. Every
command is an argv list; what runs in a remote shell (ssh, adb shell) is built with shlex.quote from our own
values. A failed run is recorded as {"complete": false, "error": ...} and never as a result.
"""
import csv
import io
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

import yaml

from edgekit import assets, gate, pipeline, recipe as recipes
from edgekit.artifact import weight_files, write_json
from edgekit.errors import EdgekitError, UsageError
from edgekit.report import number, threads_text

KINDS = ("local", "ssh", "adb", "qemu-arm64", "manual")
BUILT_IN = ("local", "qemu-arm64", "manual")  # target names that need no description
COMMON = {"kind": str, "budgets": dict, "model": str, "threads": int, "runs": int, "warmup": int, "batch": int,
          "seq_len": int, "sentences": int, "timeout_s": int, "after_compress": bool}
FIELDS = {
    "local": {"python": str},
    "ssh": {"host": str, "user": str, "port": int, "key": str, "python": str, "venv": bool, "workdir": str,
            "connect_timeout": int, "known_hosts": str, "pip_args": list},
    "adb": {"serial": str, "python": str, "workdir": str, "benchmark_model": str, "adb": str},
    "qemu-arm64": {"release": str, "mirror": str, "cpu": str},
    "manual": {},
}
REQUIRED = {"ssh": ("host",), "adb": ("serial",)}
LIMITS = {"threads": "[1, inf)", "runs": "[1, inf)", "warmup": "[0, inf)", "batch": "[1, inf)", "seq_len": "[2, 512]",
          "sentences": "[0, inf)", "timeout_s": "[1, inf)", "port": "[1, 65535]", "connect_timeout": "[1, inf)"}
# target names, hosts, users, serials: never an option, never shell syntax (fullmatch: "pi\n" is not one)
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
RELEASE = re.compile(r"[a-z][a-z0-9-]*")  # a Debian suite (bookworm, stable): a folder name and debootstrap's argument
MIRROR = re.compile(r"(https?|file)://\S+")
RUNNER_METRICS = ("size_mb", "accuracy", "f1_micro", "peak_rss_mb")  # f1_micro: a multi-label model
VENV_PYTHON = (3, 11)  # the oldest Python the pinned requirements-*.txt install on (numpy 2.4)
MERGE_WAIT_S = 30  # how long a finished bench waits for the run's lock (another bench merging)
# what a device's result may hold: every one a finite number >= 0 (accuracy a fraction), or absent
RESULT_NUMBERS = ("size_mb", "peak_rss_mb", "rss_after_load_mb", "load_s", "first_inference_ms", "mean_ms",
                  "accuracy_retained")
RESULT_GROUPS = ("latency_ms", "sentence_latency_ms", "throughput")


def runner_source() -> Path:
    """The device_bench package folder: beside edgekit in a checkout (`pip install -e .`), or installed on its own
    (`pip install ./device_bench`)."""
    here = Path(__file__).resolve().parent.parent / "device_bench" / "device_bench"
    if (here / "runner.py").is_file():
        return here
    try:
        import device_bench

        return Path(device_bench.__file__).parent
    except ImportError:
        raise EdgekitError("device_bench is not found beside edgekit nor installed; pip install ./device_bench "
                           "from the edgekit source tree")


def runner_module():
    """device_bench's runner as a module (numpy only), for the facts it reads on this machine: cpu_name, int8_isa."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("device_bench_runner", runner_source() / "runner.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def this_cpu() -> dict:
    """{cpu, int8_isa} of this machine, read as device_bench reads them: INT8 latencies compare only between CPUs
    with the same INT8 instructions, so every measurement names them."""
    runner = runner_module()
    return {"cpu": runner.cpu_name(), "int8_isa": runner.int8_isa()}


# ---------------------------------------------------------------- targets

def load_targets(recipe: dict, targets_file=None) -> dict:
    """name -> target spec, from the recipe's `devices` and the --targets file (which wins), validated. (The recipe's
    `targets` is the list of CPU families export and quantize build for: edgekit.targets.)"""
    found = dict((recipe or {}).get("devices") or {})
    if targets_file:
        path = Path(targets_file)
        try:
            loaded = yaml.safe_load(path.read_text())
        except OSError as e:
            raise UsageError(f"cannot read targets file {path} ({e.strerror}); give a YAML file of targets")
        except yaml.YAMLError as e:
            raise UsageError(f"targets file {path} is not valid YAML ({str(e).splitlines()[0]})")
        for key in ("devices", "targets"):
            if isinstance(loaded, dict) and isinstance(loaded.get(key), dict):
                loaded = loaded[key]
        if not isinstance(loaded, dict):
            raise UsageError(f"targets file {path} must map target names to settings (kind: "
                             f"{'|'.join(KINDS)}), at the top or under devices:")
        found.update(loaded)
    errors = []
    for name, spec in found.items():
        errors += check_target(str(name), spec)
    if errors:
        raise UsageError("; ".join(errors))
    return found


def check_target(name: str, spec) -> list:
    if not NAME.fullmatch(name) or ".." in name:  # names go into folders that are removed: /tmp/edgekit-bench-NAME
        return [f"target name {name!r} may hold only letters, digits, '.', '_' and '-' (no '/' nor '..')"]
    if not isinstance(spec, dict) or spec.get("kind") not in KINDS:
        return [f"target {name}: kind must be one of {', '.join(KINDS)}"]
    allowed = {**COMMON, **FIELDS[spec["kind"]]}
    errors = [f"target {name}: unknown key '{k}'{recipes.meant(k, allowed)}; accepted for {spec['kind']}: "
              f"{', '.join(allowed)}"
              for k in spec if k not in allowed]
    for key, want in allowed.items():
        value = spec.get(key)
        if key in spec and not (isinstance(value, want) and not (want is int and isinstance(value, bool))):
            errors.append(f"target {name}: {key} must be {want.__name__}, got {value!r}")
        elif key in spec and (allowed := recipes.outside(value, LIMITS.get(key))):
            errors.append(f"target {name}: {key} must be {allowed}, got {value!r}")
    errors += [f"target {name}: missing key '{k}' (needed for {spec['kind']})"
               for k in REQUIRED.get(spec["kind"], ()) if k not in spec]
    if spec["kind"] == "manual" and spec.get("after_compress"):
        errors.append(f"target {name}: after_compress needs a target edgekit reaches itself; a manual one is run by "
                      f"hand (edgekit bench RUN --target {name} --stage DIR)")
    cpu = spec.get("cpu", "cortex-a72")
    if spec["kind"] == "qemu-arm64" and isinstance(cpu, str) and cpu not in CPUS:  # not a str: said above
        errors.append(f"target {name}: cpu {spec['cpu']!r}; emulated CPUs: {', '.join(CPUS)}")
    if isinstance(spec.get("release"), str) and not RELEASE.fullmatch(spec["release"]):
        errors.append(f"target {name}: release {spec['release']!r} must be a Debian suite name (lower-case letters, "
                      f"digits and '-', starting with a letter); use one such as bookworm")
    if isinstance(spec.get("mirror"), str) and not MIRROR.fullmatch(spec["mirror"]):
        errors.append(f"target {name}: mirror {spec['mirror']!r} must be an http://, https:// or file:// URL; use "
                      f"one such as http://deb.debian.org/debian")
    for key in ("host", "user", "serial"):
        if isinstance(spec.get(key), str) and not NAME.fullmatch(spec[key]):
            errors.append(f"target {name}: {key} {spec[key]!r} may hold only letters, digits, '.', '_' and '-'")
    workdir = spec.get("workdir")
    if isinstance(workdir, str) and not workdir.startswith("/"):  # "" would make /job; "~" is not expanded
        errors.append(f"target {name}: workdir {workdir!r} must be an absolute path on the device; use an absolute "
                      f"path such as /home/pi/edgekit-bench")
    for metric, bound in (spec["budgets"] if isinstance(spec.get("budgets"), dict) else {}).items():
        if metric not in recipes.DEVICE_METRICS:
            errors.append(f"target {name}: budget on metric '{metric}', which a device does not measure; metrics: "
                          f"{', '.join(recipes.DEVICE_METRICS)}")
        elif recipes.parse_bound(bound) is None:
            errors.append(f"target {name}: budget {metric}: {bound!r} must be an operator and a number, e.g. '<= 40'")
        elif problem := recipes.bound_problem(metric, recipes.parse_bound(bound)[1]):
            errors.append(f"target {name}: {problem}")
    return errors


def resolve_target(name: str, targets: dict) -> dict:
    if name in targets:
        return dict(targets[name])
    if name in BUILT_IN:
        return {"kind": name}
    raise UsageError(f"unknown target '{name}'; targets: {', '.join(sorted(set(targets) | set(BUILT_IN)))}"
                     f" (describe more under `devices:` in a --targets file or the recipe)")


# ---------------------------------------------------------------- the job: what travels to the device

def model_file(run: Path, manifest: dict, choice: str = None) -> Path:
    """The file to bench: `choice` is an output name of the final stage (arm64-tflite), a path in the run, or none
    (the run's final model)."""
    outputs = manifest["final"].get("outputs") or {}
    path = Path(outputs[choice]["path"] if choice in outputs else choice or manifest["final"]["path"])
    if not path.is_absolute():  # in the run, else (a path typed from here) in the current folder
        path = run / path if (run / path).exists() or not path.exists() else path.resolve()
    if path.is_dir():
        path = next((path / n for n in ("model.tflite", "model.onnx") if (path / n).is_file()), path)
    if path.suffix not in (".onnx", ".tflite") or not path.is_file():
        names = [n for n, o in outputs.items() if Path(o["path"]).suffix in (".onnx", ".tflite")]
        error = UsageError if choice else EdgekitError
        raise error(f"{path} is not an .onnx or .tflite file, which device_bench runs; give --model "
                    f"{'one of ' + ', '.join(names) if names else 'an exported file in the run'}"
                    f"{'' if names else ', or export onnx or tflite in the recipe'}")
    if not (path.parent / "model.json").is_file():
        raise EdgekitError(f"{path} has no model.json beside it; re-export it with edgekit")
    return path


def stage_job(run: Path, manifest: dict, model: Path, into: Path, sentences: int = 0) -> dict:
    """Copy runner, model, sidecar, tokenizer and the test split (label names) into `into`."""
    shutil.copytree(runner_source(), into / "device_bench", ignore=shutil.ignore_patterns("__pycache__"))
    meta = json.loads((model.parent / "model.json").read_text())
    (into / "model").mkdir()
    for p in [model, model.parent / "model.json", model.parent / str(meta.get("tokenizer", ""))]:
        if p.is_file():
            shutil.copy(p, into / "model" / p.name)
    for p in weight_files(model)[1:]:  # an ONNX model's external data, where the model says it is
        copy = into / "model" / p.relative_to(model.parent.resolve())
        copy.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(p, copy)
    _, ctx = pipeline.context_of(run, progress=False)
    final = manifest["final"]["metrics"]  # by default the test sentences the run's evaluate scored (data.max_eval
    scored = final.get("eval_examples") if final.get("eval_split") == "test" else None  # cuts them): the retained
    test = ctx.splits.test[:sentences or scored or len(ctx.splits.test)]  # share divides by the same sentences
    with open(into / "test.csv", "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        pairs = bool(meta.get("text_pair"))
        writer.writerow(["text", "text_pair", "label"] if pairs else ["text", "label"])
        names = meta["labels"]  # the model's own names for the class ids: the runner reads names before ids
        writer.writerows((*(text if pairs else (text,)), "|".join(names[i] for i, v in enumerate(label) if v)
                          if isinstance(label, tuple) else names[label])  # multi-label: names cut at |
                         for text, label in test)
    return {"model": f"model/{model.name}", "format": meta.get("format"), "examples": len(test),
            "max_length": meta.get("max_length")}


def runner_args(spec: dict, root: str, emulated: bool = False) -> list:
    """Arguments after `python -m device_bench`, with paths under `root` (the job folder on the device)."""
    args = [f"{root}/{spec['_model']}", "--data", f"{root}/test.csv", "--out", f"{root}/result.json",
            "--runs", str(spec.get("runs", 50)), "--warmup", str(spec.get("warmup", 10)),
            "--batch", str(spec.get("batch", 8)), "--threads", str(spec.get("threads", 1)),
            "--seq-len", str(spec.get("seq_len", 128))]
    native_log = os.environ.get("DEVICE_BENCH_NATIVE_LOG") == "1"  # on the device too, wherever it runs
    return args + (["--emulated"] if emulated else []) + (["--native-log"] if native_log else [])


def tail(text, n: int = 300) -> str:
    """The end of what a device printed, on one line."""
    return " ".join((text or "").split())[-n:] or "no output"


NATIVE_CRASHES = ("SIGSEGV", "SIGABRT", "SIGBUS", "SIGILL", "SIGFPE")  # a runtime's own code died


def runner_failure(name: str, done) -> str:
    said = next((l for l in reversed((done.stderr or "").splitlines()) if "device_bench: error:" in l), None)
    if said:  # the runner's own one-line message
        return f"target {name}: {said.split('device_bench: error: ')[-1].strip()[:300]}"
    code = -done.returncode if done.returncode < 0 else done.returncode - 128  # killed, or a shell's 128 + N
    died = next((s.name for s in signal.Signals if s.value == code), "") if code > 0 else ""
    hint = "; to see what the runtime wrote before it died, run again with DEVICE_BENCH_NATIVE_LOG=1 set for edgekit" \
        if died in NATIVE_CRASHES and os.environ.get("DEVICE_BENCH_NATIVE_LOG") != "1" else ""
    lines = (done.stderr or "").splitlines()
    fatal = next((i for i, line in enumerate(lines) if line.startswith("Fatal Python error: ")), None)
    if fatal is not None:  # faulthandler's report: its first line and the innermost frame say more than its end
        frame = next((line.strip() for line in lines[fatal:] if line.strip().startswith("File ")), "")
        said = lines[fatal] + (f"; innermost: {frame}" if frame else "")
    else:
        said = tail((done.stderr or "") + " " + (done.stdout or ""))
    return (f"target {name}: the benchmark runner crashed with exit code {done.returncode}{', ' * bool(died)}{died} "
            f"({said}){hint}")


def call(argv: list, name: str, what: str, timeout: int, fix: str = "raise timeout_s in the target or lower "
         "runs/sentences", **kw):
    if kw.get("text"):  # a device may print anything: Latin-1 banners, garbage
        kw["errors"] = "replace"
    try:
        return subprocess.run(argv, capture_output=True, timeout=timeout, **kw)
    except FileNotFoundError:
        raise EdgekitError(f"target {name}: {argv[0]} is not installed here; install it to {what}")
    except subprocess.TimeoutExpired:
        raise EdgekitError(f"target {name}: {what} took longer than {timeout} s; {fix}")


# ---------------------------------------------------------------- local

def run_local(name: str, spec: dict, job: Path) -> dict:
    python = spec.get("python") or sys.executable
    done = call([python, "-m", "device_bench", *runner_args(spec, str(job))], name, "run the benchmark",
                spec.get("timeout_s", 1800), cwd=job, text=True, env={**os.environ, "PYTHONPATH": str(job)})
    if done.returncode != 0:
        raise EdgekitError(runner_failure(name, done))
    return read_result(name, (job / "result.json").read_text() if (job / "result.json").is_file() else "", done)


def read_result(name: str, text: str, done=None) -> dict:
    """The result JSON; `done`: the runner's process, whose output tells why there is none."""
    printed = tail(((done.stderr or "") + " " + (done.stdout or "")) if done else "")
    try:
        result = json.loads(text)
    except ValueError:
        raise EdgekitError(f"target {name}: the runner left no readable result.json "
                           f"({'it holds: ' + tail(text, 80) + '; ' if text.strip() else ''}the runner printed: "
                           f"{printed})")
    if not isinstance(result, dict) or result.get("complete") is not True or "latency_ms" not in result:
        raise EdgekitError(f"target {name}: the runner's result is incomplete; nothing merged, run again")
    return result


def check_result(name: str, result: dict, spec: dict) -> dict:
    """Refuse what no device measures (NaN, a negative or text latency, accuracy 7) and a result for another model
    than the one sent (an old result left on the device)."""
    sent = {"model": Path(spec["_model"]).name, "format": spec["_format"]}
    by_hand = spec.get("_by_hand")  # --result: a job staged with --stage and run by a person
    for key, value in sent.items():
        if result.get(key) is not None and result[key] != value:
            raise EdgekitError(f"target {name}: the result is for {key} {result[key]!r}, not the {value!r} "
                               + ("chosen here; give --result the same --model the job was staged with (job.json's "
                                  "merge line)" if by_hand else "sent; an old result was left on the device: nothing "
                                  "merged, run again"))
    if by_hand and not result.get("model_sha256"):  # every runner --stage ships records it
        raise EdgekitError(f"target {name}: the result has no model_sha256, so which file it measured is unknown (a "
                           f"device_bench older than the one --stage ships); nothing merged, run the staged job")
    if spec.get("_sha") and result.get("model_sha256") not in (None, spec["_sha"]):
        raise EdgekitError(f"target {name}: the result is for another {sent['model']} than the run holds (SHA-256 "
                           f"{str(result['model_sha256'])[:12]}..., the run's {spec['_sha'][:12]}...): a file from "
                           f"another run or an older export; nothing merged, "
                           + ("stage the job again and run it" if by_hand else "bench the run's file"))
    latency = result.get("latency_ms")
    if not isinstance(latency, dict) or any(q not in latency for q in ("p50", "p90", "p99")):
        raise EdgekitError(f"target {name}: the result's latency_ms is {latency!r}, not p50, p90 and p99 in ms; "
                           f"nothing merged, check the runner on the device")
    values = {k: result[k] for k in RESULT_NUMBERS if result.get(k) is not None}
    for group in RESULT_GROUPS:
        if group in result:
            items = result[group].items() if isinstance(result[group], dict) else [("", result[group])]
            values.update({f"{group}.{k}".rstrip("."): v for k, v in items})
    for field, value in values.items():
        if not recipes.measure(value):
            raise EdgekitError(f"target {name}: the result's {field} is {value!r}, not a finite number >= 0; nothing "
                               f"merged, check the runner on the device")
    for key in ("accuracy", "f1_micro"):
        if result.get(key) is not None and not (recipes.measure(result[key]) and result[key] <= 1):
            raise EdgekitError(f"target {name}: the result's {key} is {result[key]!r}, not a fraction in [0, 1]; "
                               f"nothing merged, check the runner on the device")
    return result


# ---------------------------------------------------------------- ssh

def ssh_base(spec: dict) -> list:
    argv = ["ssh", "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=accept-new",
            "-o", f"ConnectTimeout={spec.get('connect_timeout', 10)}", "-p", str(spec.get("port", 22))]
    if spec.get("known_hosts"):
        argv += ["-o", f"UserKnownHostsFile={Path(spec['known_hosts']).expanduser()}"]
    if spec.get("key"):
        argv += ["-i", str(Path(spec["key"]).expanduser()), "-o", "IdentitiesOnly=yes"]
    return argv + ["--", f"{spec['user']}@{spec['host']}" if spec.get("user") else spec["host"]]


def ssh_command(spec: dict, words: list) -> list:
    """ssh argv running `words` on the target; ssh hands a string to the remote shell, so each word is quoted."""
    return ssh_base(spec) + [shlex.join(words) if isinstance(words, list) else words]


def ssh_failure(name: str, spec: dict, stderr: str) -> str:
    where = f"{spec.get('user') + '@' if spec.get('user') else ''}{spec['host']}:{spec.get('port', 22)}"
    text = stderr.strip().splitlines()[-1] if stderr.strip() else "no message"
    if "Permission denied" in stderr:
        login = where.rsplit(":", 1)[0]
        copy = shlex.join(["ssh-copy-id", *(["-i", spec["key"]] if spec.get("key") else []),
                           *(["-p", str(spec["port"])] if spec.get("port", 22) != 22 else []), login])
        if spec.get("key"):
            return (f"target {name}: {where} refused the key {spec['key']} ({text[:120]}); add {spec['key']}.pub to "
                    f"~/.ssh/authorized_keys there ({copy}) or set key: in the target")
        return (f"target {name}: {where} refused your default ssh key ({text[:120]}); add your public key to "
                f"~/.ssh/authorized_keys there ({copy}) or set key: in the target")
    if "Host key verification failed" in stderr or "REMOTE HOST IDENTIFICATION HAS CHANGED" in stderr:
        return (f"target {name}: the host key of {where} does not match known_hosts; if the device was re-installed, "
                f"remove its old key (ssh-keygen -R {spec['host']})")
    return (f"target {name}: cannot reach {where} ({text[:160]}); check host, port and that sshd runs there and the "
            f"network lets you in")


def run_ssh(name: str, spec: dict, job: Path) -> dict:
    home = spec.get("workdir", f"/tmp/edgekit-bench-{name}")
    workdir = f"{home}/job"  # replaced on every run; only this folder is ever removed
    timeout = spec.get("timeout_s", 1800)
    python = spec.get("python", "python3")
    limit = spec.get("connect_timeout", 10) + 30
    check = call(ssh_command(spec, [python, "-c", "import platform; print(platform.python_version())"]), name,
                 "connect", limit, f"check that {spec['host']} is on and answers ssh (the limit is connect_timeout + 30 "
                 f"s; raise connect_timeout in the target for a slow link)", text=True)
    if check.returncode == 255:
        raise EdgekitError(ssh_failure(name, spec, check.stderr))
    if check.returncode != 0:
        raise EdgekitError(f"target {name}: {python} does not run on {spec['host']} ({tail(check.stderr, 120)}); "
                           f"install python3 there or set python: to its path in the target")
    if spec.get("venv"):  # said before the job is copied
        found = (check.stdout.strip().splitlines() or ["?"])[-1]  # a login banner comes before it
        if len(version := tuple(int(x) for x in re.findall(r"\d+", found)[:2])) == 2 and version < VENV_PYTHON:
            raise EdgekitError(f"target {name}: venv: true installs the runner's pinned packages, which need Python "
                               f"{'.'.join(map(str, VENV_PYTHON))} or newer; {python} on {spec['host']} is "
                               f"{found[:20]}: set python: to a newer one there, or install numpy, tokenizers and "
                               f"{runner_module().RUNTIME_PACKAGE[spec['_format']]} there by hand and "
                               f"leave venv out")
    send = call(ssh_command(spec, f"rm -rf {shlex.quote(workdir)} && mkdir -p {shlex.quote(workdir)} && "
                                  f"tar -C {shlex.quote(workdir)} -xf -"), name, "copy the job", timeout,
                input=tar_bytes(job))
    if send.returncode != 0:
        raise EdgekitError(f"target {name}: copying to {spec['host']}:{workdir} failed "
                           f"({send.stderr.decode(errors='replace').strip()[-160:]}); check free space and permissions")
    if spec.get("venv"):
        python = ssh_venv(name, spec, home, python, timeout)
    command = (f"cd {shlex.quote(workdir)} && exec {shlex.quote(python)} -m device_bench "
               + shlex.join(runner_args(spec, workdir)))
    done = call(ssh_command(spec, command), name, "run the benchmark", timeout, text=True)
    if done.returncode == 255:
        raise EdgekitError(ssh_failure(name, spec, done.stderr))
    if done.returncode != 0:
        raise EdgekitError(runner_failure(name, done))
    fetched = call(ssh_command(spec, ["cat", f"{workdir}/result.json"]), name, "fetch the result", timeout, text=True)
    if fetched.returncode == 255:
        raise EdgekitError(ssh_failure(name, spec, fetched.stderr))
    return read_result(name, fetched.stdout if fetched.returncode == 0 else "", done)


def ssh_venv(name: str, spec: dict, home: str, python: str, timeout: int) -> str:
    """A virtual environment beside the job (HOME/venv), kept between runs: the runner's pinned packages."""
    venv = f"{home}/venv"
    reqs = f"{home}/job/device_bench/requirements-{'tflite' if spec['_format'] == 'tflite' else 'onnx'}.txt"
    pip_args = [str(a) for a in spec.get("pip_args", [])]
    command = (f"test -x {shlex.quote(venv)}/bin/python || {shlex.quote(python)} -m venv --without-pip "
               f"{shlex.quote(venv)} && {shlex.quote(python)} -m pip --python {shlex.quote(venv + '/bin/python')} "
               f"install -q --no-deps --no-compile --disable-pip-version-check -r {shlex.quote(reqs)} "
               + shlex.join(pip_args))
    done = call(ssh_command(spec, command), name, "create the virtual environment", timeout, text=True)
    if done.returncode != 0:
        raise EdgekitError(f"target {name}: creating the virtual environment {venv} failed "
                           f"({done.stderr.strip().splitlines()[-1][:160] if done.stderr.strip() else 'no message'}); "
                           f"the device needs python3-venv, pip and a package index (or pip_args: [--find-links, DIR])")
    return f"{venv}/bin/python"


def tar_bytes(folder: Path) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        tar.add(folder, arcname=".")
    return buf.getvalue()


# ---------------------------------------------------------------- adb

def adb_base(spec: dict) -> list:
    return [spec.get("adb", "adb"), "-s", spec["serial"]]


def adb_benchmark_argv(spec: dict, remote_model: str, meta: dict) -> list:
    """adb argv running TFLite's benchmark_model on the model: the bucket that holds seq_len, token ids in range."""
    buckets = sorted(meta.get("buckets") or [meta["max_length"]])
    bucket = next((b for b in buckets if b >= spec.get("seq_len", 128)), buckets[-1])
    names = [i["name"] for i in meta["inputs"]]
    words = [spec.get("benchmark_model", "/data/local/tmp/benchmark_model"), f"--graph={remote_model}",
             f"--num_threads={spec.get('threads', 1)}", f"--num_runs={spec.get('runs', 50)}",
             f"--warmup_runs={spec.get('warmup', 10)}",
             f"--input_layer_value_range={names[0]},{max(1, meta['pad_id'] + 1)},100:{names[1]},1,1"]
    if meta.get("signatures"):
        words.append(f"--signature_to_run_for_invoke={meta['signatures'][str(bucket)]}")
    return adb_base(spec) + ["shell", shlex.join(words)]


def parse_benchmark_model(text: str) -> dict:
    """TFLite benchmark_model's log -> latency (ms; p90 is its p95, an upper bound: the tool prints p5/median/p95),
    load time and peak memory. Raises when the log has no timed run."""
    number = r"(\d+(?:\.\d+)?(?:e[+-]?\d+)?)(?![\w.])"  # a malformed line (count=abc) is no timed run
    runs = [dict(re.findall(r"(\w+)=" + number, line)) for line in text.splitlines() if "count=" in line]
    runs = [r for r in runs if "count" in r and "avg" in r]
    summary = re.search(r"Inference timings in us: Init: {0}, First inference: {0}, Warmup \(avg\): {0}, "
                        r"Inference \(avg\): {0}".format(number), text)
    if not runs or not summary or float(summary.group(4)) <= 0:
        raise ValueError("no 'Inference timings in us' line")
    timed = {k: float(v) / 1e3 for k, v in runs[-1].items() if k != "count"}
    peak = re.search(r"Overall peak memory footprint \(MB\) via periodic monitoring: ([\d.]+)", text) \
        or re.search(r"Peak memory footprint \(MB\): init=[\d.]+ overall=([\d.]+)", text) \
        or re.search(r"Memory footprint delta from the start of the tool \(MB\): init=[\d.]+ overall=([\d.]+)", text)
    size = re.search(r"The input model file size \(MB\): ([\d.]+)", text)
    p50 = timed.get("median", float(summary.group(4)) / 1e3)
    return {"latency_ms": {"p50": round(p50, 3), "p90": round(timed.get("p95", timed.get("max", p50)), 3),
                           "p99": round(timed.get("max", p50), 3)},
            "latency_note": "benchmark_model prints p5/median/p95: p90 here is its p95, p99 its max",
            "mean_ms": round(float(summary.group(4)) / 1e3, 3), "load_s": round(float(summary.group(1)) / 1e6, 4),
            "first_inference_ms": round(float(summary.group(2)) / 1e3, 3), "runs": int(float(runs[-1]["count"])),
            "peak_rss_mb": float(peak.group(1)) if peak else None,
            "size_mb": float(size.group(1)) if size else None,
            "throughput": {"batch_1": round(1e3 / (float(summary.group(4)) / 1e3), 2)},
            "runtime": "tflite benchmark_model", "complete": True}


def adb_call(name: str, spec: dict, args: list, what: str, timeout: int = 0):
    """One adb command; a quick step (no `timeout`: 30 s) that hangs means the device does not answer."""
    fix = "raise timeout_s in the target" if timeout else f"check that the device answers (adb -s {spec['serial']} " \
        "shell true)"
    return call(adb_base(spec) + args, name, what, timeout or 30, fix, text=True)


def adb_step(name: str, spec: dict, args: list, what: str, timeout: int = 0):
    """One adb step that must succeed: a failure stops the bench, naming the step and what the device said."""
    done = adb_call(name, spec, args, what, timeout)
    if done.returncode != 0:
        raise EdgekitError(f"target {name}: {what} on {spec['serial']} failed with exit code {done.returncode} "
                           f"({tail(done.stderr + ' ' + done.stdout, 160)}); check free space and the workdir there")
    return done


def run_adb(name: str, spec: dict, job: Path) -> dict:
    workdir = spec.get("workdir", "/data/local/tmp/edgekit-bench") + "/job"  # replaced on every run, as over ssh
    timeout = spec.get("timeout_s", 1800)
    state = adb_call(name, spec, ["get-state"], "talk to the device")
    if state.returncode != 0 or state.stdout.strip() != "device":
        raise EdgekitError(f"target {name}: no device {spec['serial']} ({tail(state.stderr or state.stdout, 120)}); "
                           f"connect it, allow USB debugging and check `adb devices`")
    python = spec.get("python", "python3")
    has_python = adb_call(name, spec, ["shell", shlex.join(["command", "-v", python])], "look for Python").stdout.strip()
    adb_step(name, spec, ["shell", f"rm -rf {shlex.quote(workdir)} && mkdir -p {shlex.quote(workdir)}"],
             "cleaning the work folder")  # never a result or a model left by an earlier bench
    if has_python:
        adb_step(name, spec, ["push", f"{job}/.", workdir], "adb push of the job", timeout)
        command = f"cd {shlex.quote(workdir)} && {shlex.quote(python)} -m device_bench " + \
            shlex.join(runner_args(spec, workdir))
        done = call(adb_base(spec) + ["shell", command], name, "run the benchmark", timeout, text=True)
        if done.returncode != 0:
            raise EdgekitError(runner_failure(name, done))
        fetched = call(adb_base(spec) + ["exec-out", shlex.join(["cat", f"{workdir}/result.json"])], name,
                       "fetch the result", timeout, text=True)
        return read_result(name, fetched.stdout if fetched.returncode == 0 else "", done)
    if spec["_format"] != "tflite":
        raise EdgekitError(f"target {name}: no {python} on {spec['serial']}, and benchmark_model runs only .tflite "
                           f"files; give --model a .tflite file, or install Python there (Termux) with the runner's "
                           f"packages")
    meta = json.loads((job / "model" / "model.json").read_text())
    remote_model = f"{workdir}/{Path(spec['_model']).name}"
    adb_step(name, spec, ["push", str(job / spec["_model"]), remote_model], "adb push of the model", timeout)
    done = call(adb_benchmark_argv(spec, remote_model, meta), name, "run benchmark_model", timeout, text=True)
    printed = done.stdout + done.stderr
    if done.returncode != 0 and "not found" in printed:
        raise EdgekitError(f"target {name}: {spec.get('benchmark_model', '/data/local/tmp/benchmark_model')} is not on "
                           f"the device; push TFLite's benchmark_model binary there (docs/device_bench.md says how)")
    if done.returncode != 0:
        raise EdgekitError(f"target {name}: benchmark_model crashed with exit code {done.returncode} "
                           f"({tail(printed, 160)}); run it by hand with the same flags")
    try:
        result = parse_benchmark_model(printed)
    except ValueError:
        raise EdgekitError(f"target {name}: benchmark_model gave no timings ({tail(printed, 160)}); run it by hand "
                           f"with the same flags")
    return {**result, "format": "tflite", "model": Path(spec["_model"]).name,
            "note": "benchmark_model: random token ids, no tokenization, no accuracy"}


# ---------------------------------------------------------------- qemu-arm64

WHEEL_PLATFORMS = ("manylinux_2_28_aarch64", "manylinux_2_27_aarch64", "manylinux_2_17_aarch64",
                   "manylinux2014_aarch64", "any")
QEMU = "/usr/bin/qemu-aarch64-static"
# CPUs the emulated target can be (qemu -cpu): (MIDR part, /proc/cpuinfo features). The default is a Raspberry
# Pi 4's core. qemu's own `max` CPU (every extension) is not offered: XNNPACK's dynamic-range INT8 kernels for it
# gave logits far from both x86 and FP32 here (98.0% agreement), while cortex-a72 matched x86.
CPUS = {"cortex-a72": ("0xd08", "fp asimd evtstrm crc32 cpuid"),  # Raspberry Pi 4
        "cortex-a53": ("0xd03", "fp asimd evtstrm crc32 cpuid"),  # Raspberry Pi 3, many phones' little cores
        "cortex-a76": ("0xd0b", "fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm "
                                "lrcpc dcpop asimddp")}  # Raspberry Pi 5


def qemu_root(spec: dict, progress: bool = True, name: str = "qemu-arm64") -> Path:
    """A Debian arm64 root with python3 and the runner's aarch64 wheels, built once into the cache (through a temp
    folder and a rename). debootstrap's first stage (--foreign) fetches the packages; they are unpacked with the
    host's dpkg-deb, since without binfmt_misc the arm64 second stage cannot run its maintainer scripts."""
    root, release, mirror, reqs = qemu_root_dir(spec)
    if (root / ".ready").is_file():
        return root
    for tool, package in (("debootstrap", "debootstrap"), ("dpkg-deb", "dpkg"), (QEMU, "qemu-user-static")):
        if not shutil.which(tool):
            raise EdgekitError(f"target {name} needs {tool}; apt-get install -y {package}")
    tmp = root.with_name(root.name + f".{os.getpid()}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    from edgekit.progress import bar as progress_bar

    steps = progress_bar(total=4, desc="qemu-arm64 root", disable=not progress)
    try:
        run_step(["debootstrap", "--arch=arm64", "--foreign", "--variant=minbase", "--include=python3", release,
                  str(tmp), mirror], "debootstrap (needs the Debian mirror)", name)
        steps.update()
        for deb in sorted((tmp / "var/cache/apt/archives").glob("*.deb")):
            run_step(["dpkg-deb", "-x", str(deb), str(tmp)], f"unpacking {deb.name}", name)
            deb.unlink()
        shutil.copy(QEMU, tmp / "usr/bin")
        steps.update()
        wheels = tmp / "opt" / "wheels"
        argv = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "-d", str(wheels),
                "--python-version", "3.11", "--implementation", "cp", "--abi", "cp311", "--abi", "abi3", "--abi", "none"]
        for p in WHEEL_PLATFORMS:
            argv += ["--platform", p]
        run_step(argv + reqs, "pip download of the aarch64 wheels (needs the package index)", name)
        steps.update()
        import zipfile

        for wheel in sorted(wheels.glob("*.whl")):
            with zipfile.ZipFile(wheel) as z:
                z.extractall(tmp / "opt" / "site")
        shutil.rmtree(wheels)
        steps.update()
        (tmp / ".ready").write_text(json.dumps({"release": release, "packages": reqs, "built": time.time()}))
        os.replace(tmp, root)
    finally:
        steps.close()
        shutil.rmtree(tmp, ignore_errors=True)
    return root


def qemu_root_dir(spec: dict) -> tuple:
    """(root folder, release, mirror, pinned wheels): one root per release, mirror and package list, in EDGEKIT_CACHE."""
    import hashlib

    from edgekit import assets

    release, mirror = spec.get("release", "bookworm"), spec.get("mirror", "http://deb.debian.org/debian")
    reqs = sorted({line.strip() for f in ("onnx", "tflite") for line in
                   (runner_source() / f"requirements-{f}.txt").read_text().splitlines()
                   if line.strip() and not line.startswith("#")})
    key = hashlib.sha256(json.dumps([release, mirror, reqs]).encode()).hexdigest()[:12]
    return assets.cache_dir() / "qemu-arm64" / f"{release}-{key}", release, mirror, reqs


def run_step(argv: list, what: str, name: str = "qemu-arm64") -> None:
    done = subprocess.run(argv, capture_output=True, text=True, errors="replace")
    if done.returncode != 0:
        last = (done.stderr.strip() or done.stdout.strip() or "no message").splitlines()[-1]
        raise EdgekitError(f"target {name}: {what} failed ({last[:200]}); the root was not kept, run again")


def qemu_argv(root: Path, job: str, spec: dict) -> list:
    """chroot + qemu called explicitly (binfmt_misc is not needed): the arm64 python3 runs the runner."""
    return [shutil.which("chroot") or "/usr/sbin/chroot", str(root), QEMU, "-cpu", spec.get("cpu", "cortex-a72"),
            "/usr/bin/python3", "-m", "device_bench", *runner_args(spec, job, emulated=True)]


def describe_cpu(root: Path, cpu: str) -> None:
    """The chroot has no /proc or /sys: write the files cpuinfo (used by ONNX Runtime and XNNPACK) reads to find the
    cores, so the runtimes pick their ARM kernels as on a device instead of failing over to generic ones."""
    part, features = CPUS[cpu]
    n = os.cpu_count() or 1
    (root / "sys/devices/system/cpu").mkdir(parents=True, exist_ok=True)
    for name in ("possible", "present", "online"):
        (root / "sys/devices/system/cpu" / name).write_text(f"0-{n - 1}\n" if n > 1 else "0\n")
    core = ("processor\t: {}\nBogoMIPS\t: 108.00\nFeatures\t: " + features + "\nCPU implementer\t: 0x41\n"
            "CPU architecture: 8\nCPU variant\t: 0x0\nCPU part\t: " + part + "\nCPU revision\t: 0\n")
    (root / "proc").mkdir(exist_ok=True)
    (root / "proc/cpuinfo").write_text("\n".join(core.format(i) for i in range(n)))


def run_qemu(name: str, spec: dict, job: Path, progress: bool = True) -> dict:
    if os.geteuid() != 0:
        raise EdgekitError(f"target {name}: qemu-arm64 runs the runner in a chroot, which needs root; run as root "
                           f"(or in a container where you are root)")
    root = qemu_root(spec, progress, name)
    describe_cpu(root, spec.get("cpu", "cortex-a72"))
    inside = Path("/opt/jobs") / f"{name}-{os.getpid()}"
    shutil.rmtree(root / inside.relative_to("/"), ignore_errors=True)
    shutil.copytree(job, root / inside.relative_to("/"))
    try:
        env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": f"/opt/site:{inside}", "PYTHONDONTWRITEBYTECODE": "1",
               "LANG": "C.UTF-8"}
        done = call(qemu_argv(root, str(inside), spec), name, "run the benchmark under qemu",
                    spec.get("timeout_s", 3600), text=True, env=env)
        if done.returncode != 0:
            raise EdgekitError(runner_failure(name, done))
        out = root / inside.relative_to("/") / "result.json"
        return {**read_result(name, out.read_text() if out.is_file() else ""), "emulated_cpu": spec.get("cpu", "cortex-a72")}
    finally:
        shutil.rmtree(root / inside.relative_to("/"), ignore_errors=True)


# ---------------------------------------------------------------- bench: run, merge, check

def metrics_of(result: dict, manifest: dict) -> dict:
    metrics = {k: result.get(k) for k in RUNNER_METRICS}
    metrics.update({f"latency_ms_{q}": result["latency_ms"].get(q) for q in ("p50", "p90", "p99")})
    final = manifest["final"]["metrics"]
    teacher = final.get("teacher_accuracy")  # measured on eval_examples sentences of eval_split: comparable only
    same = final.get("eval_split") == "test" and final.get("eval_examples") == result.get("examples")  # on those
    if result.get("accuracy") is not None and teacher and same:
        hits, teacher_hits = (round(score * result["examples"]) for score in (result["accuracy"], teacher))
        metrics["accuracy_retained"] = hits / teacher_hits  # from the counts, as the evaluate stage's: a ratio of
        # scores rounded to 4 places crossed a budget's bound (969 / 999 sentences right, 0.96997, read 0.97)
    if result.get("f1_micro") is not None and final.get("teacher_f1_micro") and same:  # a multi-label model's
        metrics["f1_micro_retained"] = result["f1_micro"] / final["teacher_f1_micro"]  # (unrounded, both)
    return {k: v for k, v in metrics.items() if v is not None}


def chosen(run, target: str, targets_file=None, model: str = None) -> tuple:
    """(manifest, run folder, target settings, model file) for benching `target`: the same file whether the job is
    run here, staged by hand or merged back."""
    manifest, run = gate.load_manifest(Path(run))
    spec = resolve_target(target, load_targets(manifest["recipe"], targets_file))
    return manifest, run, spec, model_file(run, manifest, model or spec.get("model"))


def bench(run, target: str, targets_file=None, model: str = None, progress: bool = True, result_file=None) -> dict:
    """Run `target` on the run's model (or read the result.json a manual run wrote: `result_file`); merge the entry
    into manifest.json under devices.<target>; return it."""
    manifest, run, spec, path = chosen(run, target, targets_file, model)
    multi = json.loads((path.parent / "model.json").read_text()).get("multi_label")  # model_file checked it is there
    pipeline.check_budget_kind({}, bool(multi), {target: spec})  # an F1 budget for a single-label model: never held
    sha = assets.sha256_file(path)  # what is measured: merge checks the run still holds it
    where = in_run(path, run)
    if spec["kind"] == "manual" and result_file is None:
        raise UsageError(f"target {target} is run by hand: edgekit bench {run} --target {target} --stage DIR writes "
                         f"the job and the command to run on the device; then --result FILE merges its result.json")
    if result_file is not None:
        meta = json.loads((path.parent / "model.json").read_text())  # model_file checked it is there
        spec.update(_model=f"model/{path.name}", _format=meta.get("format"), _sha=sha, _by_hand=True)
        text = _read_text(Path(result_file), "--result")
        try:
            json.loads(text)
        except ValueError as e:
            raise UsageError(f"--result {result_file} is not JSON ({e}); give the result.json device_bench wrote on "
                             f"the device, copied whole")
        result = check_result(target, read_result(target, text), spec)
        spec["kind"] = "manual"  # whatever the target's kind, this result was run by hand
    else:
        with tempfile.TemporaryDirectory(prefix="edgekit-bench-") as tmp:
            job = Path(tmp)
            try:
                staged = stage_job(run, manifest, path, job, spec.get("sentences", 0))
                spec.update(_model=staged["model"], _format=staged["format"], _sha=sha)
                kind = spec["kind"]
                if progress:  # the runner says nothing until it ends: seconds here, minutes on a phone or under qemu
                    print(f"{called(target, kind)}: {path.name}, {staged['examples']} test sentences and "
                          f"{spec.get('runs', 50)} timed runs", file=sys.stderr, flush=True)
                result = {"local": run_local, "ssh": run_ssh, "adb": run_adb}[kind](target, spec, job) \
                    if kind != "qemu-arm64" else run_qemu(target, spec, job, progress)
                check_result(target, result, spec)
            except EdgekitError as e:
                merge(run, target, {"kind": spec["kind"], "model": where, "complete": False, "error": str(e),
                                    "at": time.time()}, sha)
                raise
    predictions = result.pop("predictions", None)
    metrics = metrics_of(result, manifest)
    entry = {"kind": spec["kind"], "model": where,
             "complete": True, "emulated": spec["kind"] == "qemu-arm64" or bool(result.get("emulated")),
             "metrics": metrics, "result": result, "at": time.time(),
             "budgets": pipeline.check_budgets(spec.get("budgets") or {}, metrics)}
    if predictions is not None:
        entry["predictions"] = predictions
    merge(run, target, entry, sha)
    return entry


def stage(run, target: str, into, targets_file=None, model: str = None) -> dict:
    """Write the job for `target` into the new folder `into`, for a device edgekit cannot reach, with job.json saying
    what it holds; returns job.json: `command` runs it there, `merge` brings its result.json back."""
    manifest, run, spec, path = chosen(run, target, targets_file, model)
    into = Path(into)
    if into.name in ("", ".", ".."):
        raise UsageError(f"--stage {into}: give the name of a new folder for the job (job, phone-job)")
    if into.exists() and (not into.is_dir() or any(into.iterdir())):
        raise UsageError(f"--stage {into} exists and is not an empty folder; give a new folder for the job")
    if not into.absolute().parent.is_dir():
        raise UsageError(f"--stage {into}: {into.absolute().parent} is not a folder; give a path in a folder that "
                         f"exists")
    try:  # a compress replacing the model while it is copied: wait for it (a read-only copy of a run needs none)
        held = pipeline.lock(run, wait_s=MERGE_WAIT_S, busy="stage the job when it has finished")
    except OSError:
        held = None
    tmp = Path(tempfile.mkdtemp(prefix=f".{into.name}.", dir=into.absolute().parent))
    try:
        staged = stage_job(run, manifest, path, tmp, spec.get("sentences", 0))
        runtime = staged["format"]  # onnx or tflite: model_file takes no other
        merge_args = ["edgekit", "bench", str(run.resolve()), "--target", target] + \
            (["--targets", str(Path(targets_file).resolve())] if targets_file else []) + \
            (["--model", in_run(path, run)] if model else []) + ["--result", "result.json"]
        job = {"run": str(run.resolve()), "target": target, "model": in_run(path, run),
               "model_sha256": assets.sha256_file(tmp / staged["model"]), "examples": staged["examples"],
               "command": "python3 -m device_bench " + shlex.join(runner_args({  # as the runner caps it: a 32-token
                   **spec, "_model": staged["model"],  # model was shown --seq-len 128
                   "seq_len": min(spec.get("seq_len", 128), staged["max_length"] or 512)}, ".")),
               "merge": shlex.join(merge_args),
               "needs": f"Python 3.9+ with numpy, tokenizers and {runner_module().RUNTIME_PACKAGE[runtime]} (Python "
                        f"3.11+: pip install -r device_bench/requirements-{runtime}.txt)"}
        write_json(tmp / "job.json", job)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o777 & ~umask)  # mkdtemp's 0700 kept others (and a copy through a shared folder) out
        if into.is_dir():
            into.rmdir()
        os.replace(tmp, into)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    finally:
        if held:
            held.close()
    return job


def in_run(path: Path, run: Path) -> str:
    """The model's path as the manifest names it: relative to the run, absolute when --model named one outside."""
    return str(path.relative_to(run)) if path.is_relative_to(run) else str(path)


def _read_text(path: Path, flag: str) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise UsageError(f"{flag} {path}: cannot read it ({getattr(e, 'strerror', None) or e}); give the result.json "
                         f"device_bench wrote on the device")


def merge(run: Path, target: str, entry: dict, sha: str = None) -> None:
    """Write the entry under devices.<target>, holding the run's lock: another bench's merge takes a moment, so
    wait for it; a compress holds it for as long as it runs, and rewrites the manifest when it ends. `sha`: the
    measured file's; a run whose manifest now records another file there (a compress ran meanwhile) is not given
    the old file's numbers."""
    what = f"this {'result' if entry.get('complete') else 'failure'} of target {target} was not saved"
    held = pipeline.lock(run, wait_s=MERGE_WAIT_S, busy=f"{what}; run edgekit bench again when it has finished")
    try:
        manifest = json.loads((run / "manifest.json").read_text())
        files = gate.recorded_files(manifest)
        if sha and entry["model"] in files and files[entry["model"]] != sha:
            raise EdgekitError(f"{entry['model']} changed while target {target} ran (a compress into {run} rewrote "
                               f"it); {what}, as it measured the file before; run edgekit bench again")
        manifest.setdefault("devices", {})[target] = entry
        write_json(run / "manifest.json", manifest)
    finally:
        held.close()


def called(target: str, kind: str, emulated: bool = False) -> str:
    """'target pi4 (ssh)'; 'target local', not 'target local (local)'."""
    said = ", ".join(x for x in (kind if kind != target else "", "emulated" if emulated else "") if x)
    return f"target {target}" + (f" ({said})" if said else "")


def summary(target: str, entry: dict) -> str:
    """What was measured, in a few lines: only what the result holds (benchmark_model has no accuracy nor CPU)."""
    m, r = entry["metrics"], entry["result"]
    lat = r["latency_ms"]
    machine = " ".join(str(r[k]) for k in ("machine", "cpu") if r.get(k))
    head = (f"{called(target, entry['kind'], entry['emulated'])}: {r.get('runtime')}"
            f"{' ' + r['runtime_version'] if r.get('runtime_version') else ''}{' on ' + machine if machine else ''}"
            f"{' (' + r['int8_isa'] + ')' if r.get('int8_isa') else ''}"
            f"{', ' + threads_text(r['threads']) if r.get('threads') else ''}")
    parts = [f"size {number(m['size_mb'], 'MB')} MB" if m.get("size_mb") is not None else "",
             f"load {number(r['load_s'], 's')} s" if r.get("load_s") is not None else "",
             f"latency p50/p90/p99 {'/'.join(number(lat.get(q), 'ms') or '?' for q in ('p50', 'p90', 'p99'))} ms"
             f"{' at ' + str(r['seq_len']) + ' tokens' if r.get('seq_len') else ''}",
             f"peak RSS {number(m['peak_rss_mb'], 'MiB')} MiB" if m.get("peak_rss_mb") is not None else "",
             "throughput " + ", ".join(f"{v:g}/s at {k}" for k, v in r["throughput"].items()).replace("_", " ")
             if r.get("throughput") else ""]
    rows = [head, "  " + ", ".join(p for p in parts if p)]
    if m.get("accuracy") is not None:
        retained = m.get("accuracy_retained")
        f1, f1_kept = m.get("f1_micro"), m.get("f1_micro_retained")
        rows.append(f"  accuracy {number(m['accuracy'])} on {r.get('examples', '?')} sentences"
                    f"{'' if retained is None else f' (retained {number(retained)})'}"
                    f"{'' if f1 is None else f', micro-F1 {number(f1)}'}"
                    f"{'' if f1_kept is None else f' (retained {number(f1_kept)})'}")
    elif r.get("note"):
        rows.append(f"  {r['note']}")
    return "\n".join(rows + gate.lines(entry["budgets"]))
