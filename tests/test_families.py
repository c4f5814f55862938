import importlib.util
import json
import re

import pytest
import torch

from edgekit.testing import make_model_dir
from edgekit import families
from edgekit.errors import EdgekitError
from edgekit.stages.prune import prune_model

FAMILIES = ["bert", "roberta", "xlm-roberta", "camembert", "data2vec-text", "ernie", "electra", "distilbert", "albert",
            "mpnet", "deberta-v2", "modernbert"]


def inputs():
    ids = torch.tensor([[2, 10, 12, 5, 3, 0], [2, 7, 3, 0, 0, 0]])
    return {"input_ids": ids, "attention_mask": (ids != 0).long()}


@pytest.mark.parametrize("family", FAMILIES)
def test_student_keeps_the_listed_teacher_layers(tmp_path, family):
    teacher = families.load_model(make_model_dir(tmp_path / family, family, layers=4))
    student = families.student_from_teacher(teacher, [1, 3])
    assert student.config.num_hidden_layers == 2
    with torch.no_grad():
        t = teacher(**inputs(), output_hidden_states=True)
        s = student(**inputs(), output_hidden_states=True)
    assert s.logits.shape == t.logits.shape
    assert len(s.hidden_states) == 3 and len(t.hidden_states) == 5
    if family != "albert":  # a copied layer is the same function as the teacher's
        layer_s = families.layers(student)[1].state_dict()
        layer_t = families.layers(teacher)[3].state_dict()
        assert all(torch.equal(layer_s[k], layer_t[k]) for k in layer_t)


@pytest.mark.parametrize("family,rank", [("bert", 0), ("albert", 0), ("mpnet", 8), ("modernbert", 0)])
def test_a_student_config_student_of_a_vocabulary_pruned_teacher_keeps_its_word_rows(tmp_path, family, rank):
    """Was: the student had a full-size table at random (the teacher's rows sit behind its id remap)."""
    from edgekit.stages.prune import factorize_embedding, keep_vocab

    teacher = families.load_model(make_model_dir(tmp_path / family, family, layers=4))
    if rank:
        factorize_embedding(teacher, rank)
    keep_vocab(teacher, list(range(40)), 1)
    student, _ = families.student_from_config(teacher, {"hidden_size": 16, "num_attention_heads": 2}, [0, 3])
    got, want = student.get_input_embeddings(), teacher.get_input_embeddings()
    assert torch.equal(got.remap, want.remap) and torch.equal(got.weight, want.weight[:, :got.weight.shape[1]])
    assert student.config.edgekit_shapes == {"vocab": 40, **({"embedding_rank": rank} if rank else {})}
    student.save_pretrained(tmp_path / "student")
    with torch.no_grad():
        assert torch.allclose(families.load_model(tmp_path / "student")(**inputs()).logits,
                              student(**inputs()).logits, atol=1e-6)


@pytest.mark.parametrize("family", ["bert", "distilbert"])
def test_a_student_of_a_pruned_teacher_saves_and_reloads_with_its_own_shapes(tmp_path, family):
    teacher = families.load_model(make_model_dir(tmp_path / family, family, layers=4))
    shapes = prune_model(teacher, heads_keep=0.5, ffn_keep=0.75)
    teacher.config.edgekit_shapes = shapes
    student = families.student_from_teacher(teacher, [0, 3])  # its config listed the teacher's 4 layers
    assert student.config.edgekit_shapes["heads"] == [2, 2] and student.config.edgekit_shapes["ffn"] == [48, 48]
    student.save_pretrained(tmp_path / "student")
    with torch.no_grad():
        assert torch.allclose(families.load_model(tmp_path / "student")(**inputs()).logits,
                              student(**inputs()).logits, atol=1e-6)
    smaller, _ = families.student_from_config(teacher, {"hidden_size": 16, "num_attention_heads": 2}, [0, 1])
    assert not getattr(smaller.config, "edgekit_shapes", None)  # built whole at its own sizes
    smaller.save_pretrained(tmp_path / "smaller")
    assert families.load_model(tmp_path / "smaller").config.num_hidden_layers == 2


