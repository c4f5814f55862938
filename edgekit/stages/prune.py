"""prune: remove whole attention heads and FFN neurons, and optionally the vocabulary the task never uses.
The matrices really shrink; per-layer head counts, FFN sizes and the vocabulary travel in config.json
(`edgekit_shapes`) so the model reloads through edgekit.load and exports like any other.

Importance is gradient-based (Michel et al., "Are Sixteen Heads Really Better than One?": the expected
|dL/d mask| of each head, here the first-order term |sum ctx_h * dL/dctx_h|, the same for FFN neurons) or
weight magnitude (cheap). `steps` > 1 prunes iteratively, each step followed by recovery training with KD
from the unpruned input model (`recover_from: input`) or from the recipe's fine-tuned teacher (`teacher`). A
teacher that reads other token ids (mpnet-base under minilm-l6: ids shifted by 4; another family) runs once on
its own tokenization of the training set: KD needs only its logits, one row per sentence. `transfer` adds
unlabelled texts to recovery as in distill (KD only), and their word pieces to the kept vocabulary (`vocab`); head
and neuron importance still comes from the labelled training set alone.
"""
import shutil
import sys
from pathlib import Path

import torch
from tqdm import tqdm

from edgekit import data, families, training
from edgekit.artifact import Artifact, through_temp
from edgekit.errors import EdgekitError
from edgekit.progress import bar as progress_bar
from edgekit.stages import evaluate
from edgekit.stages.distill import eval_texts

REVISION = 4  # 2: word pieces outside the kept vocabulary read as [UNK] (they read as [PAD] for BERT configs);
# 3: the kept vocabulary includes the transfer texts' pieces; 4: heads_keep and ffn_keep are fractions of each
# layer's counts as the stage gets them (of the unpruned config's before: a pruned folder kept all it had)


LIMITS = {"heads_keep": "(0, 1]", "ffn_keep": "(0, 1]", "hidden_keep": "(0, 1]", "heads_per_layer": "[0, inf)",
          "importance": ("gradient", "magnitude"), "scope": ("layer", "global"), "steps": "[1, inf)",
          "importance_batches": "[1, inf)", "ffn_multiple": "[1, inf)", "embedding_rank": "[0, inf)",
          "recover_epochs": "[0, inf)", "recover_from": ("input", "teacher")}  # and recipe.COMMON


