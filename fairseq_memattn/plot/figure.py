"""The drawing of the attention figures (matplotlib, imported only when drawing): from the
weights of an :class:`Alignment`, whatever model they were captured from (``capture.py``)."""

import math
from dataclasses import dataclass, field
from typing import List, Optional

import numpy as np

from ..staging import replace_atomically

CELL_INCHES = 0.2  # side of one token's cell in the main panels
MAIN_PANEL_INCHES = (2.5, 11.0)  # smallest and largest side of a main panel
CONTEXT_PANEL_INCHES = (1.1, 2.2)
FACTOR_PANEL_INCHES = (1.0, 3.0)  # K side of the alpha and read panels
CONTEXT_GRID_COLUMNS = 8


@dataclass
class Alignment:
    """What is drawn for one checkpoint and one example."""

    label: str
    source: List[str]  # source tokens as the model saw them, </s> included
    target: List[str]  # best hypothesis, </s> included
    weights: np.ndarray  # S x T: the alignment (memory attention: beta alpha^T of the plotted read)
    contributions: Optional[np.ndarray] = None  # K x S x T: beta_tk * alpha_sk (memory attention)
    alphas: List[np.ndarray] = field(default_factory=list)  # per memory, S x K: the write (Eq. 5)
    read: Optional[np.ndarray] = None  # K x T: the plotted read's weights over the K rows (beta)
    read_name: str = ""  # which read is plotted, e.g. "layer 1 (last), mean of 4 heads"
    memory_index: int = 0  # which of ``alphas`` the plotted read reads
    write_score: str = "softmax"  # the scoring function of alpha (Eq. 5) and of the read (beta):
    read_score: str = "softmax"  # with sigmoid the weights are gates, no longer summing to one


def score_label(*scores: str) -> str:
    """A colour bar's label: sigmoid weights are read on another scale than softmax ones."""
    return "unnormalised (sigmoid scores)" if "sigmoid" in scores else ""


def context_colours(num_contexts: int) -> np.ndarray:
    """K distinct RGB colours: tab10, or beyond 10 hues spread by the golden ratio so that
    neighbouring contexts (often on neighbouring tokens) never look alike."""
    from matplotlib import colormaps
    from matplotlib.colors import hsv_to_rgb

    if num_contexts <= 10:
        return np.array([colormaps["tab10"](k)[:3] for k in range(num_contexts)])
    k = np.arange(num_contexts)
    hue, saturation, value = (k * 0.618034) % 1.0, np.full(num_contexts, 0.75), 0.95 - 0.3 * (k % 2)
    hsv = np.stack([hue, saturation, value], axis=1)
    return hsv_to_rgb(hsv)


def dominant_context_image(contributions: np.ndarray, colours: np.ndarray) -> np.ndarray:
    """S x T x 3: each cell in the colour of its largest C_k, faded to white by the combined
    weight (relative to the largest), as in Figs. 7 and 8 (left)."""
    combined = contributions.sum(axis=0)
    strength = combined / max(float(combined.max()), 1e-12)
    colour = colours[contributions.argmax(axis=0)]
    return 1.0 - strength[..., None] * (1.0 - colour)


def label_axis(ax, axis: str, tokens: List[str], name: str, max_ticks: int, fontsize=7) -> None:
    """Token (or context) ticks on one axis, every n-th one when there are more than max_ticks."""
    step = max(1, math.ceil(len(tokens) / max_ticks))
    positions = list(range(0, len(tokens), step))
    labels = [tokens[i] for i in positions]
    if axis == "x":
        ax.set_xticks(positions)
        ax.set_xticklabels(labels, fontsize=fontsize, rotation=90)
        ax.set_xlabel(name, fontsize=fontsize)
    else:
        ax.set_yticks(positions)
        ax.set_yticklabels(labels, fontsize=fontsize)
        ax.set_ylabel(name, fontsize=fontsize)
    ax.tick_params(length=2, pad=1)


def label_axes(ax, source: List[str], target: List[str], max_ticks: int, fontsize=7) -> None:
    label_axis(ax, "x", target, "hypothesis tokens", max_ticks, fontsize)
    label_axis(ax, "y", source, "source tokens", max_ticks, fontsize)


def context_names(num_contexts: int) -> List[str]:
    return [str(k + 1) for k in range(num_contexts)]


def panel_size(length: int) -> float:
    """Inches for a main panel's side showing ``length`` tokens."""
    return float(np.clip(length * CELL_INCHES, *MAIN_PANEL_INCHES))