def test_a_narrower_modernbert_student_takes_the_leading_rows_of_each_block_of_its_fused_projections(tmp_path):
    """ModernBERT's Wqkv stacks queries, keys and values, its Wi an input and a gate half: weight selection takes
    the leading rows of each block (the leading rows of the whole matrix were all queries); each layer keeps its
    attention kind, and the student reloads as built."""
    teacher = families.load_model(make_model_dir(tmp_path / "m", "modernbert"))
    student, _ = families.student_from_config(teacher, {"hidden_size": 16, "num_attention_heads": 2,
                                                        "intermediate_size": 24}, [0, 3])
    t, s = families.layers(teacher)[3], families.layers(student)[1]
    assert torch.equal(s.attn.Wqkv.weight, torch.cat([w[:16, :16] for w in t.attn.Wqkv.weight.chunk(3)]))
    assert torch.equal(s.mlp.Wi.weight, torch.cat([w[:24, :16] for w in t.mlp.Wi.weight.chunk(2)]))
    assert student.config.layer_types == ["full_attention", "sliding_attention"]
    student.save_pretrained(tmp_path / "student")
    with torch.no_grad():
        assert torch.allclose(families.load_model(tmp_path / "student")(**inputs()).logits,
                              student(**inputs()).logits, atol=1e-6)


def test_modernbert_as_mmbert_ships_it_loads_and_an_odd_head_width_student_is_refused(tmp_path):
    """mmBERT's config.json sets position_embedding_type sans_pos, which ModernBERT never reads: it was refused as a
    BERT with relative positions would be. A student_config with heads 9 wide passed the checks and crashed in
    the rotary positions' first forward pass."""
    path = make_model_dir(tmp_path / "m", "modernbert")
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps(dict(config, position_embedding_type="sans_pos")))
    teacher = families.load_model(path)
    with pytest.raises(EdgekitError, match=r"gives heads 9 wide; ModernBERT's rotary positions rotate pairs"):
        families.student_config(teacher.config, {"hidden_size": 36, "num_attention_heads": 4}, [0, 1])
    student, _ = families.student_from_config(teacher, {"hidden_size": 40, "num_attention_heads": 4}, [0, 1])
    with torch.no_grad():
        assert student(**inputs()).logits.shape == (2, 2)


def test_a_distilbert_student_config_sets_its_ffn_width(tmp_path):
    teacher = families.load_model(make_model_dir(tmp_path / "d", "distilbert"))
    student, _ = families.student_from_config(teacher, {"hidden_size": 16, "intermediate_size": 32,
                                                        "num_attention_heads": 2}, [0, 1])
    assert families.ffn_size(student.config) == 32 and student.config.hidden_dim == 32  # DistilBERT's name for it
    assert student.distilbert.transformer.layer[0].ffn.lin1.weight.shape == (32, 16)  # was (64, 16): ignored


def test_student_layer_out_of_range(tmp_path):
    teacher = families.load_model(make_model_dir(tmp_path / "m", "bert", layers=4))
    with pytest.raises(EdgekitError, match=r"teacher layer indices 0..3"):
        families.student_from_teacher(teacher, [1, 7])


@pytest.mark.parametrize("family", FAMILIES)
def test_pruned_model_shrinks_saves_and_reloads(tmp_path, family):
    model = families.load_model(make_model_dir(tmp_path / family, family))
    before = sum(p.numel() for p in model.parameters())
    shapes = prune_model(model, heads_keep=0.5, ffn_keep=0.5)
    assert shapes["heads"] == [2] * len(shapes["heads"]) and shapes["ffn"] == [32] * len(shapes["ffn"])
    assert sum(p.numel() for p in model.parameters()) < before
    with torch.no_grad():
        expected = model(**inputs()).logits
    model.config.edgekit_shapes = shapes
    model.save_pretrained(tmp_path / "pruned")
    reloaded = families.load_model(tmp_path / "pruned")
    with torch.no_grad():
        assert torch.allclose(reloaded(**inputs()).logits, expected, atol=1e-6)
    from edgekit.stages.export import to_onnx, to_torchscript  # and it exports like any other model

    sample = (inputs()["input_ids"], inputs()["attention_mask"])
    to_onnx(reloaded, sample, tmp_path / "pruned.onnx")
    to_torchscript(reloaded, sample, tmp_path / "pruned.pt")
    import onnxruntime as ort

    feed = {k: v.numpy() for k, v in inputs().items()}
    assert abs(ort.InferenceSession(str(tmp_path / "pruned.onnx")).run(None, feed)[0] - expected.numpy()).max() < 1e-4
    assert torch.allclose(torch.jit.load(str(tmp_path / "pruned.pt"))(*sample), expected, atol=1e-4)
    if importlib.util.find_spec("litert_torch"):
        from ai_edge_litert.interpreter import Interpreter

        from edgekit.stages.export import to_tflite

        to_tflite(reloaded, tmp_path / "pruned.tflite", [6])
        run = Interpreter(str(tmp_path / "pruned.tflite")).get_signature_runner("seq6")
        for row in (0, 1):  # batch 1, static; the second row is padded: the mask reaches the converted graph
            out = run(args_0=sample[0][row:row + 1].int().numpy(), args_1=sample[1][row:row + 1].int().numpy())
            assert abs(next(iter(out.values())) - expected[row:row + 1].numpy()).max() < 1e-4


