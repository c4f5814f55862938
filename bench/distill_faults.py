"""SIGKILL inside a two-phase, augmented, narrow-student distillation (the paths bench/faults.py's small recipe
does not take), run it again, and compare with an uninterrupted run of the same seed.

    python bench/distill_faults.py [--points 0.1 0.3 0.5 0.7 0.9] [--out bench/results/distill-faults.json]

Tiny teacher and data from edgekit.testing; the kill lands a fraction of the way into the distill stage (timed
from the reference run), so early points land in augmentation, the teacher pass or phase 1 and later ones in
phase 2. Every re-run must exit 0 and match the reference (bench/faults.py's checks: stage metrics, files'
sha256, final predictions within 1e-3).
"""
import json
import os
import random
import signal
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import faults  # noqa: E402  (the kill-and-compare helpers)

from edgekit import cli, testing  # noqa: E402
from edgekit.artifact import write_json  # noqa: E402

DISTILL = ("{epochs: 2, intermediate_epochs: 1, lr: 3.0e-3, batch_size: 16, checkpoint_every: 5, cosine: 0.0, "
           "embedding: 1.0, attention: 1.0, hidden: 1.0, augment: 1, "
           "student_config: {hidden_size: 16, num_attention_heads: 2, intermediate_size: 32, num_hidden_layers: 2}}")


def main(argv=None):
    p = cli.Parser(description=cli.description(__doc__))
    p.add_argument("--points", type=float, nargs="+", default=[0.1, 0.3, 0.5, 0.7, 0.9],
                   help="where to kill, as fractions of the distill stage's time (default 0.1 0.3 0.5 0.7 0.9)")
    p.add_argument("--out", type=Path, default=Path("bench/results/distill-faults.json"),
                   help="the result JSON (default bench/results/distill-faults.json)")
    a = p.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="edgekit-distill-faults-"))
    os.environ["EDGEKIT_CACHE"] = str(work / "cache")  # the augmented set is cached here, as in a real run
    model = testing.make_model_dir(work / "teacher")
    data = testing.make_csv(work / "reviews.csv", n=1200)
    recipe = work / "distill.yaml"
    recipe.write_text(f"description: two-phase distillation kills\nteacher: {model}\ndata: {{source: {data}}}\n"
                      f"max_length: 32\nstages: [distill]\ndistill: {DISTILL}\n")
    texts = [testing.sentence(random.Random(i), i % 2) for i in range(64)]
    reference = work / "reference"
    rc, _ = faults.compress(recipe, reference)
    assert rc == 0, "the uninterrupted reference run failed"
    seconds = json.loads((reference / "manifest.json").read_text())["stages"][0]["seconds"]
    results = []
    for point in a.points:
        out = work / f"kill-{point}"
        rc, killed_in = faults.compress(recipe, out, "distill", point, seconds)
        phase = "phase 2" if (out / "01-distill.partial" / "checkpoint").exists() else \
            "phase 1" if (out / "01-distill.partial" / "intermediate" / "checkpoint").exists() else "before a checkpoint"
        rerun_rc, _ = faults.compress(recipe, out)
        problems = faults.mismatches(reference, out, texts) if rerun_rc == 0 else [f"re-run exited {rerun_rc}"]
        row = {"point": point, "killed": killed_in is not None and rc == -signal.SIGKILL, "landed_in": phase,
               "resumed": rerun_rc == 0, "problems": problems}
        results.append(row)
        print(f"distill at {point:.2f}: {'killed, ' + phase if row['killed'] else 'finished first'}, re-run "
              f"{'ok' if row['resumed'] else 'FAILED'}, {len(problems)} mismatches {'; '.join(problems[:3])}", flush=True)
    kills = sum(r["killed"] for r in results)
    resumed = sum(r["killed"] and r["resumed"] for r in results)
    bad = sum(bool(r["problems"]) for r in results)
    a.out.parent.mkdir(parents=True, exist_ok=True)
    write_json(a.out, {"kills": kills, "resumed": resumed, "mismatches": bad, "reference_seconds": seconds,
                       "distill": DISTILL, "runs": results})
    print(f"{kills} kills, {resumed} resumed, {bad} mismatches")
    return 0 if bad == 0 and resumed == kills else 1


if __name__ == "__main__":
    from edgekit.cli import script

    sys.exit(script(main))
