"""One module per stage, each with one entry function `run(artifact, out_dir, ctx, **settings) -> Artifact`.
Recipe keys are exactly the keyword arguments of `run`."""
import importlib

NAMES = ("finetune", "distill", "prune", "export", "quantize", "evaluate", "bench")


def entry(name: str):
    return importlib.import_module(f"edgekit.stages.{name}").run
