#!/usr/bin/env python
"""The README's picture: seconds to decode against source length, for memory attention and the
attentions it replaces, from benchmark.py's decode.csv.

    python -m recipes.speed.overview_plot results/speed/decode.csv results/speed/decode_time_overview.png

decode_time.png (report.py) has every model, per decoder step; this one keeps five, so the
fixed-size memory's flat line is visible at a glance.
"""

import argparse
import os

from recipes.cli import existing_file, output_file
from recipes.speed.report import grid, read_decode

# (model in decode.csv, legend, line style): memory attention, no attention, content attention.
SHOWN = [
    ("k32", "memory attention, K = 32 (ours)", "-"),
    ("noatt", "no attention (ours)", ":"),
    ("dot", "Luong attention (ours)", "-."),
    ("att", "Bahdanau attention (ours)", "--"),
    ("lstm_att", "fairseq lstm + attention", "--"),
]


def image_file(text: str) -> str:
    """An image to write, in a format matplotlib writes (told by its extension)."""
    from matplotlib.backend_bases import FigureCanvasBase

    formats = sorted(FigureCanvasBase.get_supported_filetypes())
    if os.path.splitext(text)[1][1:].lower() not in formats:
        raise argparse.ArgumentTypeError(f"{text}: give an image file ending in one of "
                                         f"{', '.join('.' + f for f in formats)}")
    return output_file(text)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("csv", type=existing_file, help="benchmark.py's decode.csv")
    parser.add_argument("output", type=image_file, help="image to write (.png, .svg, ...)")
    args = parser.parse_args(argv)
    try:
        rows = read_decode(args.csv)
    except ValueError as error:
        parser.error(str(error))
    if not rows:
        parser.error(f"no rows in {args.csv} (run recipes.speed.benchmark first)")
    seconds, _, _ = grid(rows, lambda r: float(r["seconds"]))
    sources, beam = rows[0]["sources"], rows[0]["beam"]

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 3.8))
    for model, label, style in SHOWN:
        if model in seconds:
            lengths = sorted(seconds[model])
            ax.plot(lengths, [seconds[model][n] for n in lengths], style, marker="o", markersize=3,
                    linewidth=2 if model == "k32" else 1.2, label=label)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("source length |S| (= output length)")
    ax.set_ylabel(f"seconds to decode {sources} sources")
    ax.set_title(f"Beam search (beam {beam}), CPU, one thread")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(args.output, dpi=120)


if __name__ == "__main__":
    main()
