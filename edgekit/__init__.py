"""edgekit: compress BERT-family text classifiers for phones, Raspberry Pis and small x86 boxes."""
import logging

from edgekit.errors import EdgekitError, UsageError  # what load and compress raise for input you can fix

__version__ = "0.1.0"
__all__ = ["EdgekitError", "UsageError", "compress", "load", "__version__"]

# torchao (pulled in by litert-torch, imported by transformers when present) announces CUDA kernels it cannot
# load on a CPU machine and torch warns about its enums: noise on every command, not the user's concern.
for _name in ("torchao", "torch.utils._pytree"):
    logging.getLogger(_name).setLevel(logging.ERROR)


def compress(recipe: str = "distilbert-int8", teacher: str = None, data: str = None, out=None, overrides=(),
             progress: bool = True):
    """Run a recipe end to end; returns (final Artifact, manifest dict)."""
    from edgekit.pipeline import compress as _compress

    return _compress(recipe, teacher=teacher, data=data, out=out, overrides=overrides, progress=progress)


def load(path, threads: int = 0, max_length: int = 0):
    """A callable model from a transformers folder or an .onnx, .tflite or TorchScript .pt file:
    model(texts) -> {labels, probs}, in chunks of 64 texts (a multi-label model: a list of labels per text and
    each label's sigmoid). `max_length`: where every call cuts texts by default
    (at most what the file takes). Bad input raises edgekit.EdgekitError, with one line saying what to do."""
    from edgekit.runtime import load as _load

    return _load(path, threads=threads, max_length=max_length)
