"""report.md and a self-contained report.html (plots embedded) from one or more finished runs.

Plots: accuracy against latency for every evaluated artifact (bubble area grows with size, the Pareto front marked
among points timed at one length), where the bytes of each model go (embeddings, attention, FFN, other), heads kept
per layer after pruning against the heads each layer had.
"""
import base64
import html
import json
import numbers
import os
import re
from pathlib import Path

from edgekit import gate
from edgekit.artifact import weight_files, write_text
from edgekit.gate import load_manifest

PARTS = ("embeddings", "attention", "ffn", "other")
ATTENTION = ("attention", "query", "key", "value", "q_lin", "k_lin", "v_lin", "out_lin", "attn")
FFN = ("intermediate", "ffn", "mlp", "output/dense", "output.dense")


def part_of(name: str) -> str:
    """Which part of a transformer a weight or node name belongs to."""
    n = name.lower()
    if "embed" in n:
        return "embeddings"
    if any(a in n for a in ATTENTION):
        return "attention"
    if any(f in n for f in FFN) and "attention" not in n:
        return "ffn"
    return "other"


def breakdown(path: Path) -> dict:
    """MB per part for a transformers folder (safetensors) or an ONNX file (tensors, named by the node using
    them); `other` holds the classifier, and for ONNX also the graph itself."""
    sizes = dict.fromkeys(PARTS, 0.0)
    path = Path(path)
    if path.is_dir():
        from safetensors import safe_open

        with safe_open(str(path / "model.safetensors"), "np") as f:
            for key in f.keys():
                t = f.get_slice(key)
                count = 1
                for d in t.get_shape():
                    count *= d
                sizes[part_of(key)] += count * _itemsize(t.get_dtype()) / 1e6
        return {k: round(v, 3) for k, v in sizes.items()}
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    consumer = {}
    for node in model.graph.node:
        for i in node.input:
            consumer.setdefault(i, node.name)
    tensors = [(t, t.name + " " + consumer.get(t.name, "")) for t in model.graph.initializer]
    tensors += [(a.t, node.name + " " + consumer.get(node.output[0], "")) for node in model.graph.node
                if node.op_type == "Constant" for a in node.attribute if a.name == "value"]
    for tensor, name in tensors:
        count = 1
        for d in tensor.dims:
            count *= d
        sizes[part_of(name)] += count * onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type).itemsize / 1e6
    total = sum(p.stat().st_size for p in weight_files(path)) / 1e6  # with its external data, as size_mb counts it
    sizes["other"] += max(0.0, total - sum(sizes.values()))  # the graph itself, scales, names
    return {k: round(v, 3) for k, v in sizes.items()}


def _itemsize(dtype: str) -> int:
    return {"F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I8": 1, "U8": 1, "BOOL": 1}.get(dtype, 4)


def peers_of(run: Path) -> dict:
    """bench/peers.py's results for the run (peers/peers.json: the teacher, its usual INT8 and edgekit's final file,
    timed in one interleaved session), each row's `here` being its file where the run lies now; {} when none."""
    path = run / "peers" / "peers.json"
    if not path.is_file():
        return {}
    result = json.loads(path.read_text())
    for r in result["rows"]:
        r["here"] = (run / os.path.relpath(r["path"], result["run"])).resolve()  # the run may have been moved
    return result


def peers_note(name: str, manifest: dict, run: Path) -> str:
    """One line: which of the run's latencies are from bench/peers.py's session and which from the bench stage;
    '' for a run bench/peers.py did not measure."""
    peers, seq = peers_of(run), manifest["final"]["metrics"].get("bench_seq_len")
    if not peers:
        return ""
    timed = [os.path.relpath(r["here"], run.resolve()) for r in peers["rows"] if r["model"].startswith("edgekit")]
    return (f"{name}: latencies of the teacher, its peer and {', '.join(timed) or 'no edgekit file'} are from one "
            f"bench/peers.py session ({peers['seq_len']} tokens); any other artifact's from the bench stage"
            f"{f' ({seq} tokens)' if seq else ''}")


