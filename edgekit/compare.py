"""The model-selection table people build by hand: for any mix of assets, local folders and configs, params,
size FP32 and INT8 (ONNX), latency p50 at batch 1 and batch 32, memory after loading, and accuracy when a
task model and data are given. `--families` adds BERT/RoBERTa/ALBERT/DistilBERT/ELECTRA base-shaped models
with random weights: latency, memory and size are real, accuracy is left empty (`xlm-roberta-base`,
`deberta-v3-base` and `modernbert-base` are more such shapes, measured when named: XLM-R's 1.1 GB FP32 export
alone about doubles the time `--families` takes).
"""
import csv
import io
import shutil
import sys
from pathlib import Path

from tqdm import tqdm

from edgekit import families
from edgekit.artifact import weights_mb, write_json, write_text
from edgekit.errors import EdgekitError, UsageError
from edgekit.progress import bar as progress_bar
from edgekit.report import number, threads_text, unit_of

# The published base configurations (as in each model's config.json on the hub), written out: no download.
FAMILY_CONFIGS = {
    "bert-base": ("bert", {}),
    "roberta-base": ("roberta", {"vocab_size": 50265, "max_position_embeddings": 514, "type_vocab_size": 1,
                                 "pad_token_id": 1, "bos_token_id": 0, "eos_token_id": 2, "layer_norm_eps": 1e-5}),
    "xlm-roberta-base": ("xlm-roberta", {"vocab_size": 250002, "max_position_embeddings": 514, "type_vocab_size": 1,
                                         "pad_token_id": 1, "bos_token_id": 0, "eos_token_id": 2, "layer_norm_eps": 1e-5}),
    "deberta-v3-base": ("deberta-v2", {"vocab_size": 128100, "hidden_size": 768, "num_hidden_layers": 12,
                                       "num_attention_heads": 12, "intermediate_size": 3072,  # its defaults: xlarge
                                       "max_position_embeddings": 512, "relative_attention": True,
                                       "position_buckets": 256, "norm_rel_ebd": "layer_norm", "share_att_key": True,
                                       "pos_att_type": ["p2c", "c2p"], "layer_norm_eps": 1e-7, "pad_token_id": 0,
                                       "max_relative_positions": -1, "position_biased_input": False,
                                       "type_vocab_size": 0}),
    "modernbert-base": ("modernbert", {"classifier_pooling": "mean"}),  # transformers' defaults are its shape
    "albert-base": ("albert", {"vocab_size": 30000, "embedding_size": 128, "hidden_size": 768,
                               "num_attention_heads": 12, "intermediate_size": 3072}),
    "distilbert-base": ("distilbert", {}),
    "electra-base": ("electra", {"embedding_size": 768, "hidden_size": 768, "num_attention_heads": 12,
                                 "intermediate_size": 3072}),
}
FAMILIES = ("bert-base", "roberta-base", "albert-base", "distilbert-base", "electra-base")  # what --families adds
COLUMNS = ("model", "params_m", "size_fp32_mb", "size_int8_mb", "latency_ms_b1_fp32", "latency_ms_b1_int8",
           "latency_ms_b32_int8", "rss_after_load_mb_int8", "accuracy", "f1_micro")  # f1_micro: multi-label data


@families.quiet_transformers()
def source(spec: str) -> tuple:
    """(config, its folder or None) of a family name, a config.json, an asset or a transformers folder."""
    from transformers import AutoConfig

    if spec in FAMILY_CONFIGS:
        family, overrides = FAMILY_CONFIGS[spec]
        return AutoConfig.for_model(family, num_labels=2, **overrides), None
    path = Path(spec)
    if path.suffix == ".json" and path.is_file():
        try:
            return AutoConfig.from_pretrained(path), None
        except Exception as e:
            raise EdgekitError(f"{spec} is not a transformers config ({type(e).__name__}: {e}); give a model's "
                               f"config.json")
    from edgekit import assets
    from edgekit.pipeline import model_assets, resolve_model

    path = path.expanduser()
    if (path / "manifest.json").is_file() and not (path / "config.json").is_file():
        made = [str(p.parent) for p in sorted(path.glob("[0-9][0-9]-*/model/config.json"))]
        raise UsageError(f"{spec} is an edgekit run, not a model; compare measures transformers folders as they are: "
                         f"give one of its stages' models ({', '.join(made) or 'it has none'}); the run's exported "
                         f"files are measured by edgekit bench {spec} --model FILE")
    if (path / "model" / "config.json").is_file() and not (path / "config.json").is_file():
        raise UsageError(f"{spec} is a run's stage folder, not a model; give the model it holds: {path / 'model'}")
    if path.exists() and not assets.is_asset(spec) and not (path / "config.json").is_file():
        what = "a file" if path.is_file() else "a folder without config.json"
        raise UsageError(f"{spec} is {what}, not a model compare can build; compare takes model assets "
                         f"({', '.join(model_assets())}), transformers model folders (with config.json), config.json "
                         f"files, base shapes ({', '.join(FAMILY_CONFIGS)}) or hub ids (org/name); an exported model "
                         f"file is measured by edgekit bench RUN --model FILE")
    folder = resolve_model(spec).path
    return AutoConfig.from_pretrained(folder), folder


