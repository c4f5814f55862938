"""Data augmentation for distillation (TinyBERT): N copies of each training sentence with some words replaced.

A replacement comes from a masked-LM's top-k candidates for the masked word when the model folder has an MLM
head, otherwise from the k nearest neighbours (cosine) of the word's token in the model's own input embedding
matrix. Only words that are one whole-word token are replaced (TinyBERT takes GloVe neighbours for the others;
we leave them as they are). A copy keeps its sentence's label for the hard-label loss; the teacher's soft labels
are what makes it useful. Copies equal to their sentence are dropped. The set is cached under the asset cache,
keyed by the model's weights, the sentences and the settings, so a second run (or a resume) does not redo it.
An entry that is not what augment writes (cut short, edited) is made again; a cache that cannot be written is
only skipped.
"""
import contextlib
import hashlib
import json
import os
import random
import sys
from pathlib import Path

import torch

from edgekit import assets, families


def augment(model_dir: Path, tokenizer, examples: list, copies: int, p: float, k: int, seed: int,
            progress: bool = True) -> tuple:
    """(augmented [(text, label)] without the originals, how replacements were found: mlm or embedding). A text
    pair (text, text_pair) has words replaced in both texts, a masked word's candidates read with both."""
    weights = [assets.sha256_file(w) for w in sorted(Path(model_dir).glob("*.safetensors"))]  # never a pickle
    weights = weights[0] if len(weights) == 1 else weights  # one file: the key caches made before this had
    marker = _marker(tokenizer)  # a key of its own for BPE and SentencePiece: their entries were made wrong before
    key = hashlib.sha256(json.dumps([weights, examples, copies, p, k, seed] + ([marker] if marker else [])).encode()
                         ).hexdigest()
    cache = assets.cache_dir() / "augment" / f"{key[:32]}.json"
    if saved := cached(cache, {label for _, label in examples}):
        return saved
    mlm = masked_lm(model_dir)
    rng = random.Random(seed)
    words = [[(i, w, span) for i, part in enumerate(_parts(text)) for w, span in _words(tokenizer, part, marker)]
             for text, _ in examples]
    neighbours = {} if mlm else embedding_neighbours(model_dir, tokenizer, {w for ws in words for _, w, _ in ws}, k,
                                                     marker)
    from edgekit.progress import bar as progress_bar

    out = []
    for (text, label), ws in progress_bar(list(zip(examples, words)), desc="augment", unit="sent",
                                           disable=not progress):
        seen = {text}
        for _ in range(copies):
            chosen = [(i, w, span) for i, w, span in ws if rng.random() < p and (mlm or neighbours.get(w))]
            if mlm and chosen:
                options = mlm_candidates(mlm, tokenizer, text, [(i, span) for i, _, span in chosen], k, marker)
            else:
                options = [neighbours[w] for _, w, _ in chosen]
            parts = list(_parts(text))
            for (i, _, (a, b)), opts in sorted(zip(chosen, options), key=lambda x: -x[0][2][0]):  # right to left
                if opts:
                    parts[i] = parts[i][:a] + rng.choice(opts) + parts[i][b:]
            new = tuple(parts) if isinstance(text, tuple) else parts[0]
            if new not in seen:
                seen.add(new)
                out.append((new, label))
    save(cache, out, "mlm" if mlm else "embedding")
    return out, "mlm" if mlm else "embedding"


def cached(cache: Path, labels: set):
    """(examples, source) as `save` wrote them to `cache`, or None where there is no such entry or it is not one
    (cut short, edited: texts and labels of these sentences only), which is then made again and overwritten."""
    try:
        saved = json.loads(cache.read_text(encoding="utf-8"))
        examples = saved["examples"]
        if saved["source"] in ("mlm", "embedding") and isinstance(examples, list) and all(
                isinstance(x, list) and len(x) == 2 and _is_text(x[0]) and _label(x[1]) in labels for x in examples):
            return [(tuple(t) if isinstance(t, list) else t, _label(y)) for t, y in examples], saved["source"]
    except (OSError, ValueError, KeyError, TypeError):  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        pass
    return None


def _label(y):
    """A label as read back from JSON: a multi-label tuple was written as a list."""
    return tuple(y) if isinstance(y, list) else y


def save(cache: Path, examples: list, source: str) -> None:
    """Write the entry through a temp file and a rename; a cache folder that cannot be written is skipped (one line
    on stderr): the cache only saves the next run this work."""
    tmp = cache.with_name(cache.name + f".{os.getpid()}.tmp")
    try:
        cache.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps({"source": source, "examples": examples}), encoding="utf-8")
        os.replace(tmp, cache)
    except OSError as e:
        print(f"edgekit: warning: cannot write the augmentation cache {cache.parent} ({e.strerror}), going on without "
              f"it; the folder is under EDGEKIT_CACHE ({assets.cache_dir()}): make it writable or set EDGEKIT_CACHE "
              f"to another folder", file=sys.stderr)
    finally:
        with contextlib.suppress(OSError):  # a read-only folder refuses even the unlink of a missing file
            tmp.unlink(missing_ok=True)


def _parts(text) -> tuple:
    """The texts of an example: (text,), or a pair's two."""
    return text if isinstance(text, tuple) else (text,)


def _is_text(x) -> bool:
    """A text as the cache holds it: a string, or a pair as a list of two."""
    return isinstance(x, str) or isinstance(x, list) and len(x) == 2 and all(isinstance(t, str) for t in x)


