"""distill: teacher -> a smaller student, with the losses of Hinton, DistilBERT, PKD and TinyBERT.

Student (`student`):
- teacher (default): the teacher's own layers listed in `layers` (every_other: 1, 3, 5, ...: DistilBERT's
  initialisation). With `student_config` (hidden_size, num_hidden_layers, intermediate_size,
  num_attention_heads) a smaller model of the teacher's family instead, initialised from the teacher's layers
  `layers` where shapes allow (families.student_from_config).
- another pretrained checkpoint (an asset name or a model folder, e.g. minilm-l6 under mpnet-base), cut to
  `layers` of its own (all keeps every layer). It keeps its own tokenizer, and its new classifier head starts
  at random. Token-level losses (cosine, embedding, attention, hidden MSE) need both tokenizations to give the
  same word pieces at every position (special tokens matched by role: [CLS]/<s>, [SEP]/</s>); this is checked
  on the training set. minilm-l6 and mpnet-base pass: the same uncased WordPiece vocabulary, MPNet's ids
  shifted by 4. When they differ the stage falls back to logit-only KD + CE (plus PKD on the first token's
  vector, which every tokenization has) and says so in its metrics (`token_losses`).

Loss, every weight 0 switches its term off (losses in distill_losses; per-layer terms averaged over layers):
  alpha * T^2 * KL(soft) + (1 - alpha) * CE + cosine * last-hidden cosine + embedding * embedding MSE
  + attention * attention MSE + hidden * hidden MSE + pkd * PKD [CLS]
Layers are paired by `layer_map`: uniform, last, or a list of teacher layers, one per student layer. Different
widths get learned projections (`projection: false` makes a difference in width an error).

Two phases, TinyBERT-style, when intermediate_epochs > 0: the intermediate-layer terms (embedding, attention,
hidden, pkd, cosine) alone for intermediate_epochs, then prediction-layer distillation (soft KD + CE) for epochs.

`augment: N` adds up to N augmented copies of each training sentence (edgekit.augment; cached, size reported).
Replacement words come from the teacher folder's masked-LM head, or its embedding neighbours without one;
`augment_model` names another model for them (an asset, a folder or a hub id, any vocabulary: replacements are
whole words). A finetune stage writes a classifier without the MLM head, so TinyBERT's setup (BERT-base's
pretrained masked-LM proposing words) is `augment_model: bert-base-uncased`, or the folder the teacher came from.
Teacher outputs are computed once: the logits always, the hidden states and attention maps the losses use too
when their fp16 size fits in `cache_mb`; otherwise the teacher runs with each batch for those.
`transfer: tweets-3class` (or a local .txt file, one text per line) adds `transfer_examples` texts without labels
after the augmented copies: the student learns the teacher's logits (and hidden states) on them, with no CE term.
It is meant for text from the domain a model will meet outside its labelled data. On edge-base, 10k tweets
lifted vader-amazon 2.3 points in a one-epoch probe, but through the whole stage they did not (0.7612 against
0.7695 FP32; docs/edge-recipes-log.md), so the recipe does not use them. Half of vader-amazon's own sentences
did: the other half rose from 0.7723 to 0.8011 (bench/domain_transfer.py).
`init_from`: weights of an earlier run (its checkpoint folder, model folder or a .safetensors file); they must fit
the student exactly, and the student starts from them.
`student_finetune: E` first trains the student alone on the task's hard labels for E epochs (at `lr`), so
distillation starts from a task model rather than a random classifier head: a fine-tuned minilm-l6 start lifted
its 4-layer student under mpnet-base from 0.8364 to 0.8447 (bench/distill_targets.py, four-kd).
"""
import shutil
from pathlib import Path

import torch
import torch.nn.functional as F

from edgekit import data, distill_losses as losses, families, training
from edgekit.artifact import Artifact
from edgekit.errors import EdgekitError
from edgekit.progress import bar as progress_bar
from edgekit.stages import evaluate