@pytest.mark.parametrize("family", FAMILIES)
def test_pruning_heads_equals_masking_them(tmp_path, family):
    """Removing a head's rows and columns computes what zeroing that head's output would compute."""
    spread(families.load_model(make_model_dir(tmp_path / "m", family, layers=2))).save_pretrained(tmp_path / "m")
    model, masked = families.load_model(tmp_path / "m"), families.load_model(tmp_path / "m")
    prune_model(model, heads_keep=0.5, ffn_keep=1.0)
    o_name = families.FAMILIES[family]["o"]
    head_dim = 32 // 4
    for block_p, block_m in zip(families.layers(model), families.layers(masked)):
        o_p, o_m = block_p.get_submodule(o_name).weight, block_m.get_submodule(o_name).weight
        survivors = [h for h in range(4) if any(torch.equal(o_m[:, h * head_dim:(h + 1) * head_dim],
                                                             o_p[:, j:j + head_dim]) for j in range(0, o_p.shape[1], head_dim))]
        assert len(survivors) == 2
        with torch.no_grad():
            for h in set(range(4)) - set(survivors):
                o_m[:, h * head_dim:(h + 1) * head_dim] = 0
    with torch.no_grad():
        out = model(**inputs()).logits
        assert torch.allclose(out, masked(**inputs()).logits, atol=1e-4) and out.std() > 0.1  # logits that vary
    model.save_pretrained(tmp_path / "pruned")  # its edgekit_shapes rebuild the same model
    with torch.no_grad():
        assert torch.allclose(families.load_model(tmp_path / "pruned")(**inputs()).logits, out, atol=1e-5)


