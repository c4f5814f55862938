"""finetune: turn a pretrained encoder into a task model (the teacher) when the user has none. Under torchrun the
training is data-parallel (training.train) and rank 0 writes the model."""
from pathlib import Path

from edgekit import data, families, training
from edgekit.artifact import Artifact
from edgekit.stages import evaluate


def run(artifact: Artifact, out_dir: Path, ctx, *, epochs: float = 1.0, lr: float = 5e-5, batch_size: int = 32,
        warmup: float = 0.1, weight_decay: float = 0.01, checkpoint_every: int = 100) -> Artifact:
    tokenizer = families.load_tokenizer(artifact.path)
    model = families.load_model(artifact.path, labels=ctx.splits.labels, pairs=ctx.splits.pairs,
                                multi_label=ctx.splits.multi_label)
    encoded = data.encode(tokenizer, ctx.splits.train, ctx.max_length, ctx.progress)
    loss = training.train(model, encoded, training.hard_label_loss, out_dir=out_dir, epochs=epochs, lr=lr,
                          batch_size=batch_size, warmup=warmup, weight_decay=weight_decay,
                          checkpoint_every=checkpoint_every, seed=ctx.seed, pad_id=tokenizer.pad_token_id,
                          desc="finetune", progress=ctx.progress)
    rank, world = training.distributed()
    if rank == 0:
        families.save_model(model, tokenizer, out_dir / "model", ctx.max_length)
        evaluate.tune_folder(out_dir / "model", ctx)  # a multi-label model's thresholds
    return Artifact(out_dir / "model", "hf", {"params": sum(p.numel() for p in model.parameters()),
                                              "train_loss": round(loss, 4), "processes": world})
