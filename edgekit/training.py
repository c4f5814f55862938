"""The training loop finetune, distill and prune share: AdamW, linear warm-up and decay, progress bar,
checkpoints every N steps and at the end (weights in safetensors, optimizer, scheduler, RNG, step, recent
losses) that a killed run resumes from.

Under `torchrun --nproc_per_node N` (WORLD_SIZE > 1) the same loop runs data-parallel: the process group
starts here (gloo on CPU, nccl on GPU), the model is wrapped in DistributedDataParallel, every rank draws the
same global batches and takes its own rows of each (rows r, r+N, ...), each rank's loss is scaled by its share
of the rows so the averaged gradient is the gradient of the whole batch, and only rank 0 writes checkpoints."""
import datetime
import json
import os
import random
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from edgekit import data, errors
from edgekit.errors import EdgekitError
from edgekit.progress import bar as progress_bar


def train(model, encoded, loss_fn, *, out_dir: Path, epochs: float, lr: float, batch_size: int, warmup: float,
          weight_decay: float, checkpoint_every: int, seed: int, pad_id: int, desc: str, progress: bool = True,
          extra_params=()):
    """Train `model` on `encoded` [(ids, label)] minimising `loss_fn(model, batch)`; resumes from
    `out_dir/checkpoint` when one is there. `extra_params` (projections a loss owns) train and checkpoint
    with the model. Returns the mean loss of the last 50 steps."""
    if batch_size < 1 or not encoded:  # no batches: the loop below would never end
        raise EdgekitError(f"{desc}: nothing to train on ({len(encoded)} examples, batch_size {batch_size})")
    rank, world = distributed()
    device = _device(world)
    torch.manual_seed(seed)
    model.to(device)
    for p in extra_params:
        p.data = p.data.to(device)
    params = [p for p in model.parameters() if p.requires_grad] + list(extra_params)
    decay = [p for p in params if p.dim() > 1]
    no_decay = [p for p in params if p.dim() <= 1]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": weight_decay},
                                   {"params": no_decay, "weight_decay": 0.0}], lr=lr)
    per_epoch = -(-len(encoded) // batch_size)
    total = max(1, round(per_epoch * epochs))
    warm = int(total * warmup)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: (s + 1) / max(1, warm) if s < warm else max(0.0, (total - s) / max(1, total - warm)))
    ckpt = out_dir / "checkpoint"
    if rank == 0:  # a kill (SIGKILL, power) between a swap's renames; under torchrun one rank renames
        _restore(ckpt)
    if world > 1:
        torch.distributed.barrier()
    step, losses = _resume(ckpt, model, optimizer, scheduler, extra_params) if ckpt.exists() else (0, [])
    model.train()
    runner = model
    if world > 1:
        from torch.nn.parallel import DistributedDataParallel

        runner = DistributedDataParallel(model, find_unused_parameters=True)  # a phase may leave the head unused
    bar = progress_bar(total=total, initial=step, desc=desc, unit="step", disable=not progress or rank > 0)
    epoch = step // per_epoch
    while step < total:
        for i, batch in enumerate(data.batches(encoded, batch_size, pad_id, shuffle=True, seed=seed * 1000 + epoch)):
            if epoch * per_epoch + i < step:
                continue  # already done before the resume
            errors.stop_point()  # a stop signal Python dropped
            local, share = _shard(batch, rank, world)
            loss = loss_fn(runner, _to(local, device)) * share
            loss.backward()
            if world > 1:
                _average_grads(extra_params, world)
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            step += 1
            losses = (losses + [_global_mean(loss.detach(), world)])[-50:]
            bar.set_postfix(loss=f"{sum(losses) / len(losses):.4f}", refresh=False)  # a refresh every step skipped
            bar.update(1)  # tqdm's rate limit: a CI log got one redraw per step
            if checkpoint_every and (step % checkpoint_every == 0 or step >= total):
                if rank == 0:
                    _save(ckpt, model, optimizer, scheduler, step, extra_params, losses)
                if world > 1:
                    torch.distributed.barrier()
            if step >= total:
                break
        epoch += 1
    bar.close()
    model.eval()
    return sum(losses) / max(1, len(losses))


ALONE = False  # set while rank 0 runs a stage without the other ranks (pipeline): training is single-process