def spread(model, seed: int = 0):
    """`model` with its weights drawn wider than transformers' init (std 0.02 left every input's logits within
    1e-5 of each other on these tiny models: a wrong attention passed for a right one)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" not in name.lower():  # LayerNorm, layer_norm, ModernBERT's attn_norm ... keep their init
                p.copy_(torch.randn(p.shape, generator=generator) * (0.3 if p.dim() > 1 else 0.1))
    return model


def test_damaged_pruned_checkpoint_is_refused(tmp_path):
    model = families.load_model(make_model_dir(tmp_path / "m", "bert"))
    model.config.edgekit_shapes = prune_model(model, 0.5, 0.5)
    model.save_pretrained(tmp_path / "pruned")
    import json

    cfg = json.loads((tmp_path / "pruned" / "config.json").read_text())
    cfg["edgekit_shapes"]["ffn"][0] = 48
    (tmp_path / "pruned" / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(EdgekitError, match="do not match the pruned shapes"):
        families.load_model(tmp_path / "pruned")


def test_unsupported_family_names_the_supported(tmp_path):
    from transformers import GPT2Config

    (tmp_path / "gpt").mkdir()
    GPT2Config(n_layer=1, n_embd=8, n_head=2).save_pretrained(tmp_path / "gpt")
    with pytest.raises(EdgekitError, match="supported: bert, roberta"):
        families.load_model(tmp_path / "gpt")


@pytest.mark.parametrize("family", FAMILIES)
def test_new_label_order_moves_the_head_rows_and_new_classes_get_a_new_head(tmp_path, family):
    path = make_model_dir(tmp_path / family, family)
    model = families.load_model(path)
    model.config.id2label, model.config.label2id = {0: "rotten", 1: "fresh"}, {"rotten": 0, "fresh": 1}
    model.save_pretrained(path)
    with torch.no_grad():
        before = model(**inputs()).logits
        swapped = families.load_model(path, ["fresh", "rotten"])
        assert families.label_names(swapped.config) == ["fresh", "rotten"]
        assert torch.allclose(swapped(**inputs()).logits, before.flip(-1), atol=1e-6)  # "fresh" still means fresh
        other = families.load_model(path, ["neg", "pos"])(**inputs()).logits
        assert not torch.allclose(other, before, atol=1e-3)  # a head for other classes is not reused
        assert families.load_model(path, ["a", "b", "c"])(**inputs()).logits.shape == (2, 3)


def test_a_pruned_model_is_not_relabelled(tmp_path):
    path = make_model_dir(tmp_path / "m")
    model = families.load_model(path)
    prune_model(model, heads_keep=0.5, ffn_keep=0.5)
    model.save_pretrained(path)
    assert families.load_model(path, ["LABEL_0", "LABEL_1"]) is not None
    with pytest.raises(EdgekitError, match=r"is a pruned model for \[LABEL_0, LABEL_1\], not \[neg, pos\]"):
        families.load_model(path, ["neg", "pos"])


TEXTS = ["good movie", "  the plot was awful  ", "SUPERB Film", "bad\tacting\nstory", "ééé 日本 🙂 good", "",
         " ".join(["great"] * 60), "dull dull cast"]


@pytest.mark.parametrize("family", ["xlm-roberta", "camembert"])
def test_a_sentencepiece_model_runs_every_stage_and_its_files_read_text_as_transformers_does(tmp_path, family):
    """XLM-R and CamemBERT: RoBERTa's code with a SentencePiece (Unigram) vocabulary and <pad> = 1. Vocabulary and
    width pruning, then ONNX and TFLite files whose tokenizer.json (read with the tokenizers library alone, as a
    device reads it) gives the ids transformers gives, and whose logits are the pruned model's."""
    from edgekit import pipeline, recipe, runtime
    from edgekit.testing import make_csv, tiny_recipe

    text = tiny_recipe(make_model_dir(tmp_path / family, family), make_csv(tmp_path / "d.csv"),
                       stages=("finetune", "prune", "export", "evaluate"))
    text = text.replace("prune: {", "prune: {vocab: true, hidden_keep: 0.75, ") + "export: {format: [onnx, tflite]}\n"
    (tmp_path / "r.yaml").write_text(text.replace("export: {check_sentences: 16}\n", ""))
    manifest = pipeline.run(recipe.load(str(tmp_path / "r.yaml")), tmp_path / "run", progress=False)
    pruned = tmp_path / "run" / "02-prune" / "model"
    shapes = families.load_model(pruned).config.edgekit_shapes
    assert shapes["hidden"] == 24 and shapes["vocab"] < len(families.load_tokenizer(make_model_dir(tmp_path / "t", family)))
    tokenizer, reference = families.load_tokenizer(pruned), runtime.load(pruned)(TEXTS)
    assert tokenizer.pad_token_id == 1 and type(tokenizer).__name__ != "BertTokenizer"
    read_as_transformers(tmp_path / "run" / "03-export", tokenizer, reference)
    assert manifest["final"]["metrics"]["accuracy"] > 0.9


def read_as_transformers(export, tokenizer, reference: dict) -> list:
    """The ONNX and TFLite files of an export stage: their tokenizer.json, read with the tokenizers library alone
    (as a device reads it), gives transformers' ids on TEXTS, and their probabilities are `reference`'s."""
    import numpy as np
    from tokenizers import Tokenizer

    from edgekit import runtime

    files = [export / "onnx" / "model.onnx", export / "tflite" / "model.tflite"]
    for file in files:
        ids = Tokenizer.from_file(str(file.parent / "tokenizer.json"))
        assert b"\n" not in (file.parent / "tokenizer.json").read_bytes()  # compact: 0.47 MB, not 0.71 pretty
        for t in TEXTS:
            assert ids.encode(t).ids == tokenizer(t, truncation=True, max_length=32)["input_ids"]
        assert np.abs(runtime.load(file)(TEXTS)["probs"] - reference["probs"]).max() < 1e-4
    return files


