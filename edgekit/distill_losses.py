"""Distillation losses, each a plain function of student and teacher outputs, and the layer map that says which
teacher layer each student layer learns from.

- soft-label KD (Hinton): training.soft_label_kd, KL at temperature T times T^2
- hidden cosine (DistilBERT): 1 - cos(student, teacher) of the last hidden state, per real token
- embedding and hidden MSE (TinyBERT): MSE(student · W, teacher) per real token; W is a learned projection
  (student width -> teacher width), one for the embeddings and one shared by the hidden layers, only when
  the widths differ
- attention MSE (TinyBERT): MSE between attention probabilities of mapped layers over real query/key
  positions; when head counts differ, between head-averaged maps (TinyBERT itself needs equal counts)
- PKD: squared distance between the L2-normalised [CLS] vectors of mapped layers (Sun et al.)
"""
import torch
import torch.nn.functional as F

from edgekit.errors import EdgekitError

MAPS = ("uniform", "last")


def layer_map(spec, student_depth: int, teacher_depth: int) -> list:
    """Teacher layer (0-based) for each student layer: uniform (TinyBERT's g(m) = m·N/M, so the last student
    layer learns from the last teacher layer), last (the last M teacher layers, PKD-Last), or an explicit list."""
    if spec == "uniform":
        return [(j + 1) * teacher_depth // student_depth - 1 for j in range(student_depth)]
    if spec == "last" and student_depth <= teacher_depth:
        return list(range(teacher_depth - student_depth, teacher_depth))
    ok = isinstance(spec, list) and all(isinstance(i, int) and not isinstance(i, bool) for i in spec)
    if not ok or len(spec) != student_depth or any(not 0 <= i < teacher_depth for i in spec):
        raise EdgekitError(f"distill.layer_map {spec!r} does not fit: the student has {student_depth} layers, the "
                           f"teacher {teacher_depth} (indices 0..{teacher_depth - 1}); give uniform, last, or a list "
                           f"of {student_depth} teacher layer indices")
    return spec


def projection(student_width: int, teacher_width: int, allowed: bool, what: str, seed: int = 0):
    """A learned student -> teacher width map (TinyBERT's W), or None when the widths agree. Its initial weights
    come from their own generator: the same on every run, whatever ran before (an augmentation cache hit or not)."""
    if student_width == teacher_width:
        return None
    if not allowed:
        raise EdgekitError(f"{what} needs the student width {student_width} mapped to the teacher width "
                           f"{teacher_width}, and distill.projection is false; set projection: true or drop that loss")
    layer = torch.nn.Linear(student_width, teacher_width, bias=False)
    torch.nn.init.normal_(layer.weight, std=student_width ** -0.5, generator=torch.Generator().manual_seed(seed))
    return layer


def _project(x, proj):
    return x if proj is None else x @ proj.weight.T.to(x.dtype)


def hidden_mse(student, teacher, real, proj=None):
    """MSE over the real tokens of one layer ([batch, len, width] each; `real` the attention mask as bool)."""
    return F.mse_loss(_project(student[real], proj), teacher[real].to(student.dtype))


def hidden_cosine(student, teacher, real, proj=None):
    return (1 - F.cosine_similarity(_project(student[real], proj), teacher[real].to(student.dtype), dim=-1)).mean()


def attention_mse(student, teacher, real):
    """[batch, heads, len, len] attention probabilities; padded queries and keys do not count."""
    if student.shape[1] != teacher.shape[1]:
        student, teacher = student.mean(1, keepdim=True), teacher.mean(1, keepdim=True)
    teacher = teacher.to(student.dtype)
    mask = (real[:, None, :, None] & real[:, None, None, :]).to(student.dtype)
    return ((student - teacher) ** 2 * mask).sum() / (mask.sum() * student.shape[1])


def pkd_cls(student, teacher, proj=None):
    """Patient KD on one layer's [CLS] vectors ([batch, width] each)."""
    s = F.normalize(_project(student, proj), dim=-1)
    t = F.normalize(teacher.to(s.dtype), dim=-1)
    return ((s - t) ** 2).sum(-1).mean()
