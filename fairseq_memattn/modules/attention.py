"""The attention family, behind one small interface.

Every variant is an ``nn.Module`` with two methods:

* ``build_memory(states, padding_mask)`` runs once per source, inside the
  encoder. It turns the encoder states (B x S x E, in the same padding layout
  as ``src_tokens``) into a *memory*: a dict of batch-first tensors. Only the
  memory, never the encoder states themselves unless the variant really needs
  them, travels through beam search (one row per source, shared by its
  hypotheses: see ``modules/beam_sharing.py``). Sums over source positions are kept
  in float32 even for a half-precision model (see :func:`sum_of_products`).
* ``lookup(memory, query)`` runs for decoder states (B x T x H, T = 1 while
  decoding step by step) and returns ``(context, weights)``: the context vector
  c_i (B x T x context_dim, or None for no attention) and, when it can be had,
  the alignment over source positions (B x T x S), which fairseq prints with
  ``--print-alignment``; both in float32 for float16/bfloat16 inputs (a
  float16 context can overflow: see ``modules/memory.py``), otherwise in the
  inputs' dtype. Query steps are looked up independently of each
  other, so the decoder can pass the beam hypotheses that share a source's
  memory row as extra steps of one query (see ``MemAttnDecoder.lookup``).

Equation numbers refer to Britz, Guan & Luong, "Efficient Attention using a
Fixed-Size Memory Representation" (EMNLP 2017), and to de Brebisson & Vincent,
"A Cheap Linear Attention Mechanism with Fast Lookups and Fixed-Size
Representations" (2016) for the linear variants.
"""

import math
from typing import Dict, Optional, Tuple

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from ..errors import UserError
from .memory import MemoryConfig, MemoryMix, MemoryWrite, source_alignment
from .numerics import check_choice, masked_fill_min, sum_of_products, widen

Memory = Dict[str, Tensor]

ATTENTION_TYPES = (
    "none",
    "additive",
    "general",
    "dot",
    "scaled_dot",
    "memory",
    "linear",
    "gated_linear",
)


class AlignmentSwitch:
    """For an ``nn.Module`` that keeps what alignments need (alpha of Eq. 4-5):
    whether to keep it, shared by the LSTM's attention and the Transformer's
    encoder (``models/transformer_memattn/encoder.py``)."""

    # None: the default below; True or False: make_generation_fast_'s (or the hub's) request.
    alignment_request: Optional[bool] = None

    @property
    def keep_alignment(self) -> bool:
        """Whether to return alignments. They cost extra work at every decoder
        step for the fixed-size memories, and only guided alignment's criterion
        reads them (the models' build_model then sets True), so by default
        (None) they are kept in eval mode only, as fairseq's LSTM returns its
        attention; make_generation_fast_ sets True or False (fairseq-generate
        passes --print-alignment)."""
        request = self.alignment_request  # a local, which TorchScript can refine from Optional
        return not self.training if request is None else request

    @keep_alignment.setter
    def keep_alignment(self, value: Optional[bool]) -> None:
        self.alignment_request = value


class Attention(AlignmentSwitch, nn.Module):
    """Base class: see the module docstring for the interface."""

    context_dim = 0

    def build_memory(self, states: Tensor, padding_mask: Tensor) -> Memory:
        raise NotImplementedError

    def lookup(self, memory: Memory, query: Tensor) -> Tuple[Optional[Tensor], Optional[Tensor]]:
        raise NotImplementedError


class NoAttention(Attention):
    """The paper's "No Att" baseline: the decoder sees the source only through
    its initial state."""

    def build_memory(self, states, padding_mask):
        return {}

    def lookup(self, memory, query):
        return None, None