def test_modernbert_runs_every_stage_and_its_files_compute_what_transformers_does(tmp_path):
    """ModernBERT (a fused Q|K|V, a gated FFN, rotary positions, every other layer attending within 8 tokens, mean
    pooling, a byte-level BPE vocabulary): a student of teacher layers 1 and 2 (its first layer drops its own norm,
    as the model reloads), head / FFN / vocabulary pruning, then ONNX, TFLite and TorchScript files that read text
    as transformers does and give the pruned model's probabilities on texts longer than the window, and INT8."""
    import numpy as np

    from edgekit import pipeline, recipe, runtime
    from edgekit.testing import make_csv, tiny_recipe

    text = tiny_recipe(make_model_dir(tmp_path / "t", "modernbert"), make_csv(tmp_path / "d.csv"),
                       stages=("finetune", "distill", "prune", "export", "quantize", "evaluate"))
    text = text.replace("distill: {", "distill: {layers: [1, 2], ").replace("prune: {", "prune: {vocab: true, ")
    (tmp_path / "r.yaml").write_text(text.replace("export: {check_sentences: 16}\n", "")
                                     + "export: {format: [onnx, tflite, torchscript]}\n")
    manifest = pipeline.run(recipe.load(str(tmp_path / "r.yaml")), tmp_path / "run", progress=False)
    student = families.load_model(tmp_path / "run" / "02-distill" / "model")
    assert student.config.layer_types == ["sliding_attention", "full_attention"]
    assert isinstance(families.layers(student)[0].attn_norm, torch.nn.Identity)
    pruned = tmp_path / "run" / "03-prune" / "model"
    model, tokenizer = families.load_model(pruned), families.load_tokenizer(pruned)
    shapes = model.config.edgekit_shapes
    assert shapes["heads"] == [2, 2] and shapes["ffn"] == [32, 32] and shapes["vocab"] < len(tokenizer)
    first = families.layers(model)[0]
    assert first.attn.Wqkv.out_features == 3 * 2 * 8 and first.mlp.Wi.out_features == 2 * 32
    assert "Bert" not in type(tokenizer).__name__ and "token_type_ids" not in tokenizer("a b")
    reference = runtime.load(pruned)(TEXTS)
    read_as_transformers(tmp_path / "run" / "04-export", tokenizer, reference)
    enc = tokenizer(TEXTS, truncation=True, max_length=32, padding=True, return_tensors="pt")
    assert enc["attention_mask"].sum(1).max() > 16  # past the window (8 tokens) and the traced sample
    traced = torch.jit.load(str(tmp_path / "run" / "04-export" / "torchscript" / "model.pt"))
    with torch.no_grad():
        want = model(**enc).logits
        assert torch.allclose(traced(enc["input_ids"], enc["attention_mask"]), want, atol=1e-4)
        assert want.std() > 0.1
    for fmt in ("x86-onnx/model.onnx", "x86-tflite/model.tflite"):
        int8 = runtime.load(tmp_path / "run" / "05-quantize" / fmt)
        assert np.abs(int8(TEXTS)["probs"] - reference["probs"]).max() < 0.1
    assert manifest["final"]["metrics"]["accuracy"] > 0.9