def points(runs: list, names: list = None) -> list:
    """Every evaluated artifact with accuracy and latency: (label, accuracy, latency_ms_p50, size_mb, split, the
    tokens its latency was timed at)."""
    out = []
    for (manifest, run), name in zip(runs, names or [run.name for _, run in runs]):
        final, peers = manifest["final"], peers_of(run)
        # The teacher and peer latencies come from peers.json's session; the bench stage ran in another one (other
        # load, maybe another seq_len), and peers.py scores the whole test split where evaluate may score the first
        # data.max_eval sentences. So the edgekit file peers.json timed beside them takes peers.json's latency and
        # accuracy too: every point it compares with then stands on the same sentences and the same session.
        # (peers.json's `_128` keys hold its `seq_len` tokens, 128 unless --seq-len said otherwise.)
        tokens = peers.get("seq_len", 128)
        session = {r["here"]: r for r in peers.get("rows", []) if r["model"].startswith("edgekit")}
        for a in (final.get("outputs") or {"": final}).values():  # every target's and format's artifact
            m = a["metrics"]
            here = (run / a["path"]).resolve()
            if here in session:
                point = (session[here]["accuracy"], session[here]["latency_ms_p50_128"], "test", tokens)
            else:
                point = (m.get("accuracy"), m.get("latency_ms_p50"), m.get("eval_split", "test"), m.get("bench_seq_len"))
            if isinstance(point[0], (int, float)) and isinstance(point[1], (int, float)):
                out.append((f"{name}: {a['path']}", point[0], point[1], m.get("size_mb") or 0.0, *point[2:]))
        for r in peers.get("rows", []):  # peers.py scores on the test split
            if not r["model"].startswith("edgekit"):
                out.append((f"{name}: {r['model']}", r["accuracy"], r["latency_ms_p50_128"], r["size_mb"], "test",
                            tokens))
    return out


def unique_names(folders: list) -> list:
    """Each run's folder name, or as much of its path as tells it from the others (two CI jobs' artifacts/run)."""
    parts = [Path(f).resolve().parts for f in folders]
    for depth in range(1, max(map(len, parts)) + 1):
        names = ["/".join(p[-depth:]) for p in parts]
        if len(set(names)) == len(names):
            return names
    return ["/".join(p) for p in parts]


def pareto(pts: list) -> list:
    """Points no other point beats on both accuracy (higher) and latency (lower); where points carry the tokens
    their latency was timed at (p[5]), only points timed at the same length compete."""
    return [p for p in pts if not any(q[1] >= p[1] and q[2] <= p[2] and (q[1] > p[1] or q[2] < p[2])
                                      and q[5:6] == p[5:6] for q in pts)]


def threads_text(n) -> str:
    """1 thread, 2 threads."""
    return f"{n} thread{'' if n == 1 else 's'}"


def unit_of(metric: str) -> str:
    """The unit number() takes for a metric's name: peak_rss_mb MiB, size_mb MB, latency_ms_* ms, others none."""
    return "MiB" if "rss" in metric else "MB" if metric.endswith("_mb") else "ms" if "_ms" in metric else ""


def number(value, unit: str = "") -> str:
    """A number as every table and summary shows it: accuracy and other fractions 4 places (0.8129); MB, ms, s and
    millions of parameters ("M") 2 places (17.51, 5.03), or 3 significant figures under 1 (0.0662 MB for a tiny
    model, where 2 places read 0.07 for all of them); MiB of memory 1 place; a parameter count as 22.7M or 85k.
    Empty for what was not measured. (gate shows as many places as its verdict needs: gate.number.)"""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):  # numpy's numbers too
        return ""
    if unit == "params":
        return params_text(value)
    if unit == "MiB":
        return f"{value:.1f}"
    if unit in ("MB", "ms", "s", "M"):
        small = 0 < abs(value) and round(abs(value), 2) < 1  # 3 significant figures, zeros kept: 0.500, 0.0662
        return f"{value:#.3g}" if small else f"{value:.2f}"
    return f"{value:.4f}"


def pyplot():
    """matplotlib's pyplot drawing to files (no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def splits(pts: list) -> str:
    """The split the points' accuracy is on: 'test', or 'test / validation' when the runs differ."""
    return " / ".join(sorted({p[4] for p in pts}))


