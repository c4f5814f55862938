"""Tiny models built from configs and a tiny labelled dataset, for tests and robustness scripts:
no downloads, seconds per run."""
import csv
import json
import random

import torch

from edgekit import families

WORDS = "good great fine superb bad awful poor dull movie film the a is was plot acting story cast".split()
POSITIVE, NEGATIVE = ["good", "great", "fine", "superb"], ["bad", "awful", "poor", "dull"]
NEUTRAL = ["movie", "film", "the", "a", "is", "was", "plot", "acting", "story", "cast"]


def tiny_vocab() -> dict:
    tokens = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + WORDS + list("abcdefghijklmnopqrstuvwxyz")
    tokens += ["##" + c for c in "abcdefghijklmnopqrstuvwxyz"]
    return {t: i for i, t in enumerate(dict.fromkeys(tokens))}  # "a" is a word and a letter: one id


def tiny_config(family: str, layers: int = 4):
    from transformers import AutoConfig

    common = dict(vocab_size=len(tiny_vocab()), hidden_size=32, num_hidden_layers=layers, num_attention_heads=4,
                  intermediate_size=64, max_position_embeddings=128, num_labels=2)
    if family == "distilbert":
        return AutoConfig.for_model("distilbert", vocab_size=common["vocab_size"], dim=32, n_layers=layers, n_heads=4,
                                    hidden_dim=64, max_position_embeddings=128, num_labels=2)
    if family == "albert":
        common["embedding_size"] = 16
    if family in ("roberta", "data2vec-text", "mpnet"):
        common.update(pad_token_id=0, bos_token_id=2, eos_token_id=3)
    if family in ("xlm-roberta", "camembert"):  # fairseq's order, as in the real vocabularies: <s> <pad> </s> <unk>
        common.update(pad_token_id=1, bos_token_id=0, eos_token_id=2)
    if family == "deberta-v2":  # as DeBERTa-v3: relative positions only, shared position keys, no token types
        common.update(pad_token_id=0, relative_attention=True, position_buckets=16, pos_att_type=["p2c", "c2p"],
                      share_att_key=True, max_relative_positions=-1, position_biased_input=False, type_vocab_size=0,
                      norm_rel_ebd="layer_norm")
    if family == "modernbert":  # a byte-level BPE vocabulary, special tokens last; every other layer local (8 tokens)
        ids = tiny_bpe().get_vocab()
        common.update(vocab_size=len(ids), pad_token_id=ids["[PAD]"], cls_token_id=ids["[CLS]"],
                      bos_token_id=ids["[CLS]"], sep_token_id=ids["[SEP]"], eos_token_id=ids["[SEP]"],
                      local_attention=8, global_attn_every_n_layers=2, classifier_pooling="mean")
    return AutoConfig.for_model(family, **common)


