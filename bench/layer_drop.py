"""Which layers to keep: every way to keep K of a fine-tuned model's layers, scored on the validation split
before any training (Sajjad et al., "On the Effect of Dropping Layers of Pre-trained Transformer Models").
The best subset is the starting point to distill a shallower student from (distill.layers).

    python bench/layer_drop.py MODEL_DIR --keep 4 [--data rt-polarity]

Writes bench/results/layer-drop-<keep>.json and .md (subsets best first).
"""
import itertools
import json
import os
import sys
from pathlib import Path

from tqdm import tqdm

from edgekit import cli, data, families, runtime
from edgekit.stages import evaluate


def main():
    ap = cli.Parser(description=cli.description(__doc__))
    ap.add_argument("model", type=Path, help="a fine-tuned model folder")
    ap.add_argument("--keep", type=int, required=True, help="layers to keep")
    ap.add_argument("--data", default="rt-polarity", help="the dataset whose validation split scores each subset "
                                                          "(default rt-polarity)")
    ap.add_argument("--out", type=Path, default=None, help="the result JSON, its .md beside it (default "
                                                           "bench/results/layer-drop-<keep>.json)")
    args = ap.parse_args()
    hf = runtime.load(args.model)  # evaluate.accuracy's interface; each subset is swapped in as hf.model
    model = hf.model
    depth = families.num_layers(model.config)
    if not 1 <= args.keep < depth:
        sys.exit(f"layer_drop: --keep {args.keep}: this model has {depth} layers; give 1..{depth - 1}")
    examples = data.load(args.data).validation
    rows = [{"keep": "all", "accuracy": evaluate.accuracy(hf, examples, 64, False, "all")}]
    for keep in tqdm(list(itertools.combinations(range(depth), args.keep)), desc="subsets", unit="subset"):
        hf.model = families.student_from_teacher(model, list(keep))
        rows.append({"keep": list(keep), "accuracy": evaluate.accuracy(hf, examples, 64, False, str(keep))})
    rows[1:] = sorted(rows[1:], key=lambda r: -r["accuracy"])
    out = args.out or Path(f"bench/results/layer-drop-{args.keep}.json")
    result = {"model": str(args.model), "data": args.data, "split": "validation", "examples": len(examples),
              "subsets": rows}
    lines = [f"Keeping {args.keep} of {depth} layers of `{args.model}`, no training; accuracy on {args.data} "
             f"validation ({len(examples)} sentences).", "", "| layers kept | accuracy |", "|---|---:|"]
    lines += [f"| {r['keep'] if r['keep'] == 'all' else ', '.join(map(str, r['keep']))} | {r['accuracy']:.4f} |"
              for r in rows]
    for path, text in ((out, json.dumps(result, indent=1)), (out.with_suffix(".md"), "\n".join(lines) + "\n")):
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(text)
        os.replace(tmp, path)
    print("\n".join(lines))


if __name__ == "__main__":
    from edgekit.cli import script

    sys.exit(script(main))