def draw_alignment(fig, ax, alignment: Alignment, max_ticks: int, title: str) -> None:
    weights = alignment.weights
    if weights.min() < 0:  # unnormalised weights (linear attention) can be negative
        bound = float(np.abs(weights).max())
        image = ax.imshow(weights, cmap="RdBu_r", vmin=-bound, vmax=bound, aspect="auto",
                          interpolation="nearest")
    else:
        image = ax.imshow(weights, cmap="Greys", vmin=0.0, aspect="auto", interpolation="nearest")
    ax.set_gid("alignment")  # found by the tests, and the group's id in SVG output
    label_axes(ax, alignment.source, alignment.target, max_ticks)
    ax.set_title(title, fontsize=8)
    label = score_label(alignment.write_score, alignment.read_score)
    if not label and weights.min() < 0:
        label = "unnormalised (can be negative)"
    add_colorbar(fig, ax, image, label)


def add_colorbar(fig, ax, image, label: str) -> None:
    colorbar = fig.colorbar(image, ax=ax, fraction=0.05, pad=0.02)
    colorbar.ax.tick_params(labelsize=6)
    if label:
        colorbar.set_label(label, fontsize=6)


def draw_dominant_contexts(fig, ax, alignment: Alignment, max_ticks: int, title: str) -> None:
    from matplotlib.cm import ScalarMappable
    from matplotlib.colors import BoundaryNorm, ListedColormap

    num_contexts = alignment.contributions.shape[0]
    colours = context_colours(num_contexts)
    ax.imshow(dominant_context_image(alignment.contributions, colours), aspect="auto",
              interpolation="nearest")
    ax.set_gid("dominant-context")
    label_axes(ax, alignment.source, alignment.target, max_ticks)
    ax.set_title(title, fontsize=8)
    legend = ScalarMappable(norm=BoundaryNorm(np.arange(num_contexts + 1) + 0.5, num_contexts),
                            cmap=ListedColormap(colours))
    colorbar = fig.colorbar(legend, ax=ax, fraction=0.05, pad=0.02)
    step = max(1, math.ceil(num_contexts / 16))
    colorbar.set_ticks(np.arange(1, num_contexts + 1, step))
    colorbar.ax.tick_params(labelsize=6)
    colorbar.set_label("context k", fontsize=7)


def draw_context_grid(subfig, alignment: Alignment, aspect: float) -> None:
    """One small panel per C_k: beta_tk * alpha_sk, all on one colour scale (Fig. 8 left)."""
    from matplotlib.colors import LinearSegmentedColormap

    contributions = alignment.contributions
    num_contexts = contributions.shape[0]
    columns = min(num_contexts, CONTEXT_GRID_COLUMNS)
    axes = np.atleast_1d(subfig.subplots(math.ceil(num_contexts / columns), columns)).ravel()
    colours = context_colours(num_contexts)
    vmax = max(float(contributions.max()), 1e-12)
    for k, ax in enumerate(axes):
        if k >= num_contexts:
            ax.set_axis_off()
            continue
        cmap = LinearSegmentedColormap.from_list(f"C{k + 1}", [(1, 1, 1), colours[k]])
        ax.imshow(contributions[k], cmap=cmap, vmin=0.0, vmax=vmax, aspect="auto",
                  interpolation="nearest")
        ax.set_box_aspect(aspect)  # the main panels' shape, however wide the figure is
        ax.set_gid(f"context-{k + 1}")
        ax.set_xticks([])
        ax.set_yticks([])
        ax.set_title(f"$C_{{{k + 1}}}$", fontsize=7, pad=2)
    subfig.suptitle(r"each context's share $\beta_{tk}\,\alpha_{sk}$ (common scale)", fontsize=8)


def factor_size(num_contexts: int) -> float:
    """Inches for the K side of the alpha and read panels."""
    return float(np.clip(num_contexts * CELL_INCHES, *FACTOR_PANEL_INCHES))


def alignment_title(alignment: Alignment) -> str:
    read = f" ({alignment.read_name})" if alignment.read_name else ""
    return r"alignment $\beta\alpha^\top$" + read


def draw_weights(fig, ax, weights: np.ndarray, gid: str, title: str, score: str) -> None:
    """A heat map of weights in [0, 1] (alpha, the read's weights) of the scoring function ``score``."""
    image = ax.imshow(weights, cmap="Greys", vmin=0.0, aspect="auto", interpolation="nearest")
    ax.set_gid(gid)
    ax.set_title(title, fontsize=8)
    add_colorbar(fig, ax, image, score_label(score))