def build(spec: str):
    """(model, its folder or None): random weights for a family name or a config.json, else the folder's."""
    import torch
    from transformers import AutoModelForSequenceClassification

    torch.manual_seed(0)
    config, folder = source(spec)
    return (families.load_model(folder) if folder else AutoModelForSequenceClassification.from_config(config)), folder


def unbuildable(spec: str, e: Exception) -> EdgekitError:
    """transformers' own refusal of a config's shape (hidden size 8 over 3 heads), in one line: it was a traceback."""
    reason = " ".join(str(e).split())[:200]
    return EdgekitError(f"{spec}: transformers cannot build this model ({type(e).__name__}: {reason}); fix its "
                        f"config.json or give another model")


def check(spec: str, seq_len: int) -> None:
    """What can be told of a spec before anything is measured: that it is there and whole, and takes seq_len."""
    config, _ = source(spec)
    try:  # a GPT-2 config.json failed inside the ONNX export, with a traceback
        families.family(config)
    except EdgekitError as e:
        raise EdgekitError(f"{spec}: {e}") from None
    import torch
    from transformers import AutoModelForSequenceClassification

    try:  # built on the meta device (no memory, no weights, milliseconds): a shape transformers refuses is said
        with torch.device("meta"):  # before the first model is measured, not after the models before it
            AutoModelForSequenceClassification.from_config(config)
    except (ValueError, TypeError) as e:
        raise unbuildable(spec, e) from None
    except Exception:  # a constructor that needs real tensors: measure builds the model for real, and says why
        pass
    if seq_len > families.max_tokens(config):
        raise UsageError(f"--seq-len {seq_len} is longer than {spec} takes ({families.max_tokens(config)} tokens); "
                         f"lower --seq-len")


def measure(spec: str, work: Path, data=None, threads: int = 1, seq_len: int = 128) -> dict:
    """One row; latency at `seq_len` tokens, and accuracy with inputs cut there too (as an export would cut them)."""
    import torch

    from edgekit.stages import bench, export, quantize

    try:
        model, source = build(spec)
    except (ValueError, TypeError) as e:
        raise unbuildable(spec, e) from None
    row = {"model": spec, "params_m": round(sum(p.numel() for p in model.parameters()) / 1e6, 3)}
    names = families.label_names(model.config)
    if source is not None and data is not None:
        from edgekit.pipeline import in_teacher_order

        data = in_teacher_order(data, names)  # the same classes in the model's order
    same_kind = data is not None and families.is_multi_label(model.config) == data.multi_label
    task_model = source is not None and data is not None and names == data.labels and same_kind
    if data is not None and not task_model:
        why = "has random weights" if source is None else \
            f"predicts {names}, the data's labels are {data.labels}; name them in its config.json's id2label as " \
            f"the data does, if it was trained on these classes" if names != data.labels else \
            f"is a {'single' if data.multi_label else 'multi'}-label classifier and the data " \
            f"{'is multi-label' if data.multi_label else 'gives one label per row'}"
        tqdm.write(f"edgekit: warning: no accuracy for {spec}: it {why}", file=sys.stderr)
    if task_model:  # a model trained for these labels: its accuracy means something
        from edgekit import runtime
        from edgekit.stages.evaluate import f1_micro, matches, predictions

        said = predictions(runtime.HFModel(source, max_length=seq_len), data.test, 64, False, spec)
        row["accuracy"] = round(sum(matches(said, data.test)) / len(data.test), 4)
        if data.multi_label and (f1 := f1_micro(said, data.test)) is not None:  # most label sets are often empty:
            row["f1_micro"] = round(f1, 4)  # micro-F1 is the number people compare
    folder = work / spec.replace("/", "_")
    folder.mkdir(parents=True, exist_ok=True)
    try:  # the files are only measured: kept, they held hundreds of MB per base-sized model
        ids = torch.randint(5, model.config.vocab_size, (2, 16))
        export.to_onnx(model, (ids, torch.ones_like(ids)), folder / "fp32.onnx")
        quantize.int8_dynamic(folder / "fp32.onnx", folder / "int8.onnx")
        row["size_fp32_mb"] = round(weights_mb(folder / "fp32.onnx"), 3)  # over 2 GB, ONNX holds its weights beside
        row["size_int8_mb"] = round(weights_mb(folder / "int8.onnx"), 3)
        common = {"synthetic": model.config.vocab_size, "seq_len": seq_len, "threads": threads}
        fp32 = bench.measure(folder / "fp32.onnx", batch=1, runs=20, warmup=3, **common)
        int8 = bench.measure(folder / "int8.onnx", batch=1, runs=20, warmup=3, **common)
        int8_b32 = bench.measure(folder / "int8.onnx", batch=32, runs=3, warmup=1, **common)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    row.update(latency_ms_b1_fp32=fp32["fixed"]["p50"], latency_ms_b1_int8=int8["fixed"]["p50"],
               latency_ms_b32_int8=int8_b32["fixed"]["p50"], rss_after_load_mb_int8=int8["rss_after_load_mb"])
    return row


