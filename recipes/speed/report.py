"""Tables and plot from benchmark.py's CSVs: `python -m recipes.speed.report OUT_DIR`.

Writes OUT/speed.md (decode time, cached bytes, training throughput, the speed targets, the
paper's Table 1 times) and OUT/decode_time.png (ms per decoder step vs source length).
"""

import argparse
import csv
import math
import os

from recipes.copy.paper import PAPER

# Paper Table 1: seconds to decode the copy-task test set on a K40m GPU.
PAPER_SECONDS = {model: {length: PAPER[length][label][1] for length in PAPER}
                 for model, label in (("noatt", "No Att"), ("k32", "K=32"), ("att", "Att"))}


def read(path):
    if not os.path.exists(path):
        return []
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


DECODE_COLUMNS = ("model", "label", "L", "sources", "beam", "seconds", "ms_per_step", "bytes_per_hypothesis")


def read_decode(path):
    """benchmark.py's decode.csv; ValueError naming the file for anything else (a speed.md, say)."""
    try:
        with open(path, newline="") as f:
            reader = csv.DictReader(f)
            rows = list(reader)
    except (OSError, UnicodeDecodeError, csv.Error) as error:
        raise ValueError(f"{path}: not readable as a CSV ({error})") from None
    missing = [column for column in DECODE_COLUMNS if column not in (reader.fieldnames or [])]
    if missing:
        raise ValueError(f"{path}: not a decode.csv of recipes.speed.benchmark (no column {', '.join(missing)})")
    for line, row in enumerate(rows, start=2):
        try:
            int(row["L"]), int(row["bytes_per_hypothesis"])
            times = float(row["seconds"]), float(row["ms_per_step"])
        except (TypeError, ValueError):  # TypeError: a row cut short
            times = ()
        if not (times and all(math.isfinite(t) and t >= 0 for t in times)):
            raise ValueError(f"{path}: line {line} is not a row of recipes.speed.benchmark's numbers")
    return rows


def grid(rows, value):
    """{model: {L: value(row)}} and the models (in first-seen order) and lengths present."""
    table, models = {}, []
    for r in rows:
        if r["model"] not in table:
            models.append(r["model"])
        table.setdefault(r["model"], {})[int(r["L"])] = value(r)
    lengths = sorted({int(r["L"]) for r in rows})
    return table, models, lengths


def markdown_table(header, body):
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in body]
    return "\n".join(lines)


def ratio(a, b):
    return None if a is None or b is None else a / b


def fmt(x, digits=2):
    return "" if x is None else f"{x:.{digits}f}"


def targets(decode, train_rows):
    """The speed targets as (target, measured, met) rows."""
    seconds, _, lengths = grid(decode, lambda r: float(r["seconds"]))
    per_step, _, _ = grid(decode, lambda r: float(r["ms_per_step"]))
    get = lambda table, model, L: table.get(model, {}).get(L)  # noqa: E731
    rows = []
    for L in lengths:
        r = ratio(get(seconds, "k32", L), get(seconds, "noatt", L))
        rows.append((f"K=32 / No Att at L={L} <= 1.05", fmt(r), r is not None and r <= 1.05))
    r = ratio(get(seconds, "k32", 200), get(seconds, "lstm_att", 200))
    rows.append(("K=32 / fairseq lstm + att at L=200 <= 0.4", fmt(r), r is not None and r <= 0.4))
    r = ratio(get(seconds, "k32", 200), get(seconds, "lstm", 200))
    rows.append(("K=32 / fairseq lstm (no att) at L=200 <= 1", fmt(r), r is not None and r <= 1))
    for model in ("k32", "att", "dot"):
        r = ratio(get(per_step, model, 800), get(per_step, model, 10))
        goal = "<= 1.10" if model == "k32" else "(grows)"
        rows.append((f"{model} time per step, L=800 / L=10 {goal}", fmt(r),
                     r is not None and (r <= 1.10 if model == "k32" else r > 1.10)))
    tokens = {(r["model"], int(r["L"]), r["input_feeding"]): float(r["tokens_per_s"]) for r in train_rows}
    for model in ("k32", "noatt", "att"):
        r = ratio(tokens.get((model, 200, "False")), tokens.get(("lstm_att", 200, "True")))
        rows.append((f"training tokens/s, {model} without input feeding / fairseq lstm + att "
                     f"at L=200 >= 2", fmt(r), r is not None and r >= 2))
    return [(t, m, "yes" if ok else ("no" if m else "not measured")) for t, m, ok in rows]