class ContentAttention(Attention):
    """Standard content attention, Eq. 1-2: alpha_i = softmax(f_att(h_i, s)),
    c_i = sum_j alpha_ij s_j.

    The memory is the encoder states themselves (``values``) plus whatever part
    of f_att depends on the source alone (``keys``), computed once per source
    instead of at every decoder step.
    """

    def __init__(self, encoder_dim: int):
        super().__init__()
        self.context_dim = encoder_dim

    def project_keys(self, states: Tensor) -> Tensor:
        return states

    def score(self, query: Tensor, keys: Tensor) -> Tensor:
        """f_att for all pairs: (B x T x H, B x S x A) -> B x T x S."""
        raise NotImplementedError

    def build_memory(self, states, padding_mask):
        return {"keys": self.project_keys(states), "values": states, "padding_mask": padding_mask}

    def onnx_grouped_scores(self, g, query: str, keys: str, by_row) -> str:
        """:meth:`score` in ONNX, rows x group x M, for N = rows x group queries (N x H) over each row's
        keys (rows x M x A); ``by_row`` reshapes an N x W tensor to rows x group x W."""
        raise NotImplementedError

    def onnx_grouped_lookup(self, g, query: str, keys: str, values: str) -> Tuple[str, str]:
        """:meth:`lookup` in ONNX for N = rows x group queries (N x H, a row's queries consecutive)
        over each row's keys (rows x M x A, no padding) and values (rows x M x E): (context N x E,
        weights rows x group x M)."""
        def by_row(x):
            return g.op("Reshape", x, g.op("Concat", g.dims(values, 0, 1), g.const([-1], np.int64), g.dims(x, 1, 2),
                                           axis=0))

        scores = self.onnx_grouped_scores(g, query, keys, by_row)
        weights = g.op("Softmax", scores, axis=-1)  # Eq. 2
        context = g.op("MatMul", weights, values)  # Eq. 1: rows x group x E
        flat = g.op("Concat", g.const([-1], np.int64), g.dims(values, 2, 3), axis=0)
        return g.op("Reshape", context, flat), weights

    def lookup(self, memory, query):
        scores = self.score(query, memory["keys"])
        if "padding_mask" in memory:  # a source's padding; memory attention's K rows have none
            scores = masked_fill_min(scores, memory["padding_mask"].unsqueeze(1))
        weights = F.softmax(widen(scores), dim=-1)  # Eq. 2
        context = sum_of_products(weights, memory["values"])  # Eq. 1
        return context, weights


# The largest B x t x S x A tensor additive attention builds at once (bytes).
# Without input feeding it scores the whole target in one call, and B x T x S x A
# is ~5 GB in float32 at the paper's copy setting (B = 128, T = S = 200, A = 256).
ADDITIVE_SCORE_BUDGET_BYTES = 128 * 2**20


