"""distill: teacher -> a shallower student initialised from the teacher's own layers (DistilBERT).

loss = alpha * T^2 * KL(student_T || teacher_T) + (1 - alpha) * CE(student, labels)
       + cosine * (1 - cos(student last hidden, teacher last hidden)) over real tokens
"""
from pathlib import Path

import torch
import torch.nn.functional as F

from edgekit import data, families, training
from edgekit.artifact import Artifact
from edgekit.errors import EdgekitError


def run(artifact: Artifact, out_dir: Path, ctx, *, layers: list | str = "every_other", epochs: float = 2.0,
        lr: float = 1e-4, batch_size: int = 32, temperature: float = 2.0, alpha: float = 0.5, cosine: float = 1.0,
        warmup: float = 0.1, weight_decay: float = 0.01, checkpoint_every: int = 100,
        cache_teacher: bool = True) -> Artifact:
    if temperature <= 0 or not 0 <= alpha <= 1 or cosine < 0:
        raise EdgekitError("distill needs temperature > 0, 0 <= alpha <= 1 and cosine >= 0")
    teacher = families.load_model(artifact.path)
    tokenizer = families.load_tokenizer(artifact.path)
    depth = families.num_layers(teacher.config)
    keep = list(range(1, depth, 2)) if layers == "every_other" else layers
    if isinstance(keep, str) or not all(isinstance(i, int) for i in keep):
        raise EdgekitError(f"distill.layers is {layers!r}; give every_other or a list of teacher layer indices")
    student = families.student_from_teacher(teacher, keep)
    for p in teacher.parameters():
        p.requires_grad_(False)
    encoded = data.encode(tokenizer, ctx.splits.train, ctx.max_length)
    cached = teacher_outputs(teacher, encoded, tokenizer.pad_token_id, cosine > 0, ctx.progress) if cache_teacher else None

    def loss_fn(model, batch):
        inputs = {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]}
        real = batch["attention_mask"].bool()
        if cached:  # epochs do not re-run the teacher
            t_logits = torch.stack([cached[0][i] for i in batch["index"]])
            t_hidden = torch.cat([cached[1][i] for i in batch["index"]]).float() if cosine > 0 else None
        else:
            with torch.no_grad():
                t = teacher(**inputs, output_hidden_states=cosine > 0)
            t_logits, t_hidden = t.logits, t.hidden_states[-1][real] if cosine > 0 else None
        s = model(**inputs, output_hidden_states=cosine > 0)
        loss = alpha * training.soft_label_kd(s.logits, t_logits, temperature) + (1 - alpha) * F.cross_entropy(s.logits, batch["labels"])
        if cosine > 0:
            cos = F.cosine_similarity(s.hidden_states[-1][real], t_hidden, dim=-1)
            loss = loss + cosine * (1 - cos).mean()
        return loss

    loss = training.train(student, encoded, loss_fn, out_dir=out_dir, epochs=epochs, lr=lr, batch_size=batch_size,
                          warmup=warmup, weight_decay=weight_decay, checkpoint_every=checkpoint_every, seed=ctx.seed,
                          pad_id=tokenizer.pad_token_id, desc="distill", progress=ctx.progress)
    families.save_model(student, tokenizer, out_dir / "model")
    return Artifact(out_dir / "model", "hf", {"params": sum(p.numel() for p in student.parameters()),
                                              "train_loss": round(loss, 4), "student_layers": keep})


def teacher_outputs(teacher, encoded: list, pad_id: int, hidden: bool, progress: bool):
    """Teacher logits (and last hidden states of real tokens, in fp16) for every training example, once."""
    from tqdm import tqdm

    order = sorted(range(len(encoded)), key=lambda i: len(encoded[i][0]))  # similar lengths: little padding
    logits, states = [None] * len(encoded), [None] * len(encoded)
    sorted_set = [encoded[i] for i in order]
    with torch.no_grad(), tqdm(total=len(encoded), desc="teacher outputs", unit="ex", disable=not progress) as bar:
        for batch in data.batches(sorted_set, 128, pad_id):
            out = teacher(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], output_hidden_states=hidden)
            for row, j in enumerate(batch["index"]):
                i = order[j]
                logits[i] = out.logits[row]
                if hidden:
                    states[i] = out.hidden_states[-1][row, :len(encoded[i][0])].half()
            bar.update(len(batch["index"]))
    return logits, states