def test_a_cls_pooled_modernbert_exports_with_its_sliding_window_on_long_inputs(tmp_path):
    """With first-token pooling and a window wider than the rewrite check's 8 tokens (as ModernBERT's 128 is), an
    additive mask in place of the 0/1 mask passed the check and dropped the window: longer inputs attended to every
    token. ModernBERT is not given it."""
    from edgekit.stages.export import rewrite

    path = make_model_dir(tmp_path / "m", "modernbert")
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps(dict(config, classifier_pooling="cls", local_attention=16)))
    model = spread(families.load_model(path))
    wrapper, applied = rewrite(model)
    assert "additive_mask" not in applied
    ids = torch.randint(5, 250, (2, 30), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[1, 20:] = 0
    with torch.no_grad():
        want = model(input_ids=ids, attention_mask=mask).logits
        assert torch.allclose(wrapper(ids, mask), want, atol=1e-4) and want.std() > 0.1


def test_deberta_without_shared_position_keys_prunes_its_position_projections(tmp_path):
    """DeBERTa-v2 (share_att_key false) projects relative positions with pos_key_proj / pos_query_proj: pruning
    keeps their rows of the kept heads, and the pruned model is the masked one, saved and reloaded."""
    path = make_model_dir(tmp_path / "m", "deberta-v2", layers=2)
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps(dict(config, share_att_key=False)))
    spread(families.load_model(path)).save_pretrained(tmp_path / "unshared")  # its position projections, saved
    model, masked = families.load_model(tmp_path / "unshared"), families.load_model(tmp_path / "unshared")
    shapes = prune_model(model, heads_keep=0.5, ffn_keep=1.0)
    attention = families.layers(model)[0].attention.self
    assert attention.pos_key_proj.out_features == attention.pos_query_proj.out_features == 16
    for block_p, block_m in zip(families.layers(model), families.layers(masked)):
        kept = [h for h in range(4) if torch.equal(block_m.attention.self.pos_key_proj.weight[h * 8:(h + 1) * 8],
                                                   block_p.attention.self.pos_key_proj.weight[:8]) or
                torch.equal(block_m.attention.self.pos_key_proj.weight[h * 8:(h + 1) * 8],
                            block_p.attention.self.pos_key_proj.weight[8:])]
        assert len(kept) == 2
        with torch.no_grad():
            for h in set(range(4)) - set(kept):
                block_m.attention.output.dense.weight[:, h * 8:(h + 1) * 8] = 0
    with torch.no_grad():
        expected = model(**inputs()).logits
        assert torch.allclose(expected, masked(**inputs()).logits, atol=1e-4) and expected.std() > 0.1
    model.config.edgekit_shapes = shapes
    model.save_pretrained(tmp_path / "pruned")
    with torch.no_grad():
        assert torch.allclose(families.load_model(tmp_path / "pruned")(**inputs()).logits, expected, atol=1e-6)


def test_deberta_runs_every_stage_and_its_files_read_text_as_transformers_does(tmp_path):
    """DeBERTa-v3's layout (relative positions only, a SentencePiece vocabulary, [PAD] = 0): a narrower student
    (its pooler follows the width), head / FFN / vocabulary pruning, ONNX and TFLite whose tokenizer.json gives
    transformers' ids and whose logits are the pruned model's."""
    import numpy as np

    from edgekit import pipeline, recipe, runtime
    from edgekit.testing import make_csv, tiny_recipe

    text = tiny_recipe(make_model_dir(tmp_path / "t", "deberta-v2"), make_csv(tmp_path / "d.csv"),
                       stages=("finetune", "distill", "prune", "export", "quantize", "evaluate"))
    text = text.replace("distill: {", "distill: {layers: [1, 3], student_config: {hidden_size: 16}, ")
    text = text.replace("prune: {", "prune: {vocab: true, ") + "export: {format: [onnx, tflite]}\n"
    (tmp_path / "r.yaml").write_text(text.replace("export: {check_sentences: 16}\n", ""))
    manifest = pipeline.run(recipe.load(str(tmp_path / "r.yaml")), tmp_path / "run", progress=False)
    pruned = tmp_path / "run" / "03-prune" / "model"
    model = families.load_model(pruned)
    assert model.config.hidden_size == model.config.pooler_hidden_size == 16
    assert model.config.edgekit_shapes["heads"] == [2, 2] and "vocab" in model.config.edgekit_shapes
    tokenizer, reference = families.load_tokenizer(pruned), runtime.load(pruned)(TEXTS)
    assert tokenizer.pad_token_id == 0 and tokenizer.sep_token_id == 2
    for file in read_as_transformers(tmp_path / "run" / "04-export", tokenizer, reference):
        assert "deberta_attention" in json.loads((file.parent / "model.json").read_text())["graph_rewrites"]
    for fmt in ("x86-onnx/model.onnx", "x86-tflite/model.tflite"):  # per-channel dynamic INT8 runs
        int8 = runtime.load(tmp_path / "run" / "05-quantize" / fmt)
        assert np.abs(int8(TEXTS)["probs"] - reference["probs"]).max() < 0.1
    assert manifest["final"]["metrics"]["accuracy"] > 0.9


@pytest.mark.parametrize("share, types", [(True, ["p2c", "c2p"]), (False, ["p2c", "c2p"]), (True, ["c2p"]),
                                          (False, ["p2c"])])