INTERMEDIATE = ("cosine", "embedding", "attention", "hidden", "pkd")
TOKEN_LEVEL = ("cosine", "embedding", "attention", "hidden")


LIMITS = {"layers": ("every_other", "all"), "layer_map": losses.MAPS, "intermediate_epochs": "[0, inf)",
          "alpha": "[0, 1]", "cosine": "[0, inf)", "embedding": "[0, inf)", "attention": "[0, inf)",
          "hidden": "[0, inf)", "pkd": "[0, inf)", "augment": "[0, inf)", "augment_p": "(0, 1]",
          "augment_k": "[1, inf)", "cache_mb": "[0, inf)", "student_finetune": "[0, inf)"}  # and recipe.COMMON


def run(artifact: Artifact, out_dir: Path, ctx, *, student: str = "teacher", layers: list | str = "every_other",
        student_config: dict | None = None, init_from: str = "", layer_map: list | str = "uniform",
        epochs: float = 2.0, intermediate_epochs: float = 0.0, lr: float = 1e-4, batch_size: int = 32,
        temperature: float = 2.0, alpha: float = 0.5, cosine: float = 1.0, embedding: float = 0.0,
        attention: float = 0.0, hidden: float = 0.0, pkd: float = 0.0, projection: bool = True, augment: int = 0,
        augment_p: float = 0.3, augment_k: int = 15, augment_model: str = "", warmup: float = 0.1,
        weight_decay: float = 0.01,
        checkpoint_every: int = 100, cache_teacher: bool = True, cache_mb: int = 1024,
        student_finetune: float = 0.0, transfer: str = "", transfer_examples: int = 10000) -> Artifact:
    weights = {"kd": alpha, "ce": 1 - alpha, "cosine": cosine, "embedding": embedding, "attention": attention,
               "hidden": hidden, "pkd": pkd}
    if problem := loss_problem(intermediate_epochs, weights):  # ranges: LIMITS, before any stage
        raise EdgekitError(problem)
    teacher = families.named(families.load_model(artifact.path, pairs=ctx.splits.pairs), ctx.splits.labels)
    t_tok = families.load_tokenizer(artifact.path)
    model, s_tok, keep, init_share = build_student(teacher, t_tok, student, layers, student_config)
    if ctx.splits.pairs and (sep := families.pair_separator(s_tok)) is not None:
        families.derive_segments(model, sep)
    t_depth, s_depth = families.num_layers(teacher.config), families.num_layers(model.config)
    pairs = losses.layer_map(layer_map, s_depth, t_depth)
    if init_from:
        check_init_labels(init_from, families.label_names(teacher.config))
        state = training.read_weights(init_from)
        training.load_weights(model, {k: v for k, v in state.items() if not k.startswith("extra.")}, init_from)
    examples, notes = list(ctx.splits.train), {}
    settings = dict(lr=lr, batch_size=batch_size, warmup=warmup, weight_decay=weight_decay,
                    checkpoint_every=checkpoint_every, seed=ctx.seed, pad_id=s_tok.pad_token_id, progress=ctx.progress)
    if student_finetune:
        notes["student_finetune_loss"] = round(training.train(
            model, data.encode(s_tok, examples, ctx.max_length), training.hard_label_loss,
            out_dir=out_dir / "student-finetune", epochs=student_finetune, desc="distill (student fine-tune)",
            **settings), 4)
    if augment:
        from edgekit import augment as augmenting

        source, a_tok = artifact.path, t_tok
        if augment_model:
            from edgekit.pipeline import resolve_model

            source = resolve_model(augment_model).path
            a_tok = families.load_tokenizer(source)
        extra, notes["augment_source"] = augmenting.augment(source, a_tok, examples, augment, augment_p, augment_k,
                                                            ctx.seed, ctx.progress)
        examples += extra
        notes["augmented_examples"] = len(extra)
    if transfer:
        extra = data.unlabelled(transfer, transfer_examples, ctx.seed, eval_texts(ctx), data.no_label(ctx.splits))
        examples += extra
        notes["transfer_examples"] = len(extra)
    s_enc = data.encode(s_tok, examples, ctx.max_length, ctx.progress)
    t_enc = s_enc if s_tok is t_tok else data.encode(t_tok, examples, ctx.max_length)
    notes["token_losses"] = "on"
    if s_tok is not t_tok and not tokens_align(s_tok, t_tok, s_enc, t_enc):
        notes["token_losses"] = "off: the tokenizations differ; logit KD, CE and PKD only"
        weights.update({k: 0.0 for k in TOKEN_LEVEL})
    widths = (families.hidden_width(model.config), families.hidden_width(teacher.config))
    proj_emb = losses.projection(*widths, projection, "distill.embedding", ctx.seed) if weights["embedding"] else None
    proj_hid = losses.projection(*widths, projection, "distill.hidden/pkd/cosine", ctx.seed + 1) \
        if any(weights[k] for k in ("hidden", "pkd", "cosine")) else None
    if weights["attention"]:
        for m in (teacher, model):
            m.set_attn_implementation("eager")  # attention maps are returned by the eager path only
    for p in teacher.parameters():
        p.requires_grad_(False)
    need = needs(weights, pairs, t_depth)
    # under one epoch in all, no example is read twice: a cache would only make the teacher read every one of them
    once = epochs + intermediate_epochs < 1
    view = TeacherView(teacher, t_enc, t_tok.pad_token_id, need, cache_teacher and not once, cache_mb, ctx.progress)
    projections = [p.weight for p in (proj_emb, proj_hid) if p is not None]
    phase_losses = {}
    if intermediate_epochs > 0:
        first = {k: (v if k in INTERMEDIATE else 0.0) for k, v in weights.items()}
        phase_losses["intermediate_loss"] = training.train(
            model, s_enc, loss_fn(first, pairs, t_depth, temperature, proj_emb, proj_hid, view, ctx.splits.multi_label),
            out_dir=out_dir / "intermediate", epochs=intermediate_epochs, desc="distill (intermediate layers)",
            extra_params=projections, **settings)
        weights = {k: (v if k in ("kd", "ce") else 0.0) for k, v in weights.items()}
        projections = []
    loss = training.train(model, s_enc, loss_fn(weights, pairs, t_depth, temperature, proj_emb, proj_hid, view,
                                           ctx.splits.multi_label),
                          out_dir=out_dir, epochs=epochs, desc="distill", extra_params=projections, **settings)
    rank, world = training.distributed()
    if rank == 0:
        families.save_model(model, s_tok, out_dir / "model", ctx.max_length)
        evaluate.tune_folder(out_dir / "model", ctx)  # a multi-label model's thresholds
        for phase in ("student-finetune", "intermediate"):
            shutil.rmtree(out_dir / phase, ignore_errors=True)
    metrics = {"params": sum(p.numel() for p in model.parameters()), "train_loss": round(loss, 4),
               "student_layers": keep, "layer_map": pairs, "teacher_cache_mb": round(view.cached_mb, 1),
               "processes": world, **notes, **{k: round(v, 4) for k, v in phase_losses.items()}}
    if init_share is not None:
        metrics["init_from_teacher"] = round(init_share, 3)
    return Artifact(out_dir / "model", "hf", metrics)