def plot_tradeoff(pts: list, path: Path) -> None:
    plt = pyplot()

    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=120)
    lengths = sorted({p[5] for p in pts}, key=str)
    one = len(lengths) == 1  # else each point says its length: latencies at 32 and 128 tokens do not compare
    biggest = max(p[3] for p in pts) or 1.0
    for i, (label, acc, lat, size, _, tokens) in enumerate(pts):  # area relative to the largest: small ones differ
        ax.scatter(lat, acc, s=30 + 600 * size / biggest, alpha=0.55,
                   label=f"{i + 1}: {label} ({number(size, 'MB')} MB{'' if one else f', {tokens} tokens'})")
        ax.annotate(str(i + 1), (lat, acc), textcoords="offset points", xytext=(6, 6), fontsize=9)
    for n, tokens in enumerate(lengths):  # ringed points: a front of one point shows too
        front = sorted((p for p in pareto(pts) if p[5] == tokens), key=lambda p: p[2])
        ax.plot([p[2] for p in front], [p[1] for p in front], "k--o", fillstyle="none", linewidth=1,
                label="Pareto front" + ("" if one else f" at {tokens} tokens") if front else None)
    latencies = [p[2] for p in pts]
    wide = min(latencies) > 0 and max(latencies) / min(latencies) > 5  # teachers at 300 ms, students at 3
    if wide:
        ax.set_xscale("log")
    ax.set_xlabel(f"latency p50, batch 1{f', {lengths[0]} tokens' if one and lengths[0] else ''} (ms"
                  f"{', log' if wide else ''})")
    ax.set_ylabel(f"accuracy ({splits(pts)} split)")
    ax.set_title("accuracy against latency (bubble area grows with size)")
    ax.grid(alpha=0.3)
    ax.margins(0.15)
    if not wide:
        ax.set_xlim(left=0)  # no latency below zero, no accuracy above 1
    ax.set_ylim(top=min(ax.get_ylim()[1], 1.0 + 0.02))
    legend = ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.15), ncol=1, frameon=False)
    for handle in legend.legend_handles:
        if hasattr(handle, "set_sizes"):
            handle.set_sizes([30])  # one marker size in the legend; area is read from the plot
    fig.savefig(path, bbox_inches="tight")
    plt.close(fig)


def plot_breakdown(rows: dict, path: Path) -> None:
    plt = pyplot()

    names = list(rows)
    fig, ax = plt.subplots(figsize=(7, 0.6 * len(names) + 1.5), dpi=120)
    left = [0.0] * len(names)
    for part in PARTS:
        values = [rows[n][part] for n in names]
        ax.barh(names, values, left=left, label=part)
        left = [a + b for a, b in zip(left, values)]
    ax.set_xlabel("size (MB)")
    ax.set_title("where the bytes go, per artifact")
    ax.legend(ncol=4, fontsize=8, loc="lower center", bbox_to_anchor=(0.5, 1.08), frameon=False)
    ax.invert_yaxis()
    fig.savefig(path, bbox_inches="tight")
    plt.close(fig)


