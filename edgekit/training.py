"""The training loop finetune and distill share: AdamW, linear warm-up and decay, progress bar,
checkpoints every N steps (weights, optimizer, scheduler, RNG, step) that a killed run resumes from."""
import os
import random
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from tqdm import tqdm

from edgekit import data
from edgekit.errors import EdgekitError


def train(model, encoded, loss_fn, *, out_dir: Path, epochs: float, lr: float, batch_size: int, warmup: float,
          weight_decay: float, checkpoint_every: int, seed: int, pad_id: int, desc: str, progress: bool = True,
          extra_params=()):
    """Train `model` on `encoded` [(ids, label)] minimising `loss_fn(model, batch)`; resumes from
    `out_dir/checkpoint` when one is there. Returns the mean loss of the last 50 steps."""
    torch.manual_seed(seed)
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
    step = _resume(ckpt, model, optimizer, scheduler, extra_params) if ckpt.exists() else 0
    model.train()
    losses = []
    bar = tqdm(total=total, initial=step, desc=desc, unit="step", disable=not progress, dynamic_ncols=True)
    epoch = step // per_epoch
    while step < total:
        for i, batch in enumerate(data.batches(encoded, batch_size, pad_id, shuffle=True, seed=seed * 1000 + epoch)):
            if epoch * per_epoch + i < step:
                continue  # already done before the resume
            loss = loss_fn(model, batch)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            step += 1
            losses = (losses + [loss.item()])[-50:]
            bar.set_postfix(loss=f"{sum(losses) / len(losses):.4f}")
            bar.update(1)
            if checkpoint_every and step % checkpoint_every == 0 and step < total:
                _save(ckpt, model, optimizer, scheduler, step, extra_params)
            if step >= total:
                break
        epoch += 1
    bar.close()
    model.eval()
    return sum(losses) / max(1, len(losses))


def soft_label_kd(student_logits, teacher_logits, temperature: float):
    """Hinton's soft-label loss: KL between temperature-softened distributions, times T^2 so its gradients keep
    their scale as T changes."""
    import torch.nn.functional as F

    T = temperature
    return F.kl_div(F.log_softmax(student_logits / T, -1), F.softmax(teacher_logits / T, -1),
                    reduction="batchmean") * T * T


def _save(ckpt: Path, model, optimizer, scheduler, step: int, extra_params):
    """Write the checkpoint beside the old one, then swap, so a kill never leaves half a checkpoint."""
    tmp = ckpt.with_name(ckpt.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    state = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    state.update({f"extra.{i}": p.detach().contiguous() for i, p in enumerate(extra_params)})
    save_file(_untie(state), tmp / "model.safetensors")
    torch.save({"optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(), "step": step,
                "torch_rng": torch.get_rng_state(), "python_rng": random.getstate()}, tmp / "state.pt")
    old = ckpt.with_name(ckpt.name + ".old")
    if ckpt.exists():
        os.replace(ckpt, old)
    os.replace(tmp, ckpt)
    shutil.rmtree(old, ignore_errors=True)


def _untie(state: dict) -> dict:
    seen, out = set(), {}
    for k, v in state.items():
        ptr = v.data_ptr()
        out[k] = v.clone() if ptr in seen else v
        seen.add(ptr)
    return out


def _resume(ckpt: Path, model, optimizer, scheduler, extra_params) -> int:
    try:
        weights = load_file(ckpt / "model.safetensors")
        state = torch.load(ckpt / "state.pt", weights_only=True)
    except Exception as e:
        raise EdgekitError(f"checkpoint {ckpt} is unreadable ({type(e).__name__}); delete it to start the stage over")
    extra = {k: v for k, v in weights.items() if k.startswith("extra.")}
    model.load_state_dict({k: v for k, v in weights.items() if not k.startswith("extra.")}, strict=False)
    for i, p in enumerate(extra_params):
        p.data.copy_(extra[f"extra.{i}"])
    optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    torch.set_rng_state(state["torch_rng"])
    random.setstate(_as_tuple(state["python_rng"]))
    return int(state["step"])


def _as_tuple(x):
    return tuple(_as_tuple(v) for v in x) if isinstance(x, (list, tuple)) else x