def loss_problem(intermediate_epochs: float, weights: dict) -> str:
    """'' or why the loss weights cannot work together; edgekit.recipe asks before any stage runs."""
    if intermediate_epochs > 0 and not any(weights.get(k) for k in INTERMEDIATE):
        return f"distill.intermediate_epochs > 0 needs an intermediate loss: set one of {', '.join(INTERMEDIATE)} > 0"
    return ""


def eval_texts(ctx) -> list:
    """The run's validation and test sentences: never part of a transfer set, even without their labels."""
    return [t for t, _ in ctx.splits.validation + ctx.splits.test]


def augment_problem(augment: int, augment_model: str) -> str:
    """'' or why augment_model cannot work; edgekit.recipe asks before any stage runs."""
    if augment_model and not augment:
        return (f"distill.augment_model is {augment_model} but distill.augment is 0, so no copies are made; set "
                f"augment: N (copies per sentence) or drop augment_model")
    return ""


def student_problem(student: str, student_config: dict | None) -> str:
    """'' or why a student checkpoint cannot take student_config; edgekit.recipe asks before any stage runs."""
    if student != "teacher" and student_config:
        return (f"distill.student_config shapes a student made from the teacher; with student: {student} drop "
                f"student_config (the checkpoint has its own config)")
    return ""


