"""prune: remove whole attention heads and FFN neurons by weight magnitude; the matrices really shrink.

Per-layer head counts and FFN sizes are written to config.json (`edgekit_shapes`) so the model reloads
through edgekit.load and exports like any other. Optional recovery training distils from the input model.
"""
from pathlib import Path

import torch
import torch.nn.functional as F

from edgekit import data, families, training
from edgekit.artifact import Artifact
from edgekit.errors import EdgekitError


def run(artifact: Artifact, out_dir: Path, ctx, *, heads_keep: float = 1.0, ffn_keep: float = 1.0,
        recover_epochs: float = 0.0, lr: float = 5e-5, batch_size: int = 32, temperature: float = 2.0,
        checkpoint_every: int = 100) -> Artifact:
    if not 0 < heads_keep <= 1 or not 0 < ffn_keep <= 1:
        raise EdgekitError(f"prune.heads_keep={heads_keep}, prune.ffn_keep={ffn_keep}: each must be a fraction in (0, 1]; "
                           f"a layer always keeps at least one head")
    model = families.load_model(artifact.path)
    tokenizer = families.load_tokenizer(artifact.path)
    if heads_keep < 1 and model.config.model_type == "mpnet":
        raise EdgekitError("head pruning is not supported for MPNet (its relative position bias is shared across "
                           "layers); use prune.heads_keep=1.0 and prune FFN neurons only")
    teacher = families.load_model(artifact.path) if recover_epochs > 0 else None
    shapes = prune_model(model, heads_keep, ffn_keep)
    if teacher is not None:
        T = temperature

        def loss_fn(m, b):
            inputs = {"input_ids": b["input_ids"], "attention_mask": b["attention_mask"]}
            with torch.no_grad():
                t = teacher(**inputs).logits
            s = m(**inputs).logits
            kd = F.kl_div(F.log_softmax(s / T, -1), F.softmax(t / T, -1), reduction="batchmean") * T * T
            return 0.5 * kd + 0.5 * F.cross_entropy(s, b["labels"])

        training.train(model, data.encode(tokenizer, ctx.splits.train, ctx.max_length), loss_fn, out_dir=out_dir,
                       epochs=recover_epochs, lr=lr, batch_size=batch_size, warmup=0.1, weight_decay=0.01,
                       checkpoint_every=checkpoint_every, seed=ctx.seed, pad_id=tokenizer.pad_token_id,
                       desc="prune recovery", progress=ctx.progress)
    model.config.edgekit_shapes = shapes
    families.save_model(model, tokenizer, out_dir / "model")
    return Artifact(out_dir / "model", "hf", {"params": sum(p.numel() for p in model.parameters()),
                                              "heads_kept": shapes["heads"], "ffn_kept": shapes["ffn"]})


def prune_model(model, heads_keep: float, ffn_keep: float) -> dict:
    """Keep the largest-norm heads and FFN neurons of every layer; returns the per-layer shapes."""
    fam = families.family(model.config)
    head_dim = model.config.hidden_size // model.config.num_attention_heads
    shapes = {"heads": [], "ffn": []}
    for block in families.layers(model):
        q, k, v, o = (block.get_submodule(fam[n]) for n in ("q", "k", "v", "o"))
        n_heads = q.out_features // head_dim
        score = sum(lin.weight.detach().view(n_heads, head_dim, -1).pow(2).sum((1, 2)) for lin in (q, k, v))
        score = score + o.weight.detach().view(o.out_features, n_heads, head_dim).pow(2).sum((0, 2))
        heads = sorted(score.topk(max(1, round(n_heads * heads_keep))).indices.tolist())
        rows = torch.tensor([h * head_dim + j for h in heads for j in range(head_dim)])
        for name in ("q", "k", "v"):
            families.replace_module(block, fam[name], _slice(block.get_submodule(fam[name]), rows, out=True))
        families.replace_module(block, fam["o"], _slice(o, rows, out=False))
        ffn_in, ffn_out = block.get_submodule(fam["ffn_in"]), block.get_submodule(fam["ffn_out"])
        score = ffn_in.weight.detach().pow(2).sum(1) + ffn_out.weight.detach().pow(2).sum(0)
        neurons = score.topk(max(1, round(ffn_in.out_features * ffn_keep))).indices.sort().values
        families.replace_module(block, fam["ffn_in"], _slice(ffn_in, neurons, out=True))
        families.replace_module(block, fam["ffn_out"], _slice(ffn_out, neurons, out=False))
        shapes["heads"].append(len(heads))
        shapes["ffn"].append(len(neurons))
    return shapes


def _slice(linear, index, out: bool):
    """A new Linear keeping output rows (out=True) or input columns (out=False) at `index`."""
    weight = linear.weight.detach()[index] if out else linear.weight.detach()[:, index]
    new = torch.nn.Linear(weight.shape[1], weight.shape[0], bias=linear.bias is not None)
    new.weight.data.copy_(weight)
    if linear.bias is not None:
        new.bias.data.copy_(linear.bias.detach()[index] if out else linear.bias.detach())
    return new