def draw_single_memory(alignment: Alignment, max_ticks: int):
    """Fig. 8's panels, laid out as the product they show: alpha of each memory (S x K, the
    write of Eq. 5) left of the alignment, the read's weights (K x T) above it, so that
    alignment = alpha x read; the dominant contexts right of it; the per-context grid below."""
    from matplotlib.figure import Figure

    width, height = panel_size(len(alignment.target)), panel_size(len(alignment.source))
    num_contexts = alignment.contributions.shape[0]
    num_memories = len(alignment.alphas)
    factor = factor_size(num_contexts)
    columns = min(num_contexts, CONTEXT_GRID_COLUMNS)
    small_width = float(np.clip(width / 3, *CONTEXT_PANEL_INCHES))
    small_height = float(np.clip(height / 3, *CONTEXT_PANEL_INCHES))
    top_height = factor + height + 2.4
    grid_height = math.ceil(num_contexts / columns) * (small_height + 0.35) + 0.3
    fig_width = max(num_memories * (factor + 1.4) + 2 * (width + 1.2), columns * (small_width + 0.2))
    fig = Figure(figsize=(fig_width, top_height + grid_height), layout="constrained")
    top, bottom = fig.subfigures(2, 1, height_ratios=[top_height, grid_height])
    grid = top.add_gridspec(2, num_memories + 2, height_ratios=[factor, height],
                            width_ratios=[factor] * num_memories + [width, width])
    contexts = context_names(num_contexts)
    for m, alpha in enumerate(alignment.alphas):
        ax = top.add_subplot(grid[1, m])
        which = f", memory {m}" if num_memories > 1 else ""
        plotted = " (read)" if num_memories > 1 and m == alignment.memory_index else ""
        draw_weights(top, ax, alpha, f"alpha-{m}", rf"write $\alpha${which}{plotted}",
                     alignment.write_score)
        label_axis(ax, "x", contexts, "context k", max_ticks)
        label_axis(ax, "y", alignment.source, "source tokens" if m == 0 else "", max_ticks)
    ax = top.add_subplot(grid[0, num_memories])
    read_name = f": {alignment.read_name}" if alignment.read_name else ""
    draw_weights(top, ax, alignment.read, "read", rf"read $\beta${read_name}", alignment.read_score)
    label_axis(ax, "y", contexts, "context k", max_ticks)
    ax.set_xticks([])
    draw_alignment(top, top.add_subplot(grid[1, num_memories]), alignment, max_ticks,
                   alignment_title(alignment))
    draw_dominant_contexts(top, top.add_subplot(grid[1, num_memories + 1]), alignment, max_ticks,
                           r"dominant context $C_k$ per cell")
    top.suptitle(alignment.label, fontsize=9)
    draw_context_grid(bottom, alignment, aspect=small_height / small_width)
    return fig


def draw_columns(alignments: List[Alignment], max_ticks: int):
    """One column per checkpoint (Fig. 6): alignments on top, dominant contexts below for the
    memory-attention ones."""
    from matplotlib.figure import Figure

    rows = 2 if any(a.contributions is not None for a in alignments) else 1
    widths = [panel_size(len(a.target)) + 1.2 for a in alignments]
    height = panel_size(max(len(a.source) for a in alignments)) + 1.4
    fig = Figure(figsize=(sum(widths), rows * height), layout="constrained")
    axes = fig.subplots(rows, len(alignments), width_ratios=widths, squeeze=False)
    for column, alignment in enumerate(alignments):
        is_memory = alignment.contributions is not None
        kind = alignment_title(alignment) if is_memory else "attention weights"
        title = f"{alignment.label}\n{kind}"
        draw_alignment(fig, axes[0, column], alignment, max_ticks, title)
        if rows == 2 and is_memory:
            draw_dominant_contexts(fig, axes[1, column], alignment, max_ticks,
                                   r"dominant context $C_k$")
        elif rows == 2:
            axes[1, column].set_axis_off()
            axes[1, column].text(0.5, 0.5, "no memory contexts\n(attention over the states)",
                                 ha="center", va="center", fontsize=8, color="0.4")
    return fig


def draw(alignments: List[Alignment], max_ticks: int = 40):
    """The figure (a matplotlib Figure, not yet saved): Fig. 8's layout for one memory-attention
    checkpoint, otherwise one column per checkpoint."""
    if len(alignments) == 1 and alignments[0].contributions is not None:
        return draw_single_memory(alignments[0], max_ticks)
    return draw_columns(alignments, max_ticks)


def save(fig, path: str, dpi: int) -> None:
    """Write the image so that a failure never leaves a partial one behind (savefig picks the format
    by the extension, which the partial file keeps)."""
    replace_atomically(path, lambda partial: fig.savefig(partial, dpi=dpi))