def student_layers(layers, depth: int, student_config: dict | None) -> list:
    """The source model's layers (of `depth`) the student keeps."""
    keep = {"every_other": list(range(1, depth, 2)), "all": list(range(depth))}.get(layers, layers) \
        if isinstance(layers, str) else layers
    if isinstance(keep, str) or not all(isinstance(i, int) and not isinstance(i, bool) for i in keep):
        raise EdgekitError(f"distill.layers is {layers!r}; give every_other, all, or a list of layer indices")
    if list(keep) != sorted(set(keep)):  # [1, 1] and [3, 1] ran: a layer twice, or the stack's order turned round
        raise EdgekitError(f"distill.layers is {layers!r}; give each layer once, in increasing order (as the source "
                           f"model stacks them), for example {sorted(set(keep))}")
    if student_config and "num_hidden_layers" in student_config and student_config["num_hidden_layers"] != len(keep):
        if layers != "every_other":
            raise EdgekitError(f"distill.student_config.num_hidden_layers={student_config['num_hidden_layers']} "
                               f"but distill.layers lists {len(keep)} layers; make them agree")
        keep = losses.layer_map("uniform", student_config["num_hidden_layers"], depth)
    return keep


def check_init_labels(init_from: str, labels: list) -> None:
    """A model folder given as init_from was trained for this run's classes, in this order: its head's rows are
    loaded by position (a checkpoint folder or a bare .safetensors file carries no names to check)."""
    from transformers import AutoConfig

    folder = Path(init_from)
    if not (folder / "config.json").is_file():
        return
    have = families.label_names(AutoConfig.from_pretrained(folder))
    if have != labels and not families.unnamed(have):
        raise EdgekitError(f"init_from {init_from} is a model for [{', '.join(have)}], but this run's classes are "
                           f"[{', '.join(labels)}] (index = class id); its head would answer for the wrong classes: "
                           f"give a model trained on these labels, or drop init_from")


def build_student(teacher, t_tok, student: str, layers, student_config) -> tuple:
    """(student model, its tokenizer, the source layers kept, share of weights from the teacher or None)."""
    if student == "teacher":
        source, tok = teacher, t_tok
    else:
        if problem := student_problem(student, student_config):
            raise EdgekitError(problem)
        from edgekit.pipeline import resolve_model

        path = resolve_model(student).path
        source = families.load_model(path, labels=families.label_names(teacher.config),
                                      multi_label=families.is_multi_label(teacher.config))
        tok = families.load_tokenizer(path)
    depth = families.num_layers(source.config)
    keep = student_layers(layers, depth, student_config)
    if student_config:
        model, share = families.student_from_config(teacher, student_config, keep)
        return model, tok, keep, share
    if keep == list(range(depth)) and source is not teacher:
        return source, tok, keep, None
    return families.student_from_teacher(source, keep), tok, keep, None


def tokens_align(s_tok, t_tok, s_enc: list, t_enc: list) -> bool:
    """True when both tokenizations give the same pieces at every position (special tokens by role)."""
    def pieces(tok, ids):
        role = {tok.cls_token_id: "[CLS]", tok.sep_token_id: "[SEP]", tok.unk_token_id: "[UNK]",
                tok.pad_token_id: "[PAD]"}
        return [role.get(i) or t for i, t in zip(ids, tok.convert_ids_to_tokens(ids))]

    return all(pieces(s_tok, a) == pieces(t_tok, b) for (a, _), (b, _) in zip(s_enc, t_enc))


