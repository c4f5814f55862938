"""Per-architecture table: where the layers and the attention/FFN projections live, and how to load,
save and cut a model of each family. transformers 5 has no `prune_heads`, so pruned shapes travel in
config.json under `edgekit_shapes` and are re-applied before the weights are loaded."""
import contextlib
import logging
import sys
import warnings
from pathlib import Path

import torch

from edgekit.errors import EdgekitError

# model_type -> layer list path, and per-layer module paths: q, k, v (or one fused qkv), attention output, FFN in,
# FFN out.
def _bert_like(prefix: str) -> dict:
    return {"layers": f"{prefix}.encoder.layer", "q": "attention.self.query", "k": "attention.self.key",
            "v": "attention.self.value", "o": "attention.output.dense", "ffn_in": "intermediate.dense",
            "ffn_out": "output.dense"}


FAMILIES = {
    "bert": _bert_like("bert"),
    "roberta": _bert_like("roberta"),
    "xlm-roberta": _bert_like("roberta"),  # RoBERTa's code: multilingual (XLM-R), and French (CamemBERT)
    "camembert": _bert_like("roberta"),
    "data2vec-text": _bert_like("data2vec_text"),  # RoBERTa's layout, trained as data2vec
    "ernie": _bert_like("ernie"),  # BERT's layout (Baidu's ERNIE 1-3)
    "electra": _bert_like("electra"),
    # MPNet computes one relative position bias for all heads, once per forward: see keep_bias_heads
    "mpnet": {"layers": "mpnet.encoder.layer", "q": "attention.attn.q", "k": "attention.attn.k",
              "v": "attention.attn.v", "o": "attention.attn.o", "ffn_in": "intermediate.dense",
              "ffn_out": "output.dense", "bias_heads": "attention.attn"},
    "distilbert": {"layers": "distilbert.transformer.layer", "q": "attention.q_lin", "k": "attention.k_lin",
                   "v": "attention.v_lin", "o": "attention.out_lin", "ffn_in": "ffn.lin1", "ffn_out": "ffn.lin2"},
    # DeBERTa-v2/v3: disentangled attention over relative positions; it splits heads by its own count (heads)
    "deberta-v2": {"layers": "deberta.encoder.layer", "q": "attention.self.query_proj",
                   "k": "attention.self.key_proj", "v": "attention.self.value_proj", "o": "attention.output.dense",
                   "ffn_in": "intermediate.dense", "ffn_out": "output.dense", "heads": "attention.self"},
    # ALBERT shares one layer across depth: a student keeps the shared weights and runs fewer times.
    "albert": {"layers": "albert.encoder.albert_layer_groups.0.albert_layers", "shared": True,
               "q": "attention.query", "k": "attention.key", "v": "attention.value", "o": "attention.dense",
               "ffn_in": "ffn", "ffn_out": "ffn_output"},
    # ModernBERT: one fused Q|K|V (all queries, then keys, then values), a gated FFN (Wi: the input half, then the
    # gate half), rotary positions, sliding-window attention in some layers, no token types
    "modernbert": {"layers": "model.layers", "qkv": "attn.Wqkv", "o": "attn.Wo", "ffn_in": "mlp.Wi",
                   "ffn_out": "mlp.Wo", "glu": True},
}


def qkv_names(fam: dict) -> tuple:
    """The family's query / key / value projections: three, or one fused."""
    return ("qkv",) if "qkv" in fam else ("q", "k", "v")


def head_rows(name: str, linear, rows):
    """The output rows of projection `name` that hold a layer's head rows `rows`: a fused Q|K|V holds them once in
    each of its three blocks."""
    if name != "qkv":
        return rows
    block = linear.out_features // 3
    return torch.cat([rows + i * block for i in range(3)])