@families.quiet_transformers()
def run(specs: list, out: Path, data_source: str = None, threads: int = 1, seq_len: int = 128,
        progress: bool = True, text_column: str = "text", label_column: str = "label",
        label_separator: str = "", label_columns: str = "") -> list:
    if not specs:
        raise UsageError("compare needs models: asset names, folders, config.json files, or --families")
    if not 2 <= seq_len <= 512:
        raise UsageError(f"--seq-len {seq_len}: give a sequence length in [2, 512] (the models' position tables)")
    data = None
    if data_source:
        from edgekit import data as datasets

        try:  # the whole test split, as the evaluate stage scores it
            data = datasets.load(data_source, text_column=text_column, label_column=label_column,
                                 label_separator=label_separator, label_columns=label_columns)
        except UsageError as e:  # its advice names the recipe's settings: here they are flags
            raise UsageError(datasets.as_flags(str(e))) from None
    for spec in specs:  # a typo in the last model stops the command before the first is measured
        check(spec, seq_len)
    out.mkdir(parents=True, exist_ok=True)
    for name in OUTPUTS:  # an earlier call's table must not pass for this one's if this one stops
        (out / name).unlink(missing_ok=True)
    try:
        rows = [measure(spec, out / "models", data, threads, seq_len)
                for spec in progress_bar(specs, desc="compare", unit="model", disable=not progress)]
    finally:  # where each model's files were measured (and where earlier versions left them)
        shutil.rmtree(out / "models", ignore_errors=True)
    write(rows, out, seq_len, threads)
    return rows


OUTPUTS = ("compare.md", "compare.csv", "compare.json", "compare.png")


def markdown(rows: list) -> str:
    head = ["model", "params (M)", "FP32 MB", "INT8 MB", "b1 FP32 ms", "b1 INT8 ms", "b32 INT8 ms",
            "RSS after load MiB", "accuracy", "micro-F1"]
    lines = ["| " + " | ".join(head) + " |", "|---|" + "---:|" * (len(head) - 1)]
    for r in rows:
        cells = [str(r[c]).replace("\\", "\\\\").replace("|", "\\|") if c == "model"  # a | would end the cell
                 else number(r.get(c), "M" if c == "params_m" else unit_of(c)) for c in COLUMNS]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n\n" + PLAIN + "\n"


PLAIN = ("Each model as it is, before any recipe: exported to ONNX without edgekit's graph rewrites and quantized with "
         "ONNX Runtime dynamic INT8, so a run's final file of the same weights is smaller and faster than its row.")


def write(rows: list, out: Path, seq_len: int = 128, threads: int = 1) -> None:
    write_text(out / "compare.md", markdown(rows))
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=COLUMNS)
    w.writeheader()
    w.writerows([{c: r.get(c) for c in COLUMNS} for r in rows])
    write_text(out / "compare.csv", buf.getvalue())
    write_json(out / "compare.json", rows)
    chart(rows, out / "compare.png", seq_len, threads)


def short_name(model: str, most: int = 32) -> str:
    """A model's name as the chart's tick label: a long path by its last two parts (an absolute path shrank both
    panels to slivers); the tables keep the whole name."""
    if len(model) <= most or "/" not in model.rstrip("/"):
        return model
    return "…/" + "/".join(Path(model.rstrip("/")).parts[-2:])


def chart(rows: list, path: Path, seq_len: int = 128, threads: int = 1) -> None:
    from edgekit.report import pyplot

    plt = pyplot()

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 0.5 * len(rows) + 2), dpi=120)
    names = [short_name(r["model"]) for r in rows]
    y = range(len(rows))
    left.barh([i - 0.2 for i in y], [r["size_fp32_mb"] for r in rows], height=0.4, label="FP32")
    left.barh([i + 0.2 for i in y], [r["size_int8_mb"] for r in rows], height=0.4, label="INT8")
    left.set_yticks(list(y), names)
    left.set_xlabel("size (MB)")
    left.set_title("size")
    left.legend(frameon=False)
    right.barh([i - 0.2 for i in y], [r["latency_ms_b1_fp32"] for r in rows], height=0.4, label="FP32")
    right.barh([i + 0.2 for i in y], [r["latency_ms_b1_int8"] for r in rows], height=0.4, label="INT8")
    right.set_yticks(list(y), [""] * len(rows))
    right.set_xlabel(f"latency p50, batch 1, {seq_len} tokens, {threads_text(threads)} (ms)")
    right.set_title("latency (ONNX Runtime)")
    right.legend(frameon=False)
    for ax in (left, right):
        ax.invert_yaxis()
        ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, bbox_inches="tight")
    plt.close(fig)