def needs(weights: dict, pairs: list, t_depth: int) -> dict:
    """Which teacher hidden states (0 = embeddings, i + 1 = after layer i) and attention maps the losses read."""
    hidden = set()
    if weights["embedding"]:
        hidden.add(0)
    if weights["hidden"] or weights["pkd"]:
        hidden |= {g + 1 for g in pairs}
    if weights["cosine"]:
        hidden.add(t_depth)
    return {"hidden": sorted(hidden), "attention": sorted(set(pairs)) if weights["attention"] else []}


def loss_fn(w: dict, pairs: list, t_depth: int, temperature: float, proj_emb, proj_hid, view,
            multi_label: bool = False):
    def compute(model, batch):
        real = batch["attention_mask"].bool()
        inter = any(w[k] for k in INTERMEDIATE)
        s = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], output_hidden_states=inter,
                  output_attentions=bool(w["attention"]))
        t = view.batch(batch["index"], inter, s.logits.device)
        loss = s.logits.new_zeros(())
        if w["kd"]:
            loss = loss + w["kd"] * training.soft_label_kd(s.logits, t["logits"], temperature, multi_label)
        if w["ce"]:
            loss = loss + w["ce"] * training.labelled_ce(s.logits, batch["labels"])
        if w["embedding"]:
            loss = loss + w["embedding"] * losses.hidden_mse(s.hidden_states[0], t["hidden"][0], real, proj_emb)
        if w["hidden"]:
            loss = loss + w["hidden"] * _mean([losses.hidden_mse(s.hidden_states[j + 1], t["hidden"][g + 1], real,
                                                                 proj_hid) for j, g in enumerate(pairs)])
        if w["attention"]:
            loss = loss + w["attention"] * _mean([losses.attention_mse(s.attentions[j], t["attention"][g], real)
                                                  for j, g in enumerate(pairs)])
        if w["pkd"]:
            loss = loss + w["pkd"] * _mean([losses.pkd_cls(s.hidden_states[j + 1][:, 0], t["hidden"][g + 1][:, 0],
                                                           proj_hid) for j, g in enumerate(pairs)])
        if w["cosine"]:
            loss = loss + w["cosine"] * losses.hidden_cosine(s.hidden_states[-1], t["hidden"][t_depth], real, proj_hid)
        return loss

    return compute


def _mean(terms: list):
    return sum(terms) / len(terms)


class TeacherView:
    """The teacher's outputs for a batch of training examples (by index): from the cache when it holds them, else
    from a teacher forward pass on the teacher's own tokenization of those examples."""

    def __init__(self, teacher, encoded: list, pad_id: int, need: dict, cache: bool, cache_mb: int, progress: bool):
        self.teacher, self.encoded, self.pad_id, self.need = teacher, encoded, pad_id, need
        lengths = [len(ids) for ids, _ in encoded]
        width, heads = families.hidden_width(teacher.config), teacher.config.num_attention_heads
        inter_mb = (sum(lengths) * width * len(need["hidden"])
                    + sum(n * n for n in lengths) * heads * len(need["attention"])) * 2 / 1e6
        keep_inter = cache and inter_mb <= cache_mb
        self.cache = teacher_outputs(teacher, encoded, pad_id, need["hidden"] if keep_inter else (),
                                     need["attention"] if keep_inter else (), progress) if cache else None
        self.cached_mb = (inter_mb if keep_inter else 0.0) + (len(encoded) * teacher.config.num_labels * 4 / 1e6
                                                               if cache else 0.0)
        self.inter_cached = keep_inter

    def batch(self, index: list, intermediate: bool, device) -> dict:
        if self.cache and (self.inter_cached or not intermediate):
            out = gather(self.cache, index, intermediate)
        else:
            rows = next(data.batches([self.encoded[i] for i in index], len(index), self.pad_id))
            with torch.no_grad():
                t = self.teacher(input_ids=rows["input_ids"], attention_mask=rows["attention_mask"],
                                 output_hidden_states=bool(self.need["hidden"]),
                                 output_attentions=bool(self.need["attention"]))
            out = {"logits": t.logits, "hidden": {k: t.hidden_states[k] for k in self.need["hidden"]},
                   "attention": {g: t.attentions[g] for g in self.need["attention"]}}
        return {"logits": out["logits"].to(device),
                "hidden": {k: v.to(device) for k, v in out["hidden"].items()},
                "attention": {k: v.to(device) for k, v in out["attention"].items()}}