def ffn_rows(fam: dict, linear, neurons):
    """The output rows of the FFN input projection that feed FFN neurons `neurons`: a gated FFN (GLU) has an input
    row and a gate row for each."""
    if not fam.get("glu"):
        return neurons
    return torch.cat([neurons, neurons + linear.out_features // 2])


@contextlib.contextmanager
def quiet_transformers():
    """transformers' and torch.onnx's info lines, warnings and progress bars off inside the `with` (or a function
    it decorates); the host's settings come back after it (edgekit.load inside an application left them off)."""
    import huggingface_hub.utils as hub
    import transformers

    verbosity, bars = transformers.logging.get_verbosity(), transformers.utils.logging.is_progress_bar_enabled()
    hub_bars, onnx_log = hub.are_progress_bars_disabled(), logging.getLogger("torch.onnx")
    level = onnx_log.level
    with warnings.catch_warnings():
        transformers.logging.set_verbosity_error()
        transformers.utils.logging.disable_progress_bar()
        onnx_log.setLevel(logging.ERROR)
        warnings.filterwarnings("ignore", module="torch.onnx")
        warnings.filterwarnings("ignore", category=UserWarning, module="transformers")
        try:
            yield
        finally:
            transformers.logging.set_verbosity(verbosity)
            if bars:
                transformers.utils.logging.enable_progress_bar()
            (hub.disable_progress_bars if hub_bars else hub.enable_progress_bars)()
            onnx_log.setLevel(level)


def family(config) -> dict:
    if config.model_type not in FAMILIES:
        raise EdgekitError(f"model type '{config.model_type}' is not supported; supported: {', '.join(FAMILIES)}")
    if problem := config_problem(config):
        raise EdgekitError(f"{getattr(config, 'name_or_path', '') or 'the model'}'s config.json {problem}")
    return FAMILIES[config.model_type]


def config_problem(config) -> str:
    """'' or what a supported family's config asks that transformers 5 or edgekit would not do as asked, silently
    (each ran, giving a model other than the config's): edgekit's layer paths hold ALBERT's first layer group
    only; transformers 5 dropped relative_key positions and computes MPNet's buckets as 32."""
    if config.model_type == "albert" and getattr(config, "num_hidden_groups", 1) != 1:
        return (f"sets num_hidden_groups {config.num_hidden_groups}; edgekit prunes and distils ALBERT's one shared "
                f"layer group (every published ALBERT has 1): give a model with num_hidden_groups 1")
    # ModernBERT's positions are rotary whatever the key says (mmBERT's config sets sans_pos)
    if config.model_type != "modernbert" and getattr(config, "position_embedding_type", None) not in (None, "absolute"):
        return (f"sets position_embedding_type {config.position_embedding_type}, which transformers 5 no longer "
                f"runs (it would drop those weights and use absolute positions): give a model with absolute positions")
    if config.model_type == "mpnet" and getattr(config, "relative_attention_num_buckets", 32) != 32:
        return (f"sets relative_attention_num_buckets {config.relative_attention_num_buckets}; transformers 5 "
                f"computes MPNet's relative positions in 32 buckets: give a model with 32")
    if config.model_type == "deberta-v2" and getattr(config, "attention_head_size", None) not in (
            None, config.hidden_size // config.num_attention_heads):
        return (f"sets attention_head_size {config.attention_head_size}, not hidden_size / num_attention_heads "
                f"({config.hidden_size // config.num_attention_heads}), which edgekit's pruning assumes: give a model "
                f"without attention_head_size")
    if getattr(config, "is_decoder", False):
        return ("sets is_decoder: true, so every token sees only those before it and the first token, the one the "
                "classifier reads, sees only itself; set is_decoder to false")
    return ""


def layers(model):
    return model.get_submodule(family(model.config)["layers"])


def label_names(config) -> list:
    """The classifier's labels, index = class id."""
    if sorted(config.id2label) != list(range(config.num_labels)):  # transformers makes the keys ints
        keys = ", ".join(map(str, sorted(config.id2label)[:6]))
        raise EdgekitError(f"{getattr(config, 'name_or_path', '') or 'the model'}'s config.json numbers its classes "
                           f"{keys} (id2label); they must be the class ids 0 to {config.num_labels - 1}: renumber "
                           f"id2label and label2id in config.json")
    return [config.id2label[i] for i in range(config.num_labels)]


def unnamed(labels: list) -> bool:
    """transformers' default names (LABEL_0, LABEL_1, ...): a head whose classes were never named."""
    return list(labels) == [f"LABEL_{i}" for i in range(len(labels))]


def named(model, labels: list):
    """`model` with the data's label names where its head's were never named (LABEL_0, ...): a teacher used without
    a finetune stage (pipeline.check_labels takes such labels in order), so that what a run writes says neg / pos."""
    if labels and unnamed(label_names(model.config)) and model.config.num_labels == len(labels):
        model.config.id2label, model.config.label2id = dict(enumerate(labels)), {n: i for i, n in enumerate(labels)}
    return model


def max_tokens(config) -> int:
    """The longest input the position table takes (RoBERTa and MPNet start positions after the padding id)."""
    offset = 2 if config.model_type in ("roberta", "xlm-roberta", "camembert", "data2vec-text", "mpnet") else 0
    return config.max_position_embeddings - offset


def num_layers(config) -> int:
    return config.num_hidden_layers


def ffn_size(config) -> int:
    """The unpruned FFN width (DistilBERT calls it hidden_dim)."""
    return getattr(config, "intermediate_size", None) or config.hidden_dim


@quiet_transformers()
def load_model(path, labels=None, pairs: bool = False, multi_label: bool = False):
    """A sequence classifier from a transformers folder; pruned shapes from `edgekit_shapes` are re-applied.
    `labels` (names, index = class id): a head trained on the same classes in another order has its output rows
    reordered; a head for other classes, or none (a plain encoder), starts fresh; a head whose labels were never
    named (LABEL_0, ...) keeps its order. `pairs` (a run on text pairs), or a folder saved by such a run: the
    model reads token types from its ids (derive_segments). With `labels`, the head is a multi-label one
    (a sigmoid per label) when `multi_label`, else a single-label classifier."""
    model = _load_model(path, labels, multi_label)
    sep = getattr(model.config, "edgekit_sep_id", None)
    if sep is None and pairs and uses_segments(model):
        sep = pair_separator(load_tokenizer(path))
    return derive_segments(model, sep) if sep is not None else model


def uses_segments(model) -> bool:
    """Whether `model` has token types to read (BERT, ALBERT, ELECTRA, ERNIE: a pair's second text is type 1);
    RoBERTa's family has one type, MPNet, DistilBERT and DeBERTa-v3 none."""
    types = getattr(model.base_model.embeddings, "token_type_embeddings", None)
    return isinstance(types, torch.nn.Embedding) and types.num_embeddings > 1


def pair_separator(tokenizer) -> int | None:
    """The separator id when `tokenizer` types a pair's second text 1, as BERT's does (`segments` reads the types
    from it); None when it types every token 0 (RoBERTa's, whatever the model's table holds)."""
    types = tokenizer("a", "b", return_token_type_ids=True)["token_type_ids"]
    return tokenizer.sep_token_id if 1 in types and tokenizer.sep_token_id is not None else None


def segments(input_ids, sep_id: int):
    """Token types from ids as the tokenizer gives them for a pair `[CLS] a [SEP] b [SEP] [PAD]..`: 1 from after
    the first separator through the second, 0 elsewhere (a single text's pads read 1: masked, they change
    nothing). A text that holds the separator's own string ("[SEP]"), which the tokenizer reads as the separator,
    moves the types after it: pipeline.tell_length warns of such training pairs."""
    sep = (input_ids == sep_id).long()
    return ((sep.cumsum(-1) - sep) == 1).long()


def derive_segments(model, sep_id: int):
    """`model` reading its token types from its input ids (`segments`), so that training, evaluation and every
    exported graph (input_ids and attention_mask in) read a text pair as the tokenizer typed it, with no third
    input. Recorded in the config (`edgekit_sep_id`), so a saved folder loads the same way."""
    if not uses_segments(model):
        return model
    model.config.edgekit_sep_id = int(sep_id)
    embeddings = model.base_model.embeddings
    if getattr(embeddings, "edgekit_segments", None) is None:
        def typed(module, args, kwargs):
            ids = kwargs.get("input_ids", args[0] if args else None)
            if ids is None:
                return None
            types = segments(ids, module.edgekit_segments)
            if len(args) > 1:  # token_type_ids given by position
                return (args[0], types) + tuple(args[2:]), kwargs
            return args, {**kwargs, "token_type_ids": types}
        embeddings.register_forward_pre_hook(typed, with_kwargs=True)
    embeddings.edgekit_segments = int(sep_id)
    return model


def is_multi_label(config) -> bool:
    """Whether the model's head scores each label on its own (a sigmoid per label, any number of them true)."""
    return getattr(config, "problem_type", None) == "multi_label_classification"


def _load_model(path, labels=None, multi_label: bool = False):
    from safetensors.torch import load_file
    from transformers import AutoConfig, AutoModelForSequenceClassification

    path = Path(path)
    if not (path / "config.json").is_file():
        raise EdgekitError(f"{path} is not a model folder (no config.json); give an asset name or a transformers folder")
    config = AutoConfig.from_pretrained(path)
    family(config)
    shapes, old = getattr(config, "edgekit_shapes", None), label_names(config)
    if shapes and labels is not None and old != list(labels):
        raise EdgekitError(f"{path} is a pruned model for [{', '.join(old)}], not "
                           f"[{', '.join(labels)}]; start from the unpruned model, or give data with its labels")
    if shapes:
        model = AutoModelForSequenceClassification.from_config(config)
        apply_shapes(model, shapes)
        state = load_file(path / "model.safetensors")
        expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
        bad = [k for k, v in state.items() if k in expected and tuple(v.shape) != expected[k]]
        missing = [k for k in expected if k not in state and not k.endswith("position_ids")]
        if bad or missing:
            raise EdgekitError(f"{path}: weights do not match the pruned shapes in config.json "
                               f"({(bad + missing)[0]}); the checkpoint is damaged, re-run the prune stage")
        model.load_state_dict(state, strict=False)
        return model.eval()
    # trained for the data's labels (finetune): the head becomes the data's kind, a single-label classifier (from
    # a regression or multi-label head too) or a multi-label one
    kind = {"problem_type": "multi_label_classification" if multi_label else "single_label_classification"} \
        if labels is not None and (multi_label or config.problem_type in ("regression", "multi_label_classification")) \
        else {}
    if labels is None or old == list(labels):
        with torch.device("cpu"):
            return AutoModelForSequenceClassification.from_pretrained(path, use_safetensors=True, dtype=torch.float32,
                                                                      **kind).eval()
    labels = list(labels)
    with torch.device("cpu"):
        model, info = AutoModelForSequenceClassification.from_pretrained(
            path, num_labels=len(labels), id2label=dict(enumerate(labels)), label2id={n: i for i, n in enumerate(labels)},
            ignore_mismatched_sizes=True, output_loading_info=True, use_safetensors=True, dtype=torch.float32,
            **kind)  # never a pickle; float32 whatever the checkpoint's dtype (hub models often ship float16)
    head = [m for n, m in model.named_children() if n != model.base_model_prefix]
    fresh = [k if isinstance(k, str) else k[0] for k in [*info["missing_keys"], *info.get("mismatched_keys", ())]]
    loaded = not any(k.split(".")[0] != model.base_model_prefix for k in fresh)  # the folder had this head
    if loaded and sorted(old) == sorted(labels):  # the same classes in another order: move the output rows
        out = [m for h in head for m in h.modules() if isinstance(m, torch.nn.Linear)][-1]
        order = torch.tensor([old.index(n) for n in labels])
        with torch.no_grad():
            out.weight.copy_(out.weight[order])
            if out.bias is not None:
                out.bias.copy_(out.bias[order])
    elif loaded and not unnamed(old):  # a head for other classes: it starts again, as a new head would
        print(f"edgekit: warning: {path}'s head is trained for [{', '.join(old)}], not [{', '.join(labels)}]; a new "
              f"head is trained instead (to keep that one, give data with its label names)", file=sys.stderr, flush=True)
        std = getattr(model.config, "initializer_range", 0.02)
        with torch.no_grad():
            for m in (m for h in head for m in h.modules() if isinstance(m, torch.nn.Linear)):
                m.weight.normal_(0.0, std, generator=torch.Generator().manual_seed(0))
                if m.bias is not None:
                    m.bias.zero_()
    return model.eval()


@quiet_transformers()
def load_tokenizer(path, trust_remote_code: bool = False):
    """The folder's tokenizer, padding on the right as training, the exported files and device_bench do (a folder
    saying `padding_side: left` moved a padded sentence's positions in batches only)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)  # never a folder's own code
    tokenizer.padding_side = "right"
    return tokenizer


def save_model(model, tokenizer, out: Path, max_length: int):
    """A stage's model; its tokenizer records the run's `max_length` (model_max_length), so that the folder copied
    out of the run still cuts texts where the run's exported files do."""
    model.save_pretrained(out)
    tokenizer.model_max_length = max_length
    tokenizer.save_pretrained(out)


def apply_shapes(model, shapes: dict):
    """Shrink the vocabulary and each layer's projections to the recorded sizes (weights loaded afterwards)."""
    if "vocab" in shapes:
        embedding = model.get_input_embeddings()
        rank = shapes.get("embedding_rank")
        small = torch.nn.Embedding(shapes["vocab"], rank or embedding.embedding_dim)
        project = torch.nn.Linear(rank, embedding.embedding_dim, bias=False) if rank else None
        model.set_input_embeddings(RemappedEmbedding(torch.zeros(embedding.num_embeddings, dtype=torch.long), small,
                                                     project))
    if "hidden" in shapes:
        narrow_hidden(model, torch.arange(shapes["hidden"]))  # shapes only: the weights load afterwards
    if "heads" not in shapes:
        return
    fam = family(model.config)
    head_dim = model.config.hidden_size // model.config.num_attention_heads
    width = hidden_width(model.config)
    blocks = layers(model)
    if len(shapes["heads"]) != len(blocks) or len(shapes["ffn"]) != len(blocks):
        raise EdgekitError(f"edgekit_shapes lists {len(shapes['heads'])} layers, the model has {len(blocks)}; "
                           f"the checkpoint is damaged, re-run the prune stage")
    def linear(block, name, inputs, outputs):  # with a bias where the family's has one (ModernBERT's have none)
        return torch.nn.Linear(inputs, outputs, bias=block.get_submodule(fam[name]).bias is not None)

    for i, block in enumerate(blocks):
        heads, ffn = shapes["heads"][i], shapes["ffn"][i]
        for name in qkv_names(fam):
            replace_module(block, fam[name], linear(block, name, width, heads * head_dim * (3 if name == "qkv" else 1)))
        replace_module(block, fam["o"], linear(block, "o", heads * head_dim, width))
        replace_module(block, fam["ffn_in"], linear(block, "ffn_in", width, ffn * (2 if fam.get("glu") else 1)))
        replace_module(block, fam["ffn_out"], linear(block, "ffn_out", ffn, width))
        if fam.get("bias_heads"):
            keep_bias_heads(block.get_submodule(fam["bias_heads"]), list(range(heads)))  # indices load with weights
        if fam.get("heads"):
            count_heads(block.get_submodule(fam["heads"]), torch.arange(heads * head_dim), heads)


def hidden_width(config) -> int:
    """The width of the residual stream: `hidden_size`, or less after hidden-width pruning (the config keeps its
    nominal hidden_size and head count, which fix the head width)."""
    return (getattr(config, "edgekit_shapes", None) or {}).get("hidden", config.hidden_size)


HIDDEN_FAMILIES = ("bert", "roberta", "xlm-roberta", "camembert", "data2vec-text", "electra")


def hidden_parts(model) -> dict:
    """Module paths of a BERT-like model that touch the residual stream, for hidden-width pruning: embedding tables
    (columns), LayerNorms, Linears that read it (input columns) and Linears that write it (output rows). The
    classifier's first Linear reads it and keeps its own width."""
    if model.config.model_type not in HIDDEN_FAMILIES:
        raise EdgekitError(f"prune.hidden_keep: hidden-width pruning supports {', '.join(HIDDEN_FAMILIES)}, not "
                           f"{model.config.model_type}; leave hidden_keep at 1")
    fam, base = family(model.config), model.base_model_prefix
    parts = {"tables": [], "norms": [], "readers": [], "writers": []}
    if hasattr(model.base_model, "embeddings_project"):  # ELECTRA with narrower embeddings: the stream starts here
        parts["writers"].append(f"{base}.embeddings_project")
    else:
        parts["tables"] += [f"{base}.embeddings.{t}_embeddings" for t in ("word", "position", "token_type")]
        parts["norms"].append(f"{base}.embeddings.LayerNorm")
    for i in range(len(layers(model))):
        p = f"{fam['layers']}.{i}."
        parts["readers"] += [p + fam[n] for n in ("q", "k", "v", "ffn_in")]
        parts["writers"] += [p + fam["o"], p + fam["ffn_out"]]
        parts["norms"] += [p + "attention.output.LayerNorm", p + "output.LayerNorm"]
    parts["readers"].append(f"{base}.pooler.dense" if getattr(model.base_model, "pooler", None) else "classifier.dense")
    return parts


def narrow_hidden(model, dims) -> None:
    """Keep residual-stream dimensions `dims` (sorted indices) in every module that touches it."""
    def narrow(m):
        if isinstance(m, RemappedEmbedding):
            return RemappedEmbedding(m.remap, m.embedding, linear_slice(m.project, dims, out=True)) \
                if m.project is not None else RemappedEmbedding(m.remap, narrow(m.embedding))
        if isinstance(m, torch.nn.Embedding):
            new = torch.nn.Embedding(m.num_embeddings, len(dims), padding_idx=m.padding_idx)
            new.weight.data.copy_(m.weight.detach()[:, dims])
        else:
            new = torch.nn.LayerNorm(len(dims), eps=m.eps)
            new.weight.data.copy_(m.weight.detach()[dims])
            new.bias.data.copy_(m.bias.detach()[dims])
        return new

    parts = hidden_parts(model)
    for path in parts["tables"] + parts["norms"]:
        replace_module(model, path, narrow(model.get_submodule(path)))
    for kind, out in (("readers", False), ("writers", True)):
        for path in parts[kind]:
            replace_module(model, path, linear_slice(model.get_submodule(path), dims, out=out))


def linear_slice(linear, index, out: bool):
    """A new Linear keeping output rows (out=True) or input columns (out=False) at `index`."""
    weight = linear.weight.detach()[index] if out else linear.weight.detach()[:, index]
    new = torch.nn.Linear(weight.shape[1], weight.shape[0], bias=linear.bias is not None)
    new.weight.data.copy_(weight)
    if linear.bias is not None:
        new.bias.data.copy_(linear.bias.detach()[index] if out else linear.bias.detach())
    return new


def count_heads(attention, rows, heads: int) -> None:
    """DeBERTa's attention after its query/key/value kept `rows` (`heads` heads): it splits by its own head count,
    and without share_att_key projects relative positions through pos_key_proj / pos_query_proj, whose rows
    follow the keys' and queries'."""
    for name in ("pos_key_proj", "pos_query_proj"):
        if isinstance(linear := getattr(attention, name, None), torch.nn.Linear):
            setattr(attention, name, linear_slice(linear, rows, out=True))
    attention.num_attention_heads, attention.all_head_size = heads, len(rows)


def keep_bias_heads(attention, heads: list) -> None:
    """Pruned MPNet attention: keep the shared relative position bias rows of the kept heads (indices into the
    layer's current heads). The indices are a saved buffer, so a pruned checkpoint reloads them."""
    current = getattr(attention, "kept_heads", None)
    index = current[torch.tensor(heads)] if current is not None else torch.tensor(heads)
    attention.register_buffer("kept_heads", index.clone())
    attention.all_head_size = len(heads) * attention.attention_head_size
    attention.num_attention_heads = len(heads)
    if current is None:
        attention.register_forward_pre_hook(_slice_position_bias)


def _slice_position_bias(attention, args):
    if len(args) > 2 and args[2] is not None:
        return (*args[:2], args[2].index_select(1, attention.kept_heads), *args[3:])
    return None


class RemappedEmbedding(torch.nn.Module):
    """Word embeddings for a pruned vocabulary: the tokenizer is unchanged, the ids it produces are remapped
    to the kept rows, every id outside the kept vocabulary to the unknown token's row. With `project`, the rows
    are rank-r and a bias-free r -> hidden Linear follows (ALBERT's factorized embedding)."""

    def __init__(self, remap, embedding, project=None):
        super().__init__()
        self.register_buffer("remap", remap)
        self.embedding, self.project = embedding, project
        self.num_embeddings = len(remap)
        self.embedding_dim = project.out_features if project is not None else embedding.embedding_dim

    @property
    def weight(self):
        return self.embedding.weight

    def forward(self, input_ids):
        rows = self.embedding(self.remap[input_ids])
        return rows if self.project is None else self.project(rows)


def replace_module(root, dotted: str, module):
    parent, _, name = dotted.rpartition(".")
    setattr(root.get_submodule(parent) if parent else root, name, module)


def student_from_teacher(teacher, keep: list):
    """A shallower copy of the teacher keeping the listed layers (DistilBERT's initialisation)."""
    import copy

    depth = num_layers(teacher.config)
    bad = [i for i in keep if not 0 <= i < depth]
    if bad or not keep:
        raise EdgekitError(f"student layers {keep} must be teacher layer indices 0..{depth - 1}")
    fam = family(teacher.config)
    student = copy.deepcopy(teacher)
    keep_layers(student.config, keep)
    shapes = getattr(student.config, "edgekit_shapes", None)
    if shapes and "heads" in shapes and not fam.get("shared"):  # a pruned teacher: the kept layers' own shapes
        student.config.edgekit_shapes = dict(shapes, heads=[shapes["heads"][i] for i in keep],
                                             ffn=[shapes["ffn"][i] for i in keep])
    if not fam.get("shared"):
        blocks = layers(teacher)
        shared = {id(teacher.config): student.config}  # the copied layers read the student's config (attention kind)
        replace_module(student, fam["layers"], torch.nn.ModuleList([copy.deepcopy(blocks[i], dict(shared))
                                                                    for i in keep]))
        for j, block in enumerate(layers(student)):
            for m in block.modules():
                if hasattr(m, "layer_idx"):
                    m.layer_idx = j
        if teacher.config.model_type == "modernbert":
            first_layer_norms(student)
    return student


def keep_layers(config, keep: list) -> None:
    """`config` for a model of the teacher layers `keep`: their count, and ModernBERT's attention kind (full or
    sliding window) of each."""
    config.num_hidden_layers = len(keep)
    if config.model_type == "modernbert":
        config.layer_types = [config.layer_types[i] for i in keep]


def first_layer_norms(model) -> None:
    """ModernBERT's first layer reads the embeddings' normalized output without a norm of its own, every other
    layer through one (attn_norm), by position: a student whose first layer is a later teacher layer drops that
    norm, one whose later layer is teacher layer 0 gets a new one, so that the model reloads as it trains."""
    for j, block in enumerate(layers(model)):
        if j == 0 and not isinstance(block.attn_norm, torch.nn.Identity):
            block.attn_norm = torch.nn.Identity()
        elif j > 0 and isinstance(block.attn_norm, torch.nn.Identity):
            block.attn_norm = torch.nn.LayerNorm(model.config.hidden_size, eps=model.config.norm_eps,
                                                 bias=model.config.norm_bias)


STUDENT_KEYS = ("num_hidden_layers", "hidden_size", "intermediate_size", "num_attention_heads")
VOCAB_SHAPES = ("vocab", "embedding_rank")  # edgekit_shapes of the word embeddings, not of the layers


def student_config(config, overrides: dict, keep: list):
    """The teacher's config with `overrides` (STUDENT_KEYS) for a student of teacher layers `keep`."""
    import copy

    unknown = [k for k in overrides if k not in STUDENT_KEYS]
    if unknown:
        raise EdgekitError(f"distill.student_config key '{unknown[0]}' is not supported; keys: {', '.join(STUDENT_KEYS)}")
    depth = num_layers(config)
    if [i for i in keep if not 0 <= i < depth] or not keep:
        raise EdgekitError(f"student layers {keep} must be teacher layer indices 0..{depth - 1}")
    config = copy.deepcopy(config)
    if hasattr(config, "edgekit_shapes"):  # a pruned teacher's layer shapes: a student of new sizes is built whole;
        vocab = {k: v for k, v in config.edgekit_shapes.items() if k in VOCAB_SHAPES}  # its vocabulary stays
        del config.edgekit_shapes
        if vocab:
            config.edgekit_shapes = vocab
    for k, v in overrides.items():
        setattr(config, "hidden_dim" if k == "intermediate_size" and hasattr(config, "hidden_dim") else k, v)
    keep_layers(config, keep)
    if "hidden_size" in overrides and hasattr(config, "pooler_hidden_size"):  # DeBERTa's pooler reads the stream
        config.pooler_hidden_size = config.hidden_size
    if config.hidden_size % config.num_attention_heads:
        raise EdgekitError(f"student hidden_size {config.hidden_size} is not a multiple of num_attention_heads "
                           f"{config.num_attention_heads}; choose sizes with a whole head width")
    if config.model_type == "modernbert" and config.hidden_size // config.num_attention_heads % 2:
        raise EdgekitError(f"student hidden_size {config.hidden_size} / num_attention_heads {config.num_attention_heads}"
                           f" gives heads {config.hidden_size // config.num_attention_heads} wide; ModernBERT's rotary "
                           f"positions rotate pairs of dimensions: choose sizes with an even head width")
    return config


def student_from_config(teacher, overrides: dict, keep: list) -> tuple:
    """A smaller model of the teacher's family: the teacher's config with `overrides` (STUDENT_KEYS), each weight
    initialised from the teacher where shapes allow: student layer j from teacher layer keep[j], a smaller matrix
    from the leading rows and columns of the teacher's (weight selection), a weight with more dimensions than the
    teacher's left at its random initialisation. Returns (student, fraction of weights taken from the teacher)."""
    from transformers import AutoModelForSequenceClassification

    config = student_config(teacher.config, overrides, keep)
    student = AutoModelForSequenceClassification.from_config(config)
    if shapes := getattr(config, "edgekit_shapes", None):  # a pruned vocabulary: its rows and remap copy across
        apply_shapes(student, shapes)
    fam = family(config)
    prefix = fam["layers"] + "."
    source = teacher.state_dict()
    state, taken, count = student.state_dict(), 0, 0
    for name, w in state.items():
        tname = name
        if name.startswith(prefix) and not fam.get("shared"):
            index, rest = name[len(prefix):].split(".", 1)
            tname = f"{prefix}{keep[int(index)]}.{rest}"
        t = source.get(tname)
        count += w.numel()
        if t is not None and t.dim() == w.dim() and all(a <= b for a, b in zip(w.shape, t.shape)):
            parts = row_blocks(fam, name)  # a fused Q|K|V or gated FFN: the leading rows of each block
            lead = tuple(slice(0, n) for n in (w.shape[0] // parts, *w.shape[1:]))
            w.copy_(torch.cat([block[lead] for block in t.chunk(parts)]))
            taken += w.numel()
    return student.eval(), taken / max(1, count)


def row_blocks(fam: dict, name: str) -> int:
    """How many blocks of rows the weight or bias `name` stacks: 3 in a fused Q|K|V, 2 in a gated FFN's input
    projection, else 1."""
    module = name.rsplit(".", 1)[0]
    if "qkv" in fam and module.endswith("." + fam["qkv"]):
        return 3
    return 2 if fam.get("glu") and module.endswith("." + fam["ffn_in"]) else 1