def run(artifact: Artifact, out_dir: Path, ctx, *, heads_keep: float = 1.0, ffn_keep: float = 1.0,
        hidden_keep: float = 1.0, heads_per_layer: int = 0, importance: str = "gradient", scope: str = "layer",
        steps: int = 1, importance_batches: int = 32, ffn_multiple: int = 64,
        vocab: bool = False, embedding_rank: int = 0, recover_epochs: float = 0.0, lr: float = 5e-5, batch_size: int = 32,
        temperature: float = 2.0, checkpoint_every: int = 100, recover_from: str = "input", transfer: str = "",
        transfer_examples: int = 10000) -> Artifact:
    model = families.named(families.load_model(artifact.path, pairs=ctx.splits.pairs), ctx.splits.labels)
    tokenizer = families.load_tokenizer(artifact.path)
    if hidden_keep < 1:
        families.hidden_parts(model)  # a family it supports, before any work
    source = artifact.path if recover_from == "input" else ctx.teacher.path
    start = sizes(model)  # fractions are of each layer's heads and neurons as the stage gets them (a pruned folder's)
    if heads_per_layer:  # a budget in heads per layer instead of a fraction
        if problem := heads_problem(heads_per_layer, max(start["heads"]), scope):
            raise EdgekitError(problem)
        heads_keep = [min(1.0, heads_per_layer / n) for n in start["heads"]]
    encoded = data.encode(tokenizer, ctx.splits.train, ctx.max_length, ctx.progress)
    recovery, recover_enc = list(ctx.splits.train), encoded  # plus unlabelled transfer texts: KD only (see distill)
    if transfer:
        extra = data.unlabelled(transfer, transfer_examples, ctx.seed, eval_texts(ctx), data.no_label(ctx.splits))
        recovery, recover_enc = recovery + extra, encoded + data.encode(tokenizer, extra, ctx.max_length)
    outside = None
    if vocab:  # the pieces of the text the model is trained on, the transfer texts included: it will read them
        kept = {i for ids, _ in recover_enc for i in ids} | set(tokenizer.all_special_ids)
        keep_vocab(model, sorted(kept), tokenizer.unk_token_id)
        outside = unseen_share(tokenizer, kept, ctx)
    if embedding_rank:
        factorize_embedding(model, embedding_rank)
    teacher = families.load_model(source, pairs=ctx.splits.pairs) if recover_epochs > 0 else None
    if teacher is not None and recover_from == "teacher" and \
            (t_tok := families.load_tokenizer(source)).get_vocab() != tokenizer.get_vocab():
        from edgekit.stages.distill import teacher_outputs

        t_enc = data.encode(t_tok, recovery, ctx.max_length)
        teacher = teacher_outputs(teacher, t_enc, t_tok.pad_token_id, progress=ctx.progress)["logits"]
    for step in range(1, steps + 1):
        step_dir = out_dir / f"step-{step}"
        if (step_dir / "model" / "config.json").is_file():  # finished before a stop: resume after it
            model = families.load_model(step_dir / "model")
            continue
        scores = gradient_importance(model, encoded, tokenizer.pad_token_id, importance_batches, batch_size,
                                     hidden=hidden_keep < 1, progress=ctx.progress,
                                     desc=f"importance, step {step}/{steps}") if importance == "gradient" else None
        shapes = prune_model(model, power(heads_keep, step / steps), ffn_keep ** (step / steps), scores, scope,
                             ffn_multiple, hidden_keep ** (step / steps), start)
        if teacher is not None:
            recover(model, teacher, recover_enc, step_dir, ctx, recover_epochs / steps, lr, batch_size, temperature,
                    checkpoint_every, tokenizer.pad_token_id)
        model.config.edgekit_shapes = shapes
        save(model, tokenizer, step_dir / "model", ctx.max_length)
    save(model, tokenizer, out_dir / "model", ctx.max_length)
    if training.distributed()[0] == 0:  # rank 0 wrote the folder: it alone rewrites its config
        evaluate.tune_folder(out_dir / "model", ctx)  # a multi-label model's thresholds
        for step in range(1, steps + 1):
            shutil.rmtree(out_dir / f"step-{step}", ignore_errors=True)
    shapes = model.config.edgekit_shapes
    return Artifact(out_dir / "model", "hf", {"params": sum(p.numel() for p in model.parameters()),
                                              "heads_kept": shapes["heads"], "ffn_kept": shapes["ffn"],
                                              "heads_before": start["heads"], "ffn_before": start["ffn"],
                                              **({"hidden_kept": shapes["hidden"]} if "hidden" in shapes else {}),
                                              **({"vocab_kept": shapes["vocab"]} if shapes.get("vocab", len(tokenizer)) < len(tokenizer) else {}),
                                              **({"validation_pieces_outside_vocab": outside} if outside is not None else {}),
                                              **({"embedding_rank": embedding_rank} if embedding_rank else {}),
                                              "processes": training.distributed()[1]})


def save(model, tokenizer, path: Path, max_length: int) -> None:
    """Rank 0 writes (under torchrun every rank holds the same weights: same scores, averaged gradients), into a
    temporary folder renamed when complete: a resumed run trusts any step folder with a config.json."""
    rank, world = training.distributed()
    if rank == 0:
        with through_temp(path, path.with_name(path.name + ".tmp")) as tmp:  # a killed save's left is cleared
            families.save_model(model, tokenizer, tmp, max_length)
    if world > 1:
        torch.distributed.barrier()