def distributed() -> tuple:
    """(rank, world size). Under torchrun (WORLD_SIZE > 1) the process group is started once: gloo on CPU,
    nccl when CUDA is there."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1 or ALONE:
        return 0, 1
    import torch.distributed as dist

    if not dist.is_initialized():  # a long timeout: the other ranks wait while rank 0 alone runs a stage
        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo", timeout=datetime.timedelta(hours=6))
    return dist.get_rank(), dist.get_world_size()


def tell(message: dict) -> dict:
    """Rank 0 sends `message` to every rank (the others pass None and get it back); as JSON, never a pickle."""
    rank, world = distributed()
    device = _device(world)
    raw = json.dumps(message).encode() if rank == 0 else b""
    size = torch.tensor([len(raw)], device=device)
    torch.distributed.broadcast(size, src=0)
    buf = torch.tensor(list(raw), dtype=torch.uint8, device=device) if rank == 0 else \
        torch.empty(int(size.item()), dtype=torch.uint8, device=device)
    torch.distributed.broadcast(buf, src=0)
    return json.loads(bytes(buf.cpu().tolist()))


def _device(world: int):
    if world > 1 and torch.cuda.is_available():
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    return torch.device("cpu")


def _shard(batch: dict, rank: int, world: int) -> tuple:
    """This rank's rows of a global batch and its loss scale (rows here * world / rows in all): the ranks'
    gradients, averaged by DDP, are then the mean-loss gradient of the whole batch. A rank left without rows
    runs one row with scale 0 (every rank must take part in each all-reduce)."""
    n = len(batch["index"])
    if world == 1:
        return batch, 1.0
    rows = list(range(rank, n, world))
    share = len(rows) * world / n
    rows = rows or [0]
    picked = {k: (v[rows] if torch.is_tensor(v) else [v[r] for r in rows]) for k, v in batch.items()}
    width = int(picked["attention_mask"].sum(1).max())  # this rank's own padding
    for k in ("input_ids", "attention_mask"):
        picked[k] = picked[k][:, :width]
    return picked, share


def _to(batch: dict, device) -> dict:
    if device.type == "cpu":
        return batch
    return {k: v.to(device) if torch.is_tensor(v) else v for k, v in batch.items()}


def _average_grads(extra_params, world: int) -> None:
    """DDP averages the model's gradients; parameters outside it (loss projections) are averaged here."""
    for p in extra_params:
        if p.grad is not None:
            torch.distributed.all_reduce(p.grad)
            p.grad /= world


def _global_mean(loss, world: int) -> float:
    """The whole batch's mean loss (each rank holds its rows' mean times its share)."""
    if world == 1:
        return loss.item()
    total = (loss / world).reshape(1)
    torch.distributed.all_reduce(total)
    return total.item()


def hard_label_loss(model, batch):
    """The task loss of the model's logits against the batch's labels: fine-tuning's loss."""
    return task_loss(model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits,
                     batch["labels"])


def task_loss(logits, labels):
    """Cross-entropy against class ids; for multi-label rows (labels a 0/1 row per example) each label's binary
    cross-entropy, averaged over labels and rows."""
    import torch.nn.functional as F

    if labels.dim() == 2:
        return F.binary_cross_entropy_with_logits(logits, labels.float())
    return F.cross_entropy(logits, labels)


def labelled_ce(logits, labels):
    """The task loss over the rows that have a label, divided by all rows: transfer-set rows (label UNLABELLED;
    multi-label: a row of them) add nothing, and a batch where every row is labelled gives the usual mean."""
    import torch.nn.functional as F

    if labels.dim() == 2:
        have = labels[:, 0] != data.UNLABELLED
        return F.binary_cross_entropy_with_logits(logits[have], labels[have].float(), reduction="sum") / labels.numel()
    return F.cross_entropy(logits, labels, ignore_index=data.UNLABELLED, reduction="sum") / labels.numel()


def soft_label_kd(student_logits, teacher_logits, temperature: float, multi_label: bool = False):
    """Hinton's soft-label loss: KL between temperature-softened distributions, times T^2 so its gradients keep
    their scale as T changes. Multi-label: each label is its own two-way distribution (the sigmoid of its logit),
    so the loss is the binary cross-entropy against the teacher's softened sigmoids, averaged over labels."""
    import torch
    import torch.nn.functional as F

    T = temperature
    if multi_label:
        return F.binary_cross_entropy_with_logits(student_logits / T, torch.sigmoid(teacher_logits / T)) * T * T
    return F.kl_div(F.log_softmax(student_logits / T, -1), F.softmax(teacher_logits / T, -1),
                    reduction="batchmean") * T * T