def tiny_bpe():
    """A byte-level BPE tokenizer of the WORDS as ModernBERT ships its own: a PreTrainedTokenizerFast from a
    tokenizer.json, [CLS] text [SEP] (pairs [CLS] a [SEP] b [SEP]), special tokens after the pieces, no token types."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tokenizer.train_from_iterator([" " + " ".join(WORDS)] * 4, trainer)  # each word after a space: "Ġgood"
    special = ["[UNK]", "[CLS]", "[SEP]", "[PAD]", "[MASK]"]
    tokenizer.add_special_tokens(special)
    cls, sep = tokenizer.token_to_id("[CLS]"), tokenizer.token_to_id("[SEP]")
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B [SEP]", special_tokens=[("[CLS]", cls), ("[SEP]", sep)])
    names = dict(zip(("unk_token", "cls_token", "sep_token", "pad_token", "mask_token"), special))
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, model_input_names=["input_ids", "attention_mask"],
                                   **names)


SENTENCEPIECE = ("xlm-roberta", "camembert", "deberta-v2")  # families whose fixture gets a SentencePiece tokenizer


def tiny_unigram(family: str):
    """A SentencePiece-style Unigram tokenizer of the WORDS (and letters) as XLM-R, CamemBERT and DeBERTa-v3 ship
    theirs (DeBERTa: [PAD] [CLS] [SEP] [UNK] first)."""
    from transformers import CamembertTokenizer, DebertaV2Tokenizer, XLMRobertaTokenizer

    special = ["[PAD]", "[CLS]", "[SEP]", "[UNK]"] if family == "deberta-v2" else ["<s>", "<pad>", "</s>", "<unk>"]
    pieces = [(t, 0.0) for t in special] + [("\u2581" + w, -1.0) for w in WORDS]
    pieces += [("\u2581", -2.0)] + [(c, -3.0) for c in "abcdefghijklmnopqrstuvwxyz"]
    if family == "deberta-v2":
        return DebertaV2Tokenizer(vocab=pieces + [("[MASK]", 0.0)], unk_id=3)
    return (XLMRobertaTokenizer if family == "xlm-roberta" else CamembertTokenizer)(vocab=pieces + [("<mask>", 0.0)])


def make_model_dir(path, family: str = "bert", layers: int = 4, seed: int = 0):
    from transformers import AutoModelForSequenceClassification, BertTokenizer

    torch.manual_seed(seed)
    model = AutoModelForSequenceClassification.from_config(tiny_config(family, layers)).eval()
    with families.quiet_transformers():  # its "Writing model shards" bar, on every fixture
        model.save_pretrained(path)
    tokenizer = tiny_unigram(family) if family in SENTENCEPIECE else tiny_bpe() if family == "modernbert" else \
        BertTokenizer(vocab=tiny_vocab())
    tokenizer.save_pretrained(path)
    return path


def answers(share: float, n: int = 100) -> list:
    """What a stand-in for evaluate.correct returns: the first `share` of `n` sentences right."""
    right = round(share * n)
    return [True] * right + [False] * (n - right)


def sentence(rng, label: int) -> str:
    cue = rng.choice(POSITIVE if label else NEGATIVE)
    words = [rng.choice(NEUTRAL) for _ in range(rng.randint(2, 8))]
    words.insert(rng.randint(0, len(words)), cue)
    return " ".join(words)


def make_csv(path, n: int = 240, seed: int = 0, labels=("neg", "pos")):
    rng = random.Random(seed)
    return _write(path, ["text", "label"], ([sentence(rng, i % 2), labels[i % 2]] for i in range(n)))


def make_pair_csv(path, n: int = 240, seed: int = 0, labels=("neg", "pos")):
    """Text pairs (columns premise, hypothesis, label) labelled by the hypothesis' cue alone, with a premise of
    either cue: a model that reads the pair as one text, or ignores the second, scores about half."""
    rng = random.Random(seed)
    return _write(path, ["premise", "hypothesis", "label"],
                  ([sentence(rng, rng.randint(0, 1)), sentence(rng, i % 2), labels[i % 2]] for i in range(n)))


def make_multi_label_jsonl(path, n: int = 240, seed: int = 0):
    """Multi-label rows: each text holds a negative cue, a positive one, both or neither, and its labels say which
    ("neg", "pos", both, or the empty list)."""
    rng = random.Random(seed)
    with open(path, "w") as f:
        for i in range(n):
            tags = [["neg"], ["pos"], ["neg", "pos"], []][i % 4]
            words = [rng.choice(NEUTRAL) for _ in range(rng.randint(2, 8))]
            for tag in tags:
                words.insert(rng.randint(0, len(words)), rng.choice(POSITIVE if tag == "pos" else NEGATIVE))
            f.write(json.dumps({"text": " ".join(words), "label": tags}) + "\n")
    return path


def _write(path, header: list, rows):
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(header)
        w.writerows(rows)
    return path


TINY_SETTINGS = {
    "finetune": "{epochs: 4, lr: 3.0e-3, batch_size: 16, checkpoint_every: 5}",
    "distill": "{epochs: 3, lr: 3.0e-3, batch_size: 16, checkpoint_every: 5}",
    "prune": "{heads_keep: 0.5, ffn_keep: 0.5, recover_epochs: 2, lr: 3.0e-3, batch_size: 16, checkpoint_every: 5}",
    "export": "{check_sentences: 16}",
    "quantize": "{check_sentences: 16}",
    "bench": "{seq_len: 32, runs: 5, warmup: 1}",
}


def tiny_recipe(model_dir, csv_file, stages=("finetune", "distill", "export", "quantize", "evaluate", "bench")) -> str:
    """Recipe text running the given stages on the tiny model and data in seconds."""
    settings = "".join(f"{s}: {TINY_SETTINGS[s]}\n" for s in stages if s in TINY_SETTINGS)
    return (f"description: tiny end-to-end recipe for tests\nteacher: {model_dir}\ndata: {{source: {csv_file}}}\n"
            f"max_length: 32\nstages: [{', '.join(stages)}]\n{settings}budgets: {{size_mb: \"<= 100\"}}\n")


def doc_tables(text: str) -> dict:
    """{'## ' heading: {key: [the other cells]}} of every markdown table row whose first cell is a `key`: the
    reference pages (docs/settings.md, docs/manifest.md) as their tests read them."""
    out, heading = {}, None
    for line in text.splitlines():
        if line.startswith("## "):
            heading = line[3:].strip()
        elif line.startswith("| `") and heading:
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            out.setdefault(heading, {})[cells[0].strip("`")] = cells[1:]
    return out
