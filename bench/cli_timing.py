"""Wall time of the CI-facing commands against their targets, in one run: `edgekit gate` on a finished run
(target 3 s), the size-only gate on the final model file (target 1 s), and `edgekit compare --families`
(target 5 min; skip it with --no-families). Each command runs as a user would, in a fresh process.

    python bench/cli_timing.py artifacts/distilbert-int8 [--repeat 3] [--out bench/results]
"""
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from edgekit import cli
from edgekit.artifact import write_json, write_text


def timed(args: list, repeat: int) -> dict:
    seconds, code = [], None
    for _ in range(repeat):
        t = time.perf_counter()
        code = subprocess.run([sys.executable, "-m", "edgekit.cli", *args], capture_output=True).returncode
        seconds.append(time.perf_counter() - t)
    return {"command": "edgekit " + " ".join(args), "exit_code": code, "seconds_median": round(statistics.median(seconds), 3),
            "seconds": [round(s, 3) for s in seconds]}


def main(argv=None):
    p = cli.Parser(description=cli.description(__doc__))
    p.add_argument("run", type=Path, help="a finished run folder (artifacts/distilbert-int8)")
    p.add_argument("--repeat", type=int, default=3, help="timed calls per gate command; the median is kept (default 3)")
    p.add_argument("--no-families", action="store_true", help="skip the `edgekit compare --families` timing (minutes)")
    p.add_argument("--out", type=Path, default=Path("bench/results"),
                   help="folder for cli_timing.json and .md (default bench/results)")
    a = p.parse_args(argv)
    final = a.run / json.loads((a.run / "manifest.json").read_text())["final"]["path"]
    rows = [dict(timed(["gate", str(a.run)], a.repeat), target_s=3.0),
            dict(timed(["gate", str(final), "--max-size-mb", "100"], a.repeat), target_s=1.0)]
    if not a.no_families:
        with tempfile.TemporaryDirectory() as work:
            rows.append(dict(timed(["compare", "--families", "--out", work], 1), target_s=300.0))
    for r in rows:
        r["ratio_to_target"] = round(r["seconds_median"] / r["target_s"], 3)
    a.out.mkdir(parents=True, exist_ok=True)
    write_json(a.out / "cli_timing.json", rows)
    lines = ["| command | exit | median s | target s | ratio |", "|---|---:|---:|---:|---:|"]
    lines += [f"| `{r['command']}` | {r['exit_code']} | {r['seconds_median']} | {r['target_s']:g} | {r['ratio_to_target']} |"
              for r in rows]
    write_text(a.out / "cli_timing.md", "\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    from edgekit.cli import script

    sys.exit(script(main))
