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
        warmup: float = 0.1, weight_decay: float = 0.01, checkpoint_every: int = 100) -> Artifact:
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
    T = temperature

    def loss_fn(model, batch):
        inputs = {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]}
        with torch.no_grad():
            t = teacher(**inputs, output_hidden_states=cosine > 0)
        s = model(**inputs, output_hidden_states=cosine > 0)
        kd = F.kl_div(F.log_softmax(s.logits / T, -1), F.softmax(t.logits / T, -1), reduction="batchmean") * T * T
        loss = alpha * kd + (1 - alpha) * F.cross_entropy(s.logits, batch["labels"])
        if cosine > 0:
            real = batch["attention_mask"].bool()
            cos = F.cosine_similarity(s.hidden_states[-1][real], t.hidden_states[-1][real], dim=-1)
            loss = loss + cosine * (1 - cos).mean()
        return loss

    encoded = data.encode(tokenizer, ctx.splits.train, ctx.max_length)
    loss = training.train(student, encoded, loss_fn, out_dir=out_dir, epochs=epochs, lr=lr, batch_size=batch_size,
                          warmup=warmup, weight_decay=weight_decay, checkpoint_every=checkpoint_every, seed=ctx.seed,
                          pad_id=tokenizer.pad_token_id, desc="distill", progress=ctx.progress)
    families.save_model(student, tokenizer, out_dir / "model")
    return Artifact(out_dir / "model", "hf", {"params": sum(p.numel() for p in student.parameters()),
                                              "train_loss": round(loss, 4), "student_layers": keep})