def _marker(tokenizer) -> str:
    """What starts a word's token: '' for WordPiece (its inner pieces start with ##), 'Ġ' for byte-level BPE
    (RoBERTa), '▁' for SentencePiece (ALBERT, XLM-R), read off the vocabulary."""
    tokens = list(tokenizer.get_vocab())
    return next((m for m in ("\u0120", "\u2581") if sum(t.startswith(m) for t in tokens) > len(tokens) / 10), "")


def _words(tokenizer, text: str, marker: str) -> list:
    """[(token, (start, end))] for the words of `text` that are one whole-word token; (start, end) is the word in
    `text` without the space a BPE or SentencePiece pre-tokenizer counts in it."""
    words = []
    for _, (a, b) in tokenizer.backend_tokenizer.pre_tokenizer.pre_tokenize_str(text):
        word = text[a:b].strip()
        a += len(text[a:b]) - len(text[a:b].lstrip())
        pieces = tokenizer.tokenize(" " + word if marker == "\u0120" else word)  # byte-level: as after a space
        if word and len(pieces) == 1 and pieces[0].startswith(marker) and pieces[0][len(marker):].isalpha():
            words.append((pieces[0], (a, a + len(word))))
    return words


def _whole_words(tokenizer, marker: str) -> list:
    """[(id, token)] of the tokens that are a whole word after a space, special tokens left out."""
    return sorted((i, t) for t, i in tokenizer.get_vocab().items() if t.startswith(marker) and
                  t[len(marker):].isalpha() and i not in tokenizer.all_special_ids)


def embedding_neighbours(model_dir: Path, tokenizer, words: set, k: int, marker: str = None) -> dict:
    """word token -> its k nearest whole-word tokens in the model's input embedding matrix (cosine). A pruned
    vocabulary: each id's row through the remap, neighbours among the kept tokens (a kept token has a row of its
    own; the dropped ones share the unknown token's), nothing for a dropped word (the model reads it as [UNK])."""
    embedding = families.load_model(model_dir).get_input_embeddings()
    with torch.no_grad():
        table = torch.nn.functional.normalize(embedding(torch.arange(embedding.num_embeddings)).float(), dim=-1)
    remap = embedding.remap if isinstance(embedding, families.RemappedEmbedding) else torch.arange(len(table))
    kept = torch.bincount(remap)[remap] == 1
    vocab = tokenizer.get_vocab()
    marker = _marker(tokenizer) if marker is None else marker
    pool = [(i, t) for i, t in _whole_words(tokenizer, marker) if kept[i]]
    pool_ids = torch.tensor([i for i, _ in pool], dtype=torch.long)
    asked = sorted(w for w in words if w in vocab and kept[vocab[w]])
    found = {}
    for s in range(0, len(asked), 512):
        chunk = asked[s:s + 512]
        sims = table[torch.tensor([vocab[w] for w in chunk])] @ table[pool_ids].T
        top = sims.topk(min(k + 1, len(pool)), dim=-1).indices
        for w, row in zip(chunk, top.tolist()):
            found[w] = [pool[j][1][len(marker):] for j in row if pool[j][1] != w][:k]  # as the text writes it
    return found


@families.quiet_transformers()  # transformers' "Loading weights" bar, and its notes on unused weights
def masked_lm(model_dir: Path):
    """The folder's masked-LM (with its trained head), or None when the folder has no MLM head, or weights a
    masked-LM of its config cannot load as they are (a model edgekit pruned: a classifier of smaller shapes)."""
    from transformers import AutoConfig, AutoModelForMaskedLM

    try:
        config = AutoConfig.from_pretrained(model_dir)
        if getattr(config, "edgekit_shapes", None):
            return None
        model, info = AutoModelForMaskedLM.from_pretrained(model_dir, config=config, output_loading_info=True,
                                                          use_safetensors=True, dtype=torch.float32)
    except (OSError, ValueError, KeyError, RuntimeError):
        return None
    head = [k for k in info["missing_keys"] if "embeddings" not in k and "encoder" not in k]
    return None if head else model.eval()


def mlm_candidates(model, tokenizer, text, spans: list, k: int, marker: str = "") -> list:
    """For each (part, word span) of `text` (a string, or a pair and which of its texts), the MLM's top-k whole-word
    tokens at that word masked (one masked copy per word; a pair's other text is read with it)."""
    rows, inserted, mask = [], [], tokenizer.mask_token
    for i, (a, b) in spans:
        parts = list(_parts(text))
        inserted.append(sum(p.count(mask) for p in parts[:i]) + parts[i][:a].count(mask))  # the text's own masks first
        parts[i] = parts[i][:a] + mask + parts[i][b:]
        rows.append(parts)
    enc = tokenizer(*[list(texts) for texts in zip(*rows)], return_tensors="pt", padding=True, truncation=True,
                    max_length=min(128, families.max_tokens(model.config)))  # RoBERTa's table may hold fewer
    allowed = torch.zeros(len(tokenizer), dtype=torch.bool)
    allowed[[i for i, _ in _whole_words(tokenizer, marker)]] = True
    with torch.no_grad():
        logits = model(**enc).logits
    out = []
    for row, ids in enumerate(enc["input_ids"]):
        where = (ids == tokenizer.mask_token_id).nonzero()
        if len(where) <= inserted[row]:  # cut off by truncation
            out.append([])
            continue
        scores = logits[row, where[inserted[row], 0], :len(allowed)]
        scores = scores.masked_fill(~allowed[:logits.shape[-1]], float("-inf"))
        part, (a, b) = spans[row]
        original = _parts(text)[part][a:b].lower()
        words = [t[len(marker):] for t in tokenizer.convert_ids_to_tokens(scores.topk(k + 1).indices.tolist())]
        out.append([w for w in words if w.lower() != original][:k])
    return out