def write_report(out, command):
    decode = read(os.path.join(out, "decode.csv"))
    train_rows = read(os.path.join(out, "train.csv"))
    labels = {r["model"]: r["label"] for r in decode + train_rows}
    seconds, models, lengths = grid(decode, lambda r: float(r["seconds"]))
    per_step, _, _ = grid(decode, lambda r: float(r["ms_per_step"]))
    kib, _, _ = grid(decode, lambda r: int(r["bytes_per_hypothesis"]) / 1024)
    sources = sorted({r["sources"] for r in decode})
    parts = [f"Made by `{command}`.", ""]

    if decode:
        beam = decode[0]["beam"]
        parts += [f"### Decoding: seconds for {'/'.join(sources)} sources, beam {beam}, output "
                  "length = source length", "",
                  markdown_table(["model", *[f"L={L}" for L in lengths]],
                                 [[labels[m], *[fmt(seconds[m].get(L)) for L in lengths]] for m in models]),
                  "", "### Decoding: milliseconds per decoder step (a batch of all its hypotheses)", "",
                  markdown_table(["model", *[f"L={L}" for L in lengths]],
                                 [[labels[m], *[fmt(per_step[m].get(L), 1) for L in lengths]] for m in models]),
                  "", "### KiB cached per beam hypothesis (what `encoder_out` holds, reordered each step)", "",
                  markdown_table(["model", *[f"L={L}" for L in lengths]],
                                 [[labels[m], *[fmt(kib[m].get(L), 1) for L in lengths]] for m in models]),
                  "", "### Paper Table 1 (K40m GPU, seconds for the test set) beside ours", "",
                  markdown_table(["model", *[f"L={L} paper / ours" for L in (20, 50, 100, 200)]],
                                 [[labels.get(m, m), *[f"{fmt(PAPER_SECONDS[m].get(L))} / "
                                                       f"{fmt(seconds.get(m, {}).get(L))}"
                                                       for L in (20, 50, 100, 200)]]
                                  for m in PAPER_SECONDS]),
                  ""]
    if train_rows:
        train_lengths = sorted({int(r["L"]) for r in train_rows})
        body = []
        for m in dict.fromkeys(r["model"] for r in train_rows):
            for feeding in ("False", "True"):
                cells = {int(r["L"]): r["tokens_per_s"] for r in train_rows
                         if r["model"] == m and r["input_feeding"] == feeding}
                if cells:
                    body.append([labels[m], "yes" if feeding == "True" else "no",
                                 *[cells.get(L, "") for L in train_lengths]])
        parts += [f"### Training: target tokens/s (batch {train_rows[0]['batch']}, forward + backward "
                  "+ Adam)", "", markdown_table(["model", "input feeding",
                                                 *[f"L={L}" for L in train_lengths]], body), ""]
    parts += ["### Targets", "", markdown_table(["target", "measured", "met"],
                                                         targets(decode, train_rows)), ""]
    with open(os.path.join(out, "speed.md"), "w") as f:
        f.write("\n".join(parts))
    if decode:
        plot(per_step, models, labels, os.path.join(out, "decode_time.png"))
    print("\n".join(parts))


def plot(per_step, models, labels, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    ax.set_prop_cycle(color=plt.cm.tab20.colors[::2] + plt.cm.tab20.colors[1::2])  # 20 distinct
    for m in models:
        L = sorted(per_step[m])
        style = "--" if m.startswith("lstm") else "-"
        ax.plot(L, [per_step[m][x] for x in L], style, marker="o", markersize=3, label=labels[m])
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("source length L (= output length)")
    ax.set_ylabel("ms per decoder step (all hypotheses of a batch)")
    ax.set_title("Beam-search decoding time per step")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", metavar="OUT_DIR", help="recipes.speed.benchmark's output folder (decode.csv, train.csv)")
    out = parser.parse_args(argv).out
    if not os.path.isfile(os.path.join(out, "decode.csv")):
        parser.error(f"no decode.csv in {out} (run recipes.speed.benchmark first)")
    try:
        read_decode(os.path.join(out, "decode.csv"))
    except ValueError as error:
        parser.error(str(error))
    write_report(out, f"python -m recipes.speed.report {out}")


if __name__ == "__main__":
    main()
