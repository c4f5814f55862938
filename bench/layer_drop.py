"""Which layers to keep: every way to keep K of a fine-tuned model's layers, scored on the validation split
before any training (Sajjad et al., "On the Effect of Dropping Layers of Pre-trained Transformer Models").
The best subset is the starting point to distill a shallower student from (distill.layers).

    python bench/layer_drop.py MODEL_DIR --keep 4 [--data rt-polarity]

Writes bench/results/layer-drop-<keep>.json and .md (subsets best first).
"""
import argparse
import itertools
import json
import os
import sys
from pathlib import Path

import torch
from tqdm import tqdm

from edgekit import data, families


def accuracy(model, encoded: list, pad_id: int) -> float:
    correct = 0
    with torch.no_grad():
        for b in data.batches(encoded, 64, pad_id, shuffle=False, seed=0):
            logits = model(input_ids=b["input_ids"], attention_mask=b["attention_mask"]).logits
            correct += (logits.argmax(-1) == b["labels"]).sum().item()
    return round(correct / len(encoded), 4)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", type=Path, help="a fine-tuned model folder")
    ap.add_argument("--keep", type=int, required=True, help="layers to keep")
    ap.add_argument("--data", default="rt-polarity")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    model = families.load_model(args.model).eval()
    depth = families.num_layers(model.config)
    if not 1 <= args.keep < depth:
        sys.exit(f"layer_drop: --keep {args.keep}: this model has {depth} layers; give 1..{depth - 1}")
    tok = families.load_tokenizer(args.model)
    encoded = data.encode(tok, data.load(args.data).validation, 128)
    rows = [{"keep": "all", "accuracy": accuracy(model, encoded, tok.pad_token_id)}]
    for keep in tqdm(list(itertools.combinations(range(depth), args.keep)), desc="subsets", unit="subset"):
        rows.append({"keep": list(keep), "accuracy": accuracy(families.student_from_teacher(model, list(keep)).eval(),
                                                              encoded, tok.pad_token_id)})
    rows[1:] = sorted(rows[1:], key=lambda r: -r["accuracy"])
    out = args.out or Path(f"bench/results/layer-drop-{args.keep}.json")
    result = {"model": str(args.model), "data": args.data, "split": "validation", "examples": len(encoded),
              "subsets": rows}
    lines = [f"Keeping {args.keep} of {depth} layers of `{args.model}`, no training; accuracy on {args.data} "
             f"validation ({len(encoded)} sentences).", "", "| layers kept | accuracy |", "|---|---:|"]
    lines += [f"| {r['keep'] if r['keep'] == 'all' else ', '.join(map(str, r['keep']))} | {r['accuracy']:.4f} |"
              for r in rows]
    for path, text in ((out, json.dumps(result, indent=1)), (out.with_suffix(".md"), "\n".join(lines) + "\n")):
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(text)
        os.replace(tmp, path)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
