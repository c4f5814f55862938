"""One module per stage, each with one entry function `run(artifact, out_dir, ctx, **settings) -> Artifact`.
Recipe keys are exactly the keyword arguments of `run`; a module's `LIMITS` says what their values may be. A
module's `REVISION` (default 1) is raised when a fix changes what the stage writes for the same settings, so runs
made before it redo that stage instead of reusing it."""
import importlib

NAMES = ("finetune", "distill", "prune", "export", "quantize", "evaluate", "bench")


def entry(name: str):
    return importlib.import_module(f"edgekit.stages.{name}").run


def limits(name: str) -> dict:
    """What the stage's settings may be, beyond their types (edgekit.recipe.outside): checked before any stage runs."""
    return getattr(importlib.import_module(f"edgekit.stages.{name}"), "LIMITS", {})


def revision(name: str) -> int:
    return getattr(importlib.import_module(f"edgekit.stages.{name}"), "REVISION", 1)