def plot_heads(heads: list, path: Path, before: list = None) -> None:
    """Heads kept per layer, coloured against the heads each layer had (`before`; runs from before it was
    recorded: against the most kept), so a model that kept 6 of 12 does not read as unpruned."""
    plt = pyplot()

    top = max(before or heads)
    fig, ax = plt.subplots(figsize=(max(4, len(heads) * 0.55), 1.8), dpi=120)
    image = ax.imshow([heads], cmap="viridis", aspect="auto", vmin=0, vmax=top)
    for i, h in enumerate(heads):
        ax.text(i, 0, f"{h}/{before[i]}" if before else str(h), ha="center", va="center", fontsize=8,
                color="black" if h > 0.6 * top else "white")  # dark text on viridis' light end
    ax.set_xticks(range(len(heads)), [f"L{i}" for i in range(len(heads))], fontsize=8)
    ax.set_yticks([])
    ax.set_title("attention heads kept per layer" + (" (kept/had)" if before else ""))
    bar = fig.colorbar(image, ax=ax, label="heads")
    bar.set_ticks(sorted({0, top // 2, top}))  # whole heads
    fig.savefig(path, bbox_inches="tight")
    plt.close(fig)


def build(run_dirs: list, out: Path) -> Path:
    run_dirs = list({Path(r).resolve(): r for r in run_dirs}.values())  # a run given twice is reported once
    runs = [load_manifest(Path(r)) for r in run_dirs]
    names = unique_names([run for _, run in runs])
    out.mkdir(parents=True, exist_ok=True)
    md = ["# edgekit report", ""]
    images = []
    for (manifest, run), name in zip(runs, names):
        md += [f"## {name} (recipe `{manifest['recipe']['name']}`, teacher `{manifest['recipe']['teacher']}`)", "",
               "| stage | seconds | params | size MB | accuracy | latency p50 ms | output |",
               "|---|---:|---:|---:|---:|---:|---|"]
        for s in manifest["stages"]:
            m = s["metrics"]
            md.append(f"| {s['name']} | {s['seconds']:.0f}{' (reused)' if s.get('reused') else ''} | "
                      f"{number(m.get('params'), 'params')} | {number(m.get('size_mb'), 'MB')} | "
                      f"{number(m.get('accuracy'))} | {number(m.get('latency_ms_p50'), 'ms')} | "
                      f"`{s['output']['path']}` |")
        md += ["", "| budget | actual | ok |", "|---|---:|---|"]  # rows as gate prints them: artifact, interval
        md += [f"| {gate.label(b)} {b['op']} {b['target']:g} | {gate.number(b)}{gate.notes(b)} | "
               f"{'yes' if b['ok'] else '**no**'} |" for b in manifest["budgets"]]
        md += per_class_table(manifest)
        for target, result in (manifest.get("devices") or {}).items():  # edgekit bench RUN --target NAME
            if result.get("complete") is not True:
                md += ["", f"Target `{target}`: not complete ({result.get('error', 'no result')})"]
                continue
            ran = f" ran `{result['model']}`" if result.get("model") else ""
            md += ["", f"Target `{target}`{' (emulated)' if result.get('emulated') else ''}{ran}: "
                   + ", ".join(f"{k} {number(v, unit_of(k))}" for k, v in result.get("metrics", {}).items())]
        pruned = next((s["metrics"] for s in manifest["stages"] if s["metrics"].get("heads_kept")), None)
        if pruned:
            png = out / f"heads-{re.sub(r'[^A-Za-z0-9._-]+', '-', name)}.png"  # a markdown link ends at a space
            png = png.with_stem(f"{png.stem}-{len(images)}") if png in images else png  # `a b` and `a-b`
            plot_heads(pruned["heads_kept"], png, pruned.get("heads_before"))
            images.append(png)
            md += ["", f"![heads kept per layer]({png.name})"]
        md.append("")
    pts = points(runs, names)
    if pts:
        plot_tradeoff(pts, out / "tradeoff.png")
        images.append(out / "tradeoff.png")
        front = pareto(pts)
        md += ["## Accuracy against latency", "", "![accuracy against latency](tradeoff.png)", "",
               "| artifact | accuracy | split | latency p50 ms | tokens | size MB | Pareto |",
               "|---|---:|---|---:|---:|---:|---|"]
        md += [f"| {p[0]} | {number(p[1])} | {p[4]} | {number(p[2], 'ms')} | {p[5] or ''} | {number(p[3], 'MB')} | "
               f"{'yes' if p in front else ''} |" for p in pts]
        for (manifest, run), name in zip(runs, names):
            if note := peers_note(name, manifest, run):
                md += ["", note]
        md.append("")
    unmeasured = [n for n in names if not any(p[0].startswith(f"{n}: ") for p in pts)]
    if unmeasured:
        md += [f"Not in the accuracy/latency trade-off (no accuracy or no latency; add evaluate and bench stages): "
               f"{', '.join(unmeasured)}", ""]
    sizes, left_out, absent = {}, {}, {}
    for (manifest, run), name in zip(runs, names):
        for s in manifest["stages"]:
            for o in (s["output"].get("outputs") or {"": s["output"]}).values():  # every target's and format's file
                path, label = run / o["path"], f"{name}/{o['path']}"
                if not path.exists():  # a copy of the run that holds some stages (a CI upload of the final one)
                    absent[label] = True
                elif path.suffix == ".onnx" or (path / "model.safetensors").is_file():
                    sizes[label] = sizes.get(label) or breakdown(path)
                else:
                    left_out[label] = True
    if sizes:
        plot_breakdown(sizes, out / "sizes.png")
        images.append(out / "sizes.png")
        md += ["## Size breakdown", "", "![size breakdown](sizes.png)", "",
               "| artifact | " + " | ".join(f"{p} MB" for p in PARTS) + " |", "|---|" + "---:|" * len(PARTS)]
        md += [f"| {k} | " + " | ".join(number(v[p], "MB") for p in PARTS) + " |" for k, v in sizes.items()]
    if left_out:
        md += ["", f"Not in the size breakdown (it reads ONNX files and transformers folders): {', '.join(left_out)}"]
    if absent:
        md += ["", f"Not in this copy of the run, so not in the size breakdown: {', '.join(absent)}"]
    text = "\n".join(md) + "\n"
    write_text(out / "report.md", text)
    write_text(out / "report.html", to_html(text, images))
    return out / "report.md"


def per_class_table(manifest: dict) -> list:
    """Markdown rows: each class's recall for the teacher and every final artifact (evaluate's per_class), the
    split's sentences of that class beside it; none before evaluate recorded it."""
    final = manifest.get("final") or {}
    outputs = {name: o["metrics"] for name, o in (final.get("outputs") or {}).items()} or \
        {"final": final.get("metrics") or {}}
    outputs = {name: m["per_class"] for name, m in outputs.items() if m.get("per_class")}
    if not outputs:
        return []
    classes = next(iter(outputs.values()))
    multi = any("f1" in c for c in classes.values())  # a multi-label run: precision and F1 per label too
    split = final["metrics"].get("eval_split", "evaluation")
    rows = ["", f"Recall / precision / F1 per label on the {split} split (a label never said has no precision):"
            if multi else f"Recall per class on the {split} split:", "",
            f"| {'label' if multi else 'class'} | sentences | teacher | " + " | ".join(outputs) + " |",
            "|---|---:|---:|" + "---:|" * len(outputs)]

    def cell(c: dict, prefix: str = "") -> str:
        if multi and f"{prefix}f1" in c:
            return " / ".join("-" if c[f"{prefix}{k}"] is None else f"{c[f'{prefix}{k}']:.4f}"
                              for k in ("recall", "precision", "f1"))
        return f"{c[f'{prefix}recall']:.4f}"

    rows += [f"| {name.replace('|', chr(92) + '|')} | {c['examples']} | {cell(c, 'teacher_')} | "
             + " | ".join(cell(o[name]) if name in o else "" for o in outputs.values()) + " |"
             for name, c in classes.items()]
    return rows


def params_text(n) -> str:
    """42k, 1.4M: as compress's summary writes a parameter count (0.0M told nothing for a tiny model)."""
    return f"{n / 1e6:.1f}M" if n >= 1e5 else f"{n / 1e3:.0f}k"


def inline_html(text: str) -> str:
    """Escaped text, `code` marks dropped and **bold** as <b>bold</b>."""
    return re.sub(r"\*\*(.+?)\*\*", r"<b>\1</b>", html.escape(text).replace("`", ""))


def to_html(markdown: str, images: list) -> str:
    """A small markdown subset (headings, tables, images, paragraphs) to one HTML file with images inlined."""
    inline = {p.name: "data:image/png;base64," + base64.b64encode(p.read_bytes()).decode() for p in images}
    body, table = [], []

    def flush():
        if table:
            rows = [r for r in table if not set(r.replace("|", "").strip()) <= set("-: ")]
            cells = [[inline_html(c.strip()) for c in r.strip().strip("|").split("|")] for r in rows]
            head = "".join(f"<th>{c}</th>" for c in cells[0])
            rest = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in r) + "</tr>" for r in cells[1:])
            body.append(f"<table><tr>{head}</tr>{rest}</table>")
            table.clear()

    for line in markdown.splitlines():
        if line.startswith("|"):
            table.append(line)
            continue
        flush()
        if line.startswith("#"):
            level = len(line) - len(line.lstrip("#"))
            body.append(f"<h{level}>{inline_html(line[level:].strip())}</h{level}>")  # `code` marks dropped too
        elif line.startswith("!["):
            alt, src = line[2:].split("](")
            body.append(f'<img alt="{html.escape(alt)}" src="{inline.get(src.rstrip(")"), "")}">')
        elif line.strip():
            body.append(f"<p>{inline_html(line)}</p>")
    flush()
    style = ("body{font-family:system-ui,sans-serif;max-width:960px;margin:2em auto;padding:0 1em}"
             "table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #ccc;padding:4px 8px;text-align:right}"
             "td:first-child,th:first-child{text-align:left}img{max-width:100%}")
    return f"<!doctype html><html><head><meta charset='utf-8'><title>edgekit report</title><style>{style}</style>" \
           f"</head><body>{''.join(body)}</body></html>\n"