def _save(ckpt: Path, model, optimizer, scheduler, step: int, extra_params, losses=()):
    """Write the checkpoint beside the old one, then swap, so a kill never leaves half a checkpoint. A full disk,
    Ctrl-C or SIGTERM at any point of it (the signal comes between any two lines) leaves the last whole checkpoint
    under its name and no temp folder (a stop while the replaced one is deleted leaves checkpoint.old, which the
    next run deletes)."""
    tmp, old = ckpt.with_name(ckpt.name + ".tmp"), ckpt.with_name(ckpt.name + ".old")
    try:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        state = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
        state.update({f"extra.{i}": p.detach().contiguous() for i, p in enumerate(extra_params)})
        save_file(_untie(state), tmp / "model.safetensors")
        torch.save({"optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(), "step": step,
                    "torch_rng": torch.get_rng_state(), "python_rng": random.getstate(), "losses": list(losses)},
                   tmp / "state.pt")
        if ckpt.exists():
            os.replace(ckpt, old)
        os.replace(tmp, ckpt)
    except BaseException:
        _restore(ckpt)
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    shutil.rmtree(old, ignore_errors=True)


def _restore(ckpt: Path) -> None:
    """Put the last whole checkpoint back under its name when a stop came between the two renames of a swap."""
    old = ckpt.with_name(ckpt.name + ".old")
    if old.exists() and not ckpt.exists():
        os.replace(old, ckpt)
    shutil.rmtree(old, ignore_errors=True)


def _untie(state: dict) -> dict:
    seen, out = set(), {}
    for k, v in state.items():
        ptr = v.data_ptr()
        out[k] = v.clone() if ptr in seen else v
        seen.add(ptr)
    return out


def _resume(ckpt: Path, model, optimizer, scheduler, extra_params) -> tuple:
    """Load a checkpoint into the model and optimizer; (step, recent losses)."""
    try:
        weights = load_file(ckpt / "model.safetensors")
        state = torch.load(ckpt / "state.pt", weights_only=True)
    except Exception as e:
        raise EdgekitError(f"checkpoint {ckpt} is unreadable ({type(e).__name__}); delete it to start the stage over")
    extra = {k: v for k, v in weights.items() if k.startswith("extra.")}
    load_weights(model, {k: v for k, v in weights.items() if not k.startswith("extra.")}, str(ckpt))
    if sorted(extra) != sorted(f"extra.{i}" for i in range(len(extra_params))) or \
            any(extra[f"extra.{i}"].shape != p.shape for i, p in enumerate(extra_params)):
        raise EdgekitError(f"checkpoint {ckpt} holds other loss projections than this stage's settings make; "
                           f"delete it to start the stage over")
    for i, p in enumerate(extra_params):
        p.data.copy_(extra[f"extra.{i}"])
    optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    torch.set_rng_state(state["torch_rng"])
    random.setstate(_as_tuple(state["python_rng"]))
    return int(state["step"]), [float(x) for x in state.get("losses", [])]


def read_weights(path: Path) -> dict:
    """The tensors of a safetensors file, or of `model.safetensors` in a checkpoint or model folder."""
    path = Path(path)
    file = path / "model.safetensors" if path.is_dir() else path
    if path.is_dir() and not file.is_file() and (path / "checkpoint" / "model.safetensors").is_file():
        file = path / "checkpoint" / "model.safetensors"
    if not file.is_file():
        raise EdgekitError(f"{path} has no model.safetensors; give a checkpoint or model folder an edgekit run wrote")
    try:
        return load_file(file)
    except Exception as e:
        raise EdgekitError(f"{file} is unreadable ({type(e).__name__}); it is damaged or not a safetensors file")


def load_weights(model, weights: dict, source: str) -> None:
    """Load weights that must fit the model exactly: same names, same shapes (tied copies and buffers such as
    position ids may be absent), else a one-line error naming the first difference."""
    expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    optional = {k for k in expected if k.endswith("position_ids") or k.endswith("token_type_ids")}
    unknown = [k for k in weights if k not in expected]
    missing = [k for k in expected if k not in weights and k not in optional]
    bad = [k for k in weights if k in expected and tuple(weights[k].shape) != expected[k]]
    if unknown or missing or bad:
        what = (f"shape of {bad[0]} is {tuple(weights[bad[0]].shape)}, the model has {expected[bad[0]]}" if bad else
                f"it has no {missing[0]}" if missing else f"the model has no {unknown[0]}")
        raise EdgekitError(f"{source} is from another architecture ({what}); give a checkpoint of a model with the "
                           f"same layers and widths")
    model.load_state_dict(weights, strict=False)


def _as_tuple(x):
    return tuple(_as_tuple(v) for v in x) if isinstance(x, (list, tuple)) else x