def recover(model, teacher, encoded, out_dir, ctx, epochs, lr, batch_size, temperature, checkpoint_every, pad_id):
    """Recovery training: KD from `teacher` (the unpruned model or the recipe's teacher, or that teacher's logits
    for every training sentence) plus hard-label CE on the rows that have a label."""
    def loss_fn(m, b):
        inputs = {"input_ids": b["input_ids"], "attention_mask": b["attention_mask"]}
        if torch.is_tensor(teacher):
            t = teacher[b["index"]]
        else:
            with torch.no_grad():
                t = teacher(**inputs).logits
        s = m(**inputs).logits
        return 0.5 * training.soft_label_kd(s, t, temperature, ctx.splits.multi_label) + \
            0.5 * training.labelled_ce(s, b["labels"])

    training.train(model, encoded, loss_fn, out_dir=out_dir, epochs=epochs, lr=lr, batch_size=batch_size, warmup=0.1,
                   weight_decay=0.01, checkpoint_every=checkpoint_every, seed=ctx.seed, pad_id=pad_id,
                   desc="prune recovery", progress=ctx.progress)


def gradient_importance(model, encoded: list, pad_id: int, batches: int, batch_size: int, hidden: bool = False,
                        progress: bool = False, desc: str = "importance") -> dict:
    """Per layer: |sum over tokens of activation * gradient| per head (input of the attention output projection)
    and per FFN neuron (input of the FFN output projection), summed over examples of the training set. ALBERT
    runs its one shared layer once per depth: the sum inside |...| runs over every pass, as one mask on the
    shared head or neuron would see it. With `hidden`, the same per residual-stream dimension, its activation *
    gradient summed over every point that writes the stream (each LayerNorm output), as one mask on that
    dimension would see it (CoFi's hidden mask)."""
    fam = families.family(model.config)
    head_dim = model.config.hidden_size // model.config.num_attention_heads
    blocks = list(families.layers(model))
    captured, hooks = {}, []
    for i, block in enumerate(blocks):
        for part in ("o", "ffn_out"):
            def keep(module, args, key=(part, i)):
                args[0].retain_grad()
                captured.setdefault(key, []).append(args[0])  # one per pass (ALBERT: one per depth)
            hooks.append(block.get_submodule(fam[part]).register_forward_pre_hook(keep))
    stream = []
    if hidden:
        parts = families.hidden_parts(model)
        writers = parts["norms"] + [p for p in parts["writers"] if p.endswith("embeddings_project")]

        def keep_out(module, args, out):
            out.retain_grad()
            stream.append(out)
        hooks += [model.get_submodule(p).register_forward_hook(keep_out) for p in writers]
    heads = [torch.zeros(b.get_submodule(fam["o"]).in_features // head_dim) for b in blocks]
    neurons = [torch.zeros(b.get_submodule(fam["ffn_out"]).in_features) for b in blocks]
    dims = torch.zeros(families.hidden_width(model.config))
    was_training = model.training
    model.eval()  # no dropout: importance of the model as it will run
    bar = progress_bar(total=min(batches, -(-len(encoded) // batch_size)), desc=desc, unit="batch",
                       disable=not progress)  # a forward and backward pass each: minutes for a BERT-base teacher
    try:
        for n, batch in enumerate(data.batches(encoded, batch_size, pad_id, shuffle=True, seed=17)):
            if n >= batches:
                break
            stream.clear()
            captured.clear()
            logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
            training.task_loss(logits, batch["labels"]).backward()
            for i in range(len(blocks)):
                per_head = sum((c * c.grad).reshape(*c.shape[:2], -1, head_dim).sum((1, 3)) for c in captured[("o", i)])
                heads[i] += per_head.abs().sum(0).detach()
                neurons[i] += sum((f * f.grad).sum(1) for f in captured[("ffn_out", i)]).abs().sum(0).detach()
            if stream:
                dims += sum((t * t.grad).sum(1) for t in stream).abs().sum(0).detach()
            model.zero_grad(set_to_none=True)
            bar.update(1)
    finally:
        bar.close()
        for h in hooks:
            h.remove()
        model.train(was_training)
    return {"heads": heads, "ffn": neurons, **({"hidden": dims} if hidden else {})}


def magnitude_importance(model, hidden: bool = False) -> dict:
    fam = families.family(model.config)
    head_dim = model.config.hidden_size // model.config.num_attention_heads
    heads, neurons = [], []
    for block in families.layers(model):
        o = block.get_submodule(fam["o"])
        n_heads = o.in_features // head_dim
        score = sum(block.get_submodule(fam[n]).weight.detach().view(-1, n_heads, head_dim, o.out_features).pow(2)
                    .sum((0, 2, 3)) for n in families.qkv_names(fam))  # a fused Q|K|V: 3 blocks of heads
        heads.append(score + o.weight.detach().view(o.out_features, n_heads, head_dim).pow(2).sum((0, 2)))
        ffn_in, ffn_out = block.get_submodule(fam["ffn_in"]), block.get_submodule(fam["ffn_out"])
        rows = ffn_in.weight.detach().pow(2).sum(1).view(-1, ffn_out.in_features).sum(0)  # a gated FFN: 2 rows each
        neurons.append(rows + ffn_out.weight.detach().pow(2).sum(0))
    scores = {"heads": heads, "ffn": neurons}
    if hidden:  # the squared weights along each residual-stream dimension, over every module that touches it
        parts = families.hidden_parts(model)
        get = model.get_submodule
        scores["hidden"] = sum(get(p).weight.detach().pow(2) for p in parts["norms"]) \
            + sum(get(p).weight.detach().pow(2).sum(0) for p in parts["readers"]) \
            + sum(get(p).weight.detach().pow(2).sum(1) for p in parts["writers"])
    return scores


def sizes(model) -> dict:
    """Heads and FFN neurons in each layer as the model holds them (a pruned folder's from edgekit_shapes)."""
    shapes, n = getattr(model.config, "edgekit_shapes", None) or {}, families.num_layers(model.config)
    return {"heads": list(shapes.get("heads") or [model.config.num_attention_heads] * n),
            "ffn": list(shapes.get("ffn") or [families.ffn_size(model.config)] * n)}


def power(fraction, exponent: float):
    """A fraction (or one per layer) to the step's share of the schedule."""
    return [f ** exponent for f in fraction] if isinstance(fraction, list) else fraction ** exponent


def keep_counts(scores: list, fraction, original, scope: str, multiple: int = 1) -> list:
    """How many units each layer keeps: `fraction` (or one per layer) of its count when the stage began
    (`original`), rounded to the nearest (Python's round: a half to the even count), per layer or ranked globally
    (scores normalised per layer, as Michel et al. do), never fewer than one; then rounded up to a multiple of
    `multiple` where that still keeps fewer than the layer has."""
    fractions = fraction if isinstance(fraction, list) else [fraction] * len(scores)
    originals = original if isinstance(original, list) else [original] * len(scores)
    totals = [max(1, round(o * f)) for o, f in zip(originals, fractions)]
    if scope == "layer":
        counts = [min(len(s), total) for s, total in zip(scores, totals)]
    else:
        normed = [s / (s.norm() + 1e-12) for s in scores]
        flat = torch.cat(normed)
        threshold = flat.topk(min(len(flat), sum(totals))).values.min()
        counts = [max(1, min(len(s), int((s >= threshold).sum()))) for s in normed]
    rounded = [-(-n // multiple) * multiple for n in counts]
    return [r if r < len(s) else n for n, r, s in zip(counts, rounded, scores)]


def prune_model(model, heads_keep, ffn_keep: float, scores: dict = None, scope: str = "layer",
                ffn_multiple: int = 1, hidden_keep: float = 1.0, start: dict = None) -> dict:
    """Keep the most important heads and FFN neurons of every layer (fractions of each layer's counts in `start`,
    by default the model's own now; `heads_keep` may be one per layer), and with
    `hidden_keep` < 1 the most important residual-stream dimensions in every module that touches the stream. FFN
    and hidden widths round up to a multiple of `ffn_multiple`: INT8 GEMM kernels work in column tiles (XNNPACK's
    AVX512-VNNI kernel is 5 x 64), and a width that is not a multiple of the tile pays for the tile's padding anyway
    (measured on edge-small's TFLite file: 538 -> 576 neurons, 7% more FLOPs, 1.3% more time)."""
    fam = families.family(model.config)
    head_dim = model.config.hidden_size // model.config.num_attention_heads
    if scores is None or (hidden_keep < 1 and "hidden" not in scores):
        scores = {**magnitude_importance(model, hidden=hidden_keep < 1), **(scores or {})}
    start = start or sizes(model)
    n_heads = keep_counts(scores["heads"], heads_keep, start["heads"], scope)
    n_ffn = keep_counts(scores["ffn"], ffn_keep, start["ffn"], scope, ffn_multiple)
    shapes = dict(getattr(model.config, "edgekit_shapes", None) or {}, heads=[], ffn=[])
    cut = families.linear_slice
    for block, head_score, ffn_score, h, f in zip(families.layers(model), scores["heads"], scores["ffn"], n_heads, n_ffn):
        heads = sorted(head_score.topk(h).indices.tolist())
        rows = torch.tensor([x * head_dim + j for x in heads for j in range(head_dim)])
        for name in families.qkv_names(fam):
            linear = block.get_submodule(fam[name])
            families.replace_module(block, fam[name], cut(linear, families.head_rows(name, linear, rows), out=True))
        families.replace_module(block, fam["o"], cut(block.get_submodule(fam["o"]), rows, out=False))
        if fam.get("bias_heads"):
            families.keep_bias_heads(block.get_submodule(fam["bias_heads"]), heads)
        if fam.get("heads"):
            families.count_heads(block.get_submodule(fam["heads"]), rows, len(heads))
        neurons = ffn_score.topk(f).indices.sort().values
        ffn_in = block.get_submodule(fam["ffn_in"])
        families.replace_module(block, fam["ffn_in"], cut(ffn_in, families.ffn_rows(fam, ffn_in, neurons), out=True))
        families.replace_module(block, fam["ffn_out"], cut(block.get_submodule(fam["ffn_out"]), neurons, out=False))
        shapes["heads"].append(len(heads))
        shapes["ffn"].append(len(neurons))
    if hidden_keep < 1:
        width = keep_counts([scores["hidden"]], hidden_keep, model.config.hidden_size, "layer", ffn_multiple)[0]
        families.narrow_hidden(model, scores["hidden"].topk(width).indices.sort().values)
        shapes["hidden"] = width
    model.config.edgekit_shapes = shapes
    return shapes


def keep_vocab(model, token_ids: list, unk: int | None) -> None:
    """Keep only these rows of the word embeddings; other token ids map to the unknown token's row (`unk`, the
    tokenizer's; BERT configs carry no unk_token_id, and a config lookup sent them to the padding row: on
    edge-base 57% of vader-amazon sentences had a word piece read as [PAD]). Without an unknown token (byte-level
    BPE has none), they share one more row, the mean of the rows dropped (row 0 was <s>, the row the classifier
    reads). A table already pruned (or factorized) keeps its rows of these ids, read through its remap; ids it
    dropped stay on the unknown token's row."""
    embedding = model.get_input_embeddings()
    if not isinstance(embedding, families.RemappedEmbedding):  # the identity remap: every token keeps its row
        embedding = families.RemappedEmbedding(torch.arange(embedding.num_embeddings), embedding)
    ids = torch.tensor(sorted(set(token_ids) | ({unk} if isinstance(unk, int) else set())))
    keep = sorted(set(embedding.remap[ids].tolist()))  # rows of the current table
    new_row = {r: n for n, r in enumerate(keep)}
    table = embedding.weight.detach()
    rows = [table[torch.tensor(keep)]]
    if not isinstance(unk, int):
        dropped = torch.ones(len(table), dtype=torch.bool)
        dropped[torch.tensor(keep)] = False
        rows.append(table[dropped].mean(0, keepdim=True) if dropped.any() else torch.zeros_like(table[:1]))
    remap = torch.full((embedding.num_embeddings,), new_row[int(embedding.remap[unk])] if isinstance(unk, int) else
                       len(keep), dtype=torch.long)
    remap[ids] = torch.tensor([new_row[r] for r in embedding.remap[ids].tolist()])
    small = torch.nn.Embedding(sum(len(r) for r in rows), embedding.embedding.embedding_dim)
    small.weight.data.copy_(torch.cat(rows))
    model.set_input_embeddings(families.RemappedEmbedding(remap, small, embedding.project))
    model.config.edgekit_shapes = dict(getattr(model.config, "edgekit_shapes", None) or {}, vocab=len(small.weight))


UNSEEN_WARNING = 0.05  # on rt-polarity, 1.9% of test pieces fall outside what its training text keeps


def unseen_share(tokenizer, kept: set, ctx) -> float | None:
    """The share of the validation split's word pieces that the kept vocabulary reads as the unknown token (None
    without a validation split), with a warning from UNSEEN_WARNING on: text unlike the training text (another
    language, another domain) loses those words."""
    pieces = [i for ids, _ in data.encode(tokenizer, ctx.splits.validation, ctx.max_length) for i in ids]
    if not pieces:
        return None
    share = round(sum(i not in kept for i in pieces) / len(pieces), 4)
    if share >= UNSEEN_WARNING:
        tqdm.write(f"edgekit: warning: prune.vocab: {share:.1%} of the validation split's word pieces are not in the "
                   f"vocabulary kept from the training text and read as unknown; add text like it to the training data "
                   f"or prune.transfer, or set prune.vocab to false", file=sys.stderr)
    return share


def heads_problem(heads_per_layer: int, heads: int, scope: str = "layer") -> str:
    """'' or why the model cannot keep that many heads per layer (also asked before any stage: edgekit.pipeline)."""
    if heads_per_layer and not 1 <= heads_per_layer <= heads:
        return f"prune.heads_per_layer={heads_per_layer}: the model it prunes has {heads} heads per layer; give 1..{heads}"
    if heads_per_layer and scope != "layer":
        return (f"prune.heads_per_layer={heads_per_layer} keeps that many heads in every layer, which scope: {scope} "
                f"does not (it ranks heads across layers); give scope: layer, or heads_keep instead")
    return ""


def rank_problem(rank: int, width: int, rows: int = None) -> str:
    """'' or why the embedding table of this width (and number of rows, once known) cannot be factorized at that
    rank."""
    if rank and not 0 < rank < width:
        return f"prune.embedding_rank={rank}: give 1..{width - 1} (the embedding width is {width}), or 0 to keep the full table"
    if rank and rows is not None and rank >= rows:
        return (f"prune.embedding_rank={rank}: the table keeps only {rows} word pieces (vocab: true keeps those of the "
                f"training text), so a rank-{rank} factorization would not be smaller; give less than {rows}, or 0")
    return ""


def factorize_embedding(model, rank: int) -> None:
    """ALBERT's factorized embedding: the V x hidden word table becomes V x rank rows times a rank x hidden
    projection, initialised with the truncated SVD (the closest rank-r table); recovery training adapts both."""
    embedding = model.get_input_embeddings()
    if not isinstance(embedding, families.RemappedEmbedding):  # the identity remap: every token keeps its row
        embedding = families.RemappedEmbedding(torch.arange(embedding.num_embeddings), embedding)
    if embedding.project is not None:
        raise EdgekitError("prune.embedding_rank: this model's embedding is already factorized; leave it out")
    table = embedding.embedding.weight.detach()
    if problem := rank_problem(rank, table.shape[1], table.shape[0]):
        raise EdgekitError(problem)
    u, s, vh = torch.linalg.svd(table, full_matrices=False)
    rows = torch.nn.Embedding(table.shape[0], rank)
    rows.weight.data.copy_(u[:, :rank] * s[:rank])
    project = torch.nn.Linear(rank, table.shape[1], bias=False)
    project.weight.data.copy_(vh[:rank].T)
    model.set_input_embeddings(families.RemappedEmbedding(embedding.remap, rows, project))
    model.config.edgekit_shapes = dict(getattr(model.config, "edgekit_shapes", None) or {}, vocab=table.shape[0],
                                       embedding_rank=rank)