class AdditiveAttention(ContentAttention):
    """Bahdanau: f_att(h_i, s_j) = v^T tanh(W [h_i; s_j]), with W split into its
    source half (applied once, in the memory) and its decoder half.

    The tanh is taken for every (query step, source position) pair, a
    B x T x S x A tensor. ``score_budget_bytes`` bounds it: the query steps are
    scored in chunks of at most that many bytes, and in training each chunk is
    recomputed in the backward pass (torch.utils.checkpoint) instead of
    keeping every chunk's tanh, so training needs a few chunks' worth of memory
    instead of ~3 B x T x S x A. The results are the same; None scores the whole
    target at once.
    """

    def __init__(self, encoder_dim: int, decoder_dim: int, attention_dim: int,
                 score_budget_bytes: Optional[int] = ADDITIVE_SCORE_BUDGET_BYTES):
        super().__init__(encoder_dim)
        self.source_proj = nn.Linear(encoder_dim, attention_dim, bias=False)
        self.query_proj = nn.Linear(decoder_dim, attention_dim)
        self.v = nn.Linear(attention_dim, 1, bias=False)
        self.score_budget_bytes = score_budget_bytes

    def project_keys(self, states):
        return self.source_proj(states)

    def score_pairs(self, projected_query: Tensor, keys: Tensor) -> Tensor:
        """v^T tanh(W_q h_i + W_s s_j) for B x t projected queries and B x S keys, taken as
        2 v^T sigmoid(2x) - sum(v) (tanh x = 2 sigmoid(2x) - 1): the tanh's B x t x S x A values
        are the step's largest work, and torch's CPU tanh is far slower than its sigmoid
        (docs/speed.md)."""
        hidden = torch.add(2 * projected_query.unsqueeze(2), keys.unsqueeze(1), alpha=2).sigmoid_()
        return 2 * self.v(hidden).squeeze(-1) - self.v.weight.sum()

    def onnx_grouped_scores(self, g, query, keys, by_row):
        projected = by_row(g.linear(query, self.query_proj))
        projected = g.op("Unsqueeze", projected, g.const([2], np.int64))  # rows x group x 1 x A
        hidden = g.op("Tanh", g.op("Add", projected, g.op("Unsqueeze", keys, g.const([1], np.int64))))
        return g.op("Squeeze", g.linear(hidden, self.v, bias=False), g.const([3], np.int64))

    def score(self, query, keys):
        projected = self.query_proj(query)
        (B, T, A), S = projected.shape, keys.size(1)
        if self.score_budget_bytes is None:
            return self.score_pairs(projected, keys)
        step_bytes = B * S * A * torch.promote_types(projected.dtype, keys.dtype).itemsize
        steps = max(1, self.score_budget_bytes // max(1, step_bytes))
        if steps >= T:
            return self.score_pairs(projected, keys)
        recompute = torch.is_grad_enabled() and (projected.requires_grad or keys.requires_grad)
        return torch.cat([
            checkpoint(self.score_pairs, chunk, keys, use_reentrant=False) if recompute
            else self.score_pairs(chunk, keys)
            for chunk in projected.split(steps, dim=1)
        ], dim=1)


class GeneralAttention(ContentAttention):
    """Luong "general": f_att(h_i, s_j) = h_i^T W s_j, with W s_j kept in the memory."""

    def __init__(self, encoder_dim: int, decoder_dim: int):
        super().__init__(encoder_dim)
        self.source_proj = nn.Linear(encoder_dim, decoder_dim, bias=False)

    def project_keys(self, states):
        return self.source_proj(states)

    def score(self, query, keys):
        # float32 sums: as the read of the memory (--memory-read general) the keys are W C_k, and
        # a sigmoid write's rows grow with |S|, past float16's range in h^T W C_k on long sources
        return sum_of_products(query, keys.transpose(1, 2))

    def onnx_grouped_scores(self, g, query, keys, by_row):
        return g.op("MatMul", by_row(query), g.op("Transpose", keys, perm=[0, 2, 1]))


class DotAttention(ContentAttention):
    """Luong "dot": f_att(h_i, s_j) = h_i^T s_j (optionally / sqrt(D)); needs the
    encoder output size to equal the decoder hidden size."""

    def __init__(self, encoder_dim: int, decoder_dim: int, scaled: bool):
        super().__init__(encoder_dim)
        if encoder_dim != decoder_dim:
            raise UserError(
                f"dot attention compares encoder outputs with decoder states, so their sizes "
                f"must match: encoder output size {encoder_dim} (2 x --encoder-hidden-size, "
                f"bidirectional) != --decoder-hidden-size {decoder_dim}"
            )
        self.scale = 1.0 / math.sqrt(encoder_dim) if scaled else 1.0

    def score(self, query, keys):
        return torch.bmm(query, keys.transpose(1, 2)) * self.scale


# How the LSTM's decoder reads the K rows of the memory (--memory-read).
LSTM_MEMORY_READS = ("mix", "attention", "general")


class MemoryAttention(Attention):
    """The fixed-size memory attention of Sec. 3 for the LSTM: a writer
    (:class:`memory.MemoryWrite`, Eq. 4-5) builds the memory C (B x K x E) once
    per source, and at every decoder step read weights beta mix its rows,
    c = beta C (Eq. 6), returned in float32 (see ``modules/memory.py``).

    ``read`` says where beta comes from: ``"mix"``, the paper's Eq. 7 on the
    decoder state alone (:class:`memory.MemoryMix`); or content attention over
    the K rows (Eq. 1-2 with C in place of the source states), which compares the
    decoder state with what each row holds: ``"attention"`` additive,
    v^T tanh(W_q h + W_s C_k) (a tanh over K x --attention-dim values a step),
    ``"general"`` bilinear, h^T W C_k (W C_k kept once per source: K dot products
    a step, the mix's cost). Either way a step costs O(K) whatever |S| is."""

    def __init__(self, encoder_dim: int, decoder_dim: int, config: MemoryConfig, read: str = "mix",
                 attention_dim: Optional[int] = None):
        super().__init__()
        check_choice("--memory-read", read, LSTM_MEMORY_READS)
        self.read_name = read
        self.writer = MemoryWrite(encoder_dim, config)
        if read == "mix":
            self.read = MemoryMix(decoder_dim, config)
        elif read == "attention":
            self.read = AdditiveAttention(encoder_dim, decoder_dim, attention_dim or decoder_dim)
        else:
            self.read = GeneralAttention(encoder_dim, decoder_dim)
        self.context_dim = encoder_dim

    @property
    def reads_content(self) -> bool:
        """Whether beta compares the decoder state with the rows (the attention and general reads)."""
        return isinstance(self.read, ContentAttention)

    def read_memory(self, contexts: Tensor) -> Memory:
        """What the read needs of C, once per source: C itself, or for a content read C as
        its values and the source half of its scores as keys (in the model's precision)."""
        if not self.reads_content:
            return {"contexts": contexts}
        # C stays float32 as the values, as in the mix read; the keys go through the model's own precision,
        # where the rows' sums (at most |S| / (1 - dropout) in size) fit float16
        keys = self.read.project_keys(contexts.to(self.read.source_proj.weight.dtype))
        return {"keys": keys, "values": contexts}

    def build_memory(self, states, padding_mask):
        contexts, alpha = self.writer.write(states, padding_mask)
        memory = self.read_memory(contexts)
        if self.keep_alignment:
            memory["alpha"] = alpha
        return memory

    def read_rows(self, memory: Memory, query: Tensor) -> Tuple[Tensor, Tensor]:
        """(c, beta): B x T x E and B x T x K, in float32 or wider."""
        if self.reads_content:
            return self.read.lookup(memory, query)  # Eq. 1-2 over the K rows
        beta = self.read.read_weights(query)  # Eq. 7
        return self.read.mix(beta, memory["contexts"]), beta  # Eq. 6

    def lookup(self, memory, query):
        context, beta = self.read_rows(memory, query)
        weights = source_alignment(beta, memory["alpha"]) if "alpha" in memory else None
        return context, weights

    # The same in ONNX (export/lstm.py): the memory as the encoder graph's outputs, by name.
    def onnx_memory_widths(self) -> Dict[str, int]:
        """The memory's tensors in the graphs, B x K x width, by name: C (E), a content read's keys (W_s C)."""
        widths = {"memory_contexts": self.context_dim}
        if self.reads_content:
            widths["memory_keys"] = self.read.source_proj.weight.shape[0]
        return widths

    def onnx_read_memory(self, g, contexts: str) -> Dict[str, str]:
        """:meth:`read_memory`'s tensors, B x K x E and a content read's keys (B x K x A, or H for the general read)."""
        if not self.reads_content:
            return {"memory_contexts": contexts}
        return {"memory_contexts": contexts, "memory_keys": g.linear(contexts, self.read.source_proj, bias=False)}

    def onnx_read_rows(self, g, query: str, memory: Dict[str, str]) -> Tuple[str, str]:
        """:meth:`read_rows` for N = rows x group hypotheses (query N x H, the hypotheses of a source
        consecutive; the memory's tensors rows x K x ...): (c: N x E, beta: rows x group x K)."""
        if self.reads_content:
            return self.read.onnx_grouped_lookup(g, query, memory["memory_keys"], memory["memory_contexts"])
        return self.read.onnx_mix(g, query, memory["memory_contexts"])

    def upgrade_state_dict_named(self, state_dict, name):
        """Renames the parameters of checkpoints saved before the writer and the read were
        modules of their own (fairseq calls this on every submodule before loading)."""
        for old, new in (("W_alpha.weight", "writer.W_alpha.weight"),
                         ("window_log_width", "writer.window_log_width"), ("W_beta.weight", "read.W_beta.weight")):
            if f"{name}.{old}" in state_dict:
                state_dict[f"{name}.{new}"] = state_dict.pop(f"{name}.{old}")


class LinearAttention(Attention):
    """Cheap linear attention (de Brebisson & Vincent 2016): the softmax of
    content attention removed, so c = sum_t s_t (s_t^T q) = C q with the E x E
    memory C = sum_t s_t s_t^T, built once per source; q = W_q h.

    ``gated``: each state writes only what a learned gate lets through,
    u_t = sigmoid(W_g s_t + b_g) o s_t and C = sum_t u_t u_t^T.
    We divide C by the source length so its scale does not grow with |S|
    (the paper leaves C unnormalised; the division is a per-sentence constant).
    """

    def __init__(self, encoder_dim: int, decoder_dim: int, gated: bool):
        super().__init__()
        self.context_dim = encoder_dim
        self.query_proj = nn.Linear(decoder_dim, encoder_dim, bias=False)
        self.gate = nn.Linear(encoder_dim, encoder_dim) if gated else None

    def build_memory(self, states, padding_mask):
        written = states if self.gate is None else torch.sigmoid(self.gate(states)) * states
        written = widen(written)
        lengths = (~padding_mask).sum(dim=1).clamp_min(1).to(written.dtype)
        scale = lengths.sqrt()[:, None, None]
        written = written.masked_fill(padding_mask.unsqueeze(-1), 0.0) / scale
        memory = {"covariance": sum_of_products(written.transpose(1, 2), written)}
        if self.keep_alignment:
            # c = sum_t (u_t^T q / |x|) u_t, so source t's weight is u_t^T q / |x|:
            # the query's product with u_t / |x|, that is with written / sqrt(|x|).
            memory["weight_keys"] = written / scale
        return memory

    def lookup(self, memory, query):
        q = self.query_proj(query)
        context = sum_of_products(q, memory["covariance"])  # (C q)^T = q^T C, C symmetric
        keys = memory.get("weight_keys")
        weights = None if keys is None else sum_of_products(q, keys.transpose(1, 2))
        return context, weights


def build_attention(args, encoder_dim: int, decoder_dim: int) -> Attention:
    """Build the attention chosen by ``--attention-type`` and its options."""
    kind = args.attention_type
    check_choice("--attention-type", kind, ATTENTION_TYPES)
    if kind == "none":
        return NoAttention()
    if kind == "additive":
        return AdditiveAttention(encoder_dim, decoder_dim, args.attention_dim or decoder_dim)
    if kind == "general":
        return GeneralAttention(encoder_dim, decoder_dim)
    if kind in ("dot", "scaled_dot"):
        return DotAttention(encoder_dim, decoder_dim, scaled=kind == "scaled_dot")
    if kind == "memory":
        return MemoryAttention(encoder_dim, decoder_dim, MemoryConfig.from_options(args),
                               read=getattr(args, "memory_read", "mix"), attention_dim=args.attention_dim)
    return LinearAttention(encoder_dim, decoder_dim, gated=kind == "gated_linear")