def test_deberta_export_rewrite_computes_what_transformers_does(tmp_path, share, types):
    """deberta_attention (fused Q|K|V, position keys and queries projected once, the last layer on the first
    token) on inputs past the position buckets' linear range (16 buckets: 8 exact distances), with padding."""
    import copy

    from edgekit.stages.export import deberta_attention

    path = make_model_dir(tmp_path / "m", "deberta-v2", layers=3)
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps(dict(config, share_att_key=share, pos_att_type=types)))
    model = spread(families.load_model(path))
    ids = torch.randint(4, 40, (2, 60), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[1, 35:] = 0
    with torch.no_grad():
        want = model(input_ids=ids, attention_mask=mask).logits
        got = deberta_attention(copy.deepcopy(model))(input_ids=ids, attention_mask=mask).logits
    assert torch.allclose(got, want, atol=1e-4) and want.std() > 0.1


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_a_half_precision_checkpoint_is_loaded_and_trained_in_float32(tmp_path, dtype):
    """Hub checkpoints often ship in float16 or bfloat16; transformers 5 loads them in that dtype, and finetune
    failed with a traceback (mat1 and mat2 must have the same dtype)."""
    from transformers import AutoModelForSequenceClassification

    from edgekit import pipeline, recipe
    from edgekit.testing import make_csv, tiny_recipe

    folder = make_model_dir(tmp_path / "m")
    AutoModelForSequenceClassification.from_pretrained(folder).to(dtype).save_pretrained(folder)
    model = families.load_model(folder)
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    (tmp_path / "r.yaml").write_text(tiny_recipe(folder, make_csv(tmp_path / "d.csv"),
                                                 stages=("finetune", "distill", "export", "evaluate")))
    manifest = pipeline.run(recipe.load(str(tmp_path / "r.yaml")), tmp_path / "run", progress=False)
    assert manifest["final"]["metrics"]["accuracy"] > 0.9


@pytest.mark.parametrize("family, change, message", [
    ("albert", {"num_hidden_groups": 2}, "sets num_hidden_groups 2; edgekit prunes and distils ALBERT's one shared"),
    ("bert", {"position_embedding_type": "relative_key"}, "sets position_embedding_type relative_key, which "
                                                          "transformers 5 no longer runs"),
    ("mpnet", {"relative_attention_num_buckets": 16}, "sets relative_attention_num_buckets 16; transformers 5"),
    ("roberta", {"is_decoder": True}, "sets is_decoder: true, so every token sees only those before it"),
])
def test_a_config_that_transformers_or_edgekit_would_not_run_as_written_is_refused_in_one_line(tmp_path, family,
                                                                                               change, message):
    """Each ran: ALBERT's second layer group kept every head after pruning, relative positions were dropped for
    absolute ones, MPNet with 16 buckets failed with an IndexError, a decoder classifier's first token saw only
    itself."""
    import json

    from edgekit import pipeline

    folder = make_model_dir(tmp_path / family, family)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, **change}))
    with pytest.raises(EdgekitError, match=re.escape(message)):
        pipeline.resolve_model(str(folder))
    with pytest.raises(EdgekitError, match=re.escape(message)):
        families.load_model(folder)


def test_mpnet_with_more_relative_buckets_is_refused_too(tmp_path):
    folder = make_model_dir(tmp_path / "m", "mpnet")
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "relative_attention_num_buckets": 64}))
    with pytest.raises(EdgekitError, match="relative_attention_num_buckets 64"):  # only 16 was tested
        families.load_model(folder)


def test_a_one_row_token_type_table_has_no_segments():
    from transformers import BertConfig, BertForSequenceClassification

    model = BertForSequenceClassification(BertConfig(vocab_size=50, hidden_size=8, num_hidden_layers=1,
                                                     num_attention_heads=2, intermediate_size=16, type_vocab_size=1))
    assert not families.uses_segments(model)


def test_a_student_of_a_teacher_pruned_per_layer_takes_its_layers_shapes(tmp_path):
    teacher = families.load_model(make_model_dir(tmp_path / "t"))
    prune_model(teacher, [1.0, 0.5, 1.0, 0.25], 1.0)  # the tests before pruned every layer alike
    assert families.student_from_teacher(teacher, [1, 3]).config.edgekit_shapes["heads"] == [2, 1]