class Packed:
    """Per-example tensors of varying length in one buffer (one allocation, not one per example: 80k small tensors
    left 455 MB to the allocator); `packed[i]` is example i's view: [n, width] for its n tokens, or with `square`
    [heads, n, n]. The width (heads) is read from the first tensor put: a pruned teacher's layers differ."""

    def __init__(self, lengths: list, square: bool = False):
        self.lengths, self.square, self.buffer = lengths, square, None

    def put(self, i: int, value) -> None:
        if self.buffer is None:
            self.unit = value.shape[0] if self.square else value.shape[-1]
            self.starts = [0]
            for n in self.lengths:
                self.starts.append(self.starts[-1] + self.unit * n * (n if self.square else 1))
            self.buffer = torch.empty(self.starts[-1], dtype=value.dtype)
        self.buffer[self.starts[i]:self.starts[i + 1]] = value.reshape(-1)

    def __getitem__(self, i: int):
        n = self.lengths[i]
        return self.buffer[self.starts[i]:self.starts[i + 1]].view((self.unit, n, n) if self.square else (n, self.unit))


def teacher_outputs(teacher, encoded: list, pad_id: int, hidden=(), attention=(), progress: bool = True) -> dict:
    """Teacher outputs for every training example, once: logits [examples, labels], and in fp16 the hidden states
    `hidden` (0 = embeddings, i + 1 = after layer i) and attention maps of layers `attention`, each cut to the
    example's real tokens: {"lengths", "logits", "hidden": {k: Packed of [len, width]}, "attention": {g: Packed of
    [heads, len, len]}}"""

    lengths = [len(ids) for ids, _ in encoded]
    order = sorted(range(len(encoded)), key=lambda i: lengths[i])  # similar lengths: little padding
    out = {"lengths": lengths, "logits": torch.empty(len(encoded), teacher.config.num_labels),
           "hidden": {k: Packed(lengths) for k in hidden},
           "attention": {g: Packed(lengths, square=True) for g in attention}}
    sorted_set = [encoded[i] for i in order]
    with torch.no_grad(), progress_bar(total=len(encoded), desc="teacher outputs", unit="ex",
                                       disable=not progress) as bar:
        for batch in data.batches(sorted_set, 128, pad_id):
            t = teacher(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                        output_hidden_states=bool(hidden), output_attentions=bool(attention))
            rows = [order[j] for j in batch["index"]]
            out["logits"][rows] = t.logits
            for row, i in enumerate(rows):
                n = lengths[i]
                for k in hidden:
                    out["hidden"][k].put(i, t.hidden_states[k][row, :n].half())
                for g in attention:
                    out["attention"][g].put(i, t.attentions[g][row, :, :n, :n].half())
            bar.update(len(batch["index"]))
    return out


def gather(cache: dict, index: list, intermediate: bool = True) -> dict:
    """Cached outputs of the examples `index`, zero-padded to the longest of them (logits only unless
    `intermediate`)."""
    width = max(cache["lengths"][i] for i in index)

    def padded(x):  # [len, width] or [heads, len, len] -> padded to `width` tokens, float
        n = x.shape[-2]
        return F.pad(x.float(), (0, width - n, 0, width - n) if x.dim() == 3 else (0, 0, 0, width - n))

    logits = cache["logits"][list(index)]
    if not intermediate:
        return {"logits": logits, "hidden": {}, "attention": {}}
    return {"logits": logits,
            "hidden": {k: torch.stack([padded(v[i]) for i in index]) for k, v in cache["hidden"].items()},
            "attention": {g: torch.stack([padded(v[i]) for i in index]) for g, v in cache["attention"].items()}}
