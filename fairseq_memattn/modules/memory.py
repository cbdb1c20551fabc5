"""The fixed-size memory of Sec. 3, each equation written once, in torch and beside it in ONNX.

Britz, Guan & Luong, "Efficient Attention using a Fixed-Size Memory Representation" (EMNLP 2017):

* the write (:class:`MemoryWrite`), once per source: Eq. 4-5, with the position encodings of
  Eq. 8-10 and the position window;
* the mix (:class:`MemoryMix`), per decoder step: Eq. 6-7;
* the alignment over source tokens (:func:`source_alignment`): Sec. 5.

Each module's ``onnx_*`` method builds the same computation into an ONNX graph
(``export/graph.Graph``) from the module's own weights, so the export follows any change here.
alpha, beta, C and c are computed in float32 for a half-precision model or under autocast, so
that the sums over |S| tokens and K rows keep float32's digits; the decoder then goes on in its own
precision. With sigmoid scores neither sum is normalised: |c| <= K |S| max|s_t|, which at K = 32,
|S| = 2000 and dropout 0.2 on LSTM outputs (|h| <= 1) is 80,000, beyond float16's 65,504, so a
sigmoid/sigmoid model on long sources trains in float32 or bfloat16 (--bf16), not --fp16.
"""

import math
from dataclasses import MISSING, dataclass, fields
from typing import Optional, Tuple

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..errors import UserError
from .numerics import check_choice, check_positive_integer, masked_fill_min, sum_of_products, widen

SCORE_FUNCTIONS = ("softmax", "sigmoid")
# Eq. 5 normalises alpha_t over the K contexts at each encoder step ("contexts",
# the paper); some implementations normalise each context over time instead.
ENCODER_NORMALIZATIONS = ("contexts", "time")
# Sec. 3.2 renormalises each context's position encodings to sum to 1 over a sentence ("sum", the
# paper), which shrinks Eq. 9's product by about 1/|x|; "mean" scales them to mean 1 instead, so
# that the product keeps the scale of W_alpha h_s (docs/wmt17.md, "The LSTM gap").
POSITION_NORMALIZATIONS = ("sum", "mean")


@dataclass(frozen=True)
class MemoryConfig:
    """The memory's options (Sec. 3), one field per ``--memory-*`` option of the same name, checked
    here once however the model is built (the command line, the hub, Python)."""

    k: int  # K, the number of attention contexts
    encoder_score: str = "softmax"  # the scoring function of the write, Eq. 5
    decoder_score: str = "softmax"  # and of the read, Eq. 7
    encoder_normalize: str = "contexts"  # the axis of an encoder-side softmax
    position_encoding: bool = False  # Eq. 8-10
    position_max_len: Optional[int] = None  # S of Eq. 10
    position_normalize: str = "sum"  # what each context's encodings add up to over a sentence
    position_window: bool = False  # the learned soft window (window_scores)

    def __post_init__(self):
        for option, value in (("--memory-k", self.k), ("--memory-position-max-len", self.position_max_len)):
            if value is not None:
                check_positive_integer(option, value)
        check_choice("--memory-encoder-score", self.encoder_score, SCORE_FUNCTIONS)
        check_choice("--memory-decoder-score", self.decoder_score, SCORE_FUNCTIONS)
        check_choice("--memory-encoder-normalize", self.encoder_normalize, ENCODER_NORMALIZATIONS)
        check_choice("--memory-position-normalize", self.position_normalize, POSITION_NORMALIZATIONS)
        # No silent fallback to --max-source-positions: Eq. 10 with S much longer than the sentences
        # is nearly flat, a different model. The models read S from the training data before this.
        if self.position_encoding and self.position_max_len is None:
            raise UserError("--memory-position-encoding needs S of Eq. 10: pass --memory-position-max-len S "
                             "(the longest source, EOS included), or --no-memory-position-encoding")

    @classmethod
    def from_options(cls, options) -> "MemoryConfig":
        """The config of a command line's ``--memory-*`` options (an argparse Namespace or a fairseq
        config). An option a checkpoint predates (--memory-position-normalize) has the behaviour of
        its time, the field's default."""
        return cls(**{field.name: getattr(options, "memory_" + field.name) if field.default is MISSING
                      else getattr(options, "memory_" + field.name, field.default) for field in fields(cls)})


def score_function(name: str, scores: Tensor, dim: int, mask: Optional[Tensor] = None) -> Tensor:
    """The paper's "scoring function": softmax (normalised) or sigmoid (gates).

    ``mask`` (True = padding) zeroes entries that must not count; softmax is
    taken over the unmasked entries of ``dim`` only.
    """
    if name == "softmax":
        if mask is not None:
            scores = masked_fill_min(scores, mask)
        probs = F.softmax(widen(scores), dim=dim).type_as(scores)
    else:
        probs = torch.sigmoid(scores)
    if mask is not None:
        probs = probs.masked_fill(mask, 0.0)
    return probs


def onnx_score_function(g, name: str, scores: str, axis: int) -> str:
    return g.op("Softmax", scores, axis=axis) if name == "softmax" else g.op("Sigmoid", scores)


def source_too_long(which: str, length: int, limit: int) -> str:
    """The error for a source the position encodings do not cover."""
    return (f"{which} has {length} tokens (EOS included), more than the S = {limit} that the "
            f"model's position encodings cover (Eq. 10: --memory-position-max-len {limit}, fixed "
            f"when the model was trained; train with a larger one for longer sources): shorten or "
            f"split it")


def sentence_positions(padding_mask: Tensor, dtype: torch.dtype) -> Tuple[Tensor, Tensor]:
    """(s: B x S_batch, 1-based position of each token within its own sentence, so that left
    padding does not shift it; |x|: B, each sentence's length), in ``dtype``."""
    tokens = ~padding_mask
    return tokens.cumsum(dim=1).to(dtype), tokens.sum(dim=1).to(dtype)


def onnx_sentence_positions(g, padding: str) -> Tuple[str, str, str]:
    """:func:`sentence_positions` in ONNX, in float: (1.0 at tokens, s, |x| as B x 1)."""
    tokens = g.cast(g.op("Not", padding), np.int64)
    tokens_f = g.cast(tokens, np.float32)
    positions = g.cast(g.op("CumSum", tokens, g.const(1, np.int64)), np.float32)
    return tokens_f, positions, g.op("ReduceSum", tokens_f, g.const([1], np.int64), keepdims=1)


def position_encodings(padding_mask: Tensor, num_contexts: int, max_len: int,
                       normalize: str = "sum", dtype: torch.dtype = torch.float32) -> Tensor:
    """Eq. 10 with the masking and renormalisation of Sec. 3.2.

    L_ks = (1 - k/K)(1 - s/S) + (k/K)(s/S), k = 1..K the context index and
    s = 1..|x| the position of a token within its own sentence (so left padding
    does not shift it), S = ``max_len``. Entries beyond each sentence's length
    are masked and every context's row is renormalised over time: to sum to 1
    (``normalize="sum"``, the paper), or to mean 1, i.e. to sum to |x| ("mean").
    Returns l: B x S_batch x K.
    """
    positions, lengths = sentence_positions(padding_mask, dtype)
    if (lengths > max_len).any():
        raise UserError(source_too_long("a source", int(lengths.max()), max_len))
    s = positions.unsqueeze(-1)
    k = torch.arange(1, num_contexts + 1, device=s.device, dtype=s.dtype) / num_contexts
    L = (1 - k) * (1 - s / max_len) + k * (s / max_len)
    L = L.masked_fill(padding_mask.unsqueeze(-1), 0.0)
    total = L.sum(dim=1, keepdim=True).clamp_min(1e-12)
    if normalize == "mean":
        total = total / lengths.view(-1, 1, 1).clamp_min(1)
    return L / total


def window_scores(padding_mask: Tensor, log_width: Tensor) -> Tensor:
    """The soft position windows of ``--memory-position-window``: B x S x K.

    Token s (1-based, within its own sentence, so left padding does not shift
    it) of a sentence of |x| tokens sits at r_s = (s - 1/2) / |x|; context k at
    c_k = (k - 1/2) / K. The score -(r_s - c_k)^2 / (2 w_k^2), with w_k =
    exp(log_width[k]) learned, is added to the write's scores, so C_1 starts on
    the beginning of the sentence, C_K on its end and each C_k between them on
    its own stretch of about |x|/K tokens: the paper's hope for its position
    encodings (Sec. 5: "C_1 roughly focuses on tokens 1 to 4, C_2 on tokens 5
    to 8"), made the starting point instead of something to learn."""
    width = widen(log_width).exp()
    positions, lengths = sentence_positions(padding_mask, width.dtype)
    r = (positions - 0.5) / lengths.clamp_min(1).unsqueeze(1)  # B x S
    K = log_width.numel()
    c = (torch.arange(K, device=r.device, dtype=r.dtype) + 0.5) / K
    return -0.5 * ((r.unsqueeze(-1) - c) / width) ** 2


class MemoryWrite(nn.Module):
    """The write of Eq. 4-5, once per source:

        alpha_t = score(W_alpha s_t [o l_t]) in R^K,   C_k = sum_t alpha_tk s_t

    Padding positions get alpha = 0, so they never contribute to C.

    ``encoder_normalize`` chooses the axis of an encoder-side softmax: over the
    K contexts at each step as Eq. 5 writes it ("contexts"), or over time for
    each context ("time"). It does not matter for sigmoid scores.

    ``position_window`` adds :func:`window_scores` to the scores (after Eq. 9's
    product, if both are on): a learned soft window per context over the
    relative source position, each w_k starting at 1/K.
    """

    def __init__(self, encoder_dim: int, config: MemoryConfig):
        super().__init__()
        K = config.k
        self.num_contexts = K
        self.encoder_score = config.encoder_score
        self.encoder_normalize = config.encoder_normalize
        self.position_encoding_max_len = config.position_max_len if config.position_encoding else None
        self.position_normalize = config.position_normalize
        self.W_alpha = nn.Linear(encoder_dim, K, bias=False)  # Eq. 5
        self.window_log_width = nn.Parameter(torch.full((K,), -math.log(K))) if config.position_window else None

    def write_weights(self, states: Tensor, padding_mask: Tensor) -> Tensor:
        """alpha: B x S x K (Eq. 5, or Eq. 9 with position encodings), in float32 or wider."""
        scores = widen(self.W_alpha(states))
        if self.position_encoding_max_len is not None:
            pe = position_encodings(padding_mask, self.num_contexts, self.position_encoding_max_len,
                                    self.position_normalize, scores.dtype)
            scores = scores * pe  # Eq. 9: W_alpha h_s o l_s
        if self.window_log_width is not None:
            scores = scores + window_scores(padding_mask, self.window_log_width).type_as(scores)
        dim = -1 if self.encoder_normalize == "contexts" else 1
        return score_function(self.encoder_score, scores, dim, padding_mask.unsqueeze(-1))

    def write(self, states: Tensor, padding_mask: Tensor) -> Tuple[Tensor, Tensor]:
        """(C: B x K x E, alpha: B x S x K) from states B x S x E (padding_mask: True at padding)."""
        alpha = self.write_weights(states, padding_mask)
        return sum_of_products(alpha.transpose(1, 2), states), alpha  # Eq. 4: C = alpha^T s

    def onnx_write(self, g, states: str, padding: str) -> Tuple[str, str]:
        """:meth:`write` in ONNX: (C, alpha) from states B x S x E and padding (bool B x S)."""
        K = self.num_contexts
        scores = g.linear(states, self.W_alpha)  # B x S x K
        tokens_mask_f, positions, lengths = onnx_sentence_positions(g, padding)
        s = g.op("Unsqueeze", positions, g.const([-1], np.int64))
        if self.position_encoding_max_len is not None or self.window_log_width is not None:
            n = g.op("Unsqueeze", lengths, g.const([-1], np.int64))  # B x 1 x 1: each sentence's length
            words = g.op("Max", n, g.const(1.0))  # what the encodings' mean and the window divide by
        if self.position_encoding_max_len is not None:  # Eq. 10, masked and renormalised (Sec. 3.2)
            frac = g.op("Div", s, g.const(float(self.position_encoding_max_len)))
            k = np.arange(1, K + 1, dtype=np.float32) / K
            L = g.op("Add", g.op("Mul", g.op("Sub", g.const(1.0), frac), g.const(1 - k)),
                     g.op("Mul", frac, g.const(k)))
            L = g.op("Mul", L, g.op("Unsqueeze", tokens_mask_f, g.const([-1], np.int64)))
            # sum_s L_ks in closed form from the sentence's own length n: (1 - k) n + (2k - 1) n (n + 1) / 2S.
            # Not ReduceSum over time: ONNX Runtime sums B x S x K over S in another order for B = 1 than
            # for B > 1 (last bits), so a sentence's memory would depend on how many it is batched with.
            half = g.op("Div", g.op("Mul", n, g.op("Add", n, g.const(1.0))),
                        g.const(2.0 * self.position_encoding_max_len))  # sum_s s / S
            total = g.op("Max", g.op("Add", g.op("Mul", n, g.const(1 - k)), g.op("Mul", half, g.const(2 * k - 1))),
                         g.const(1e-12))
            if self.position_normalize == "mean":
                total = g.op("Div", total, words)
            scores = g.op("Mul", scores, g.op("Div", L, total))  # Eq. 9
        if self.window_log_width is not None:  # window_scores
            r = g.op("Div", g.op("Sub", s, g.const(0.5)), words)
            c = (np.arange(K, dtype=np.float32) + 0.5) / K
            z = g.op("Div", g.op("Sub", r, g.const(c)), g.weight(self.window_log_width.detach().exp(), "width"))
            scores = g.op("Add", scores, g.op("Mul", g.op("Mul", z, z), g.const(-0.5)))
        mask = g.op("Unsqueeze", padding, g.const([-1], np.int64))  # B x S x 1
        if self.encoder_score == "softmax":
            scores = g.masked_fill(scores, mask, float(np.finfo(np.float32).min))
        alpha = onnx_score_function(g, self.encoder_score, scores,
                                    axis=-1 if self.encoder_normalize == "contexts" else 1)
        alpha = g.masked_fill(alpha, mask, 0.0)
        contexts = g.op("MatMul", g.op("Transpose", alpha, perm=[0, 2, 1]), states)  # Eq. 4
        return contexts, alpha


class MemoryMix(nn.Module):
    """The decoder side of Sec. 3, per step (Eq. 6-7):

        beta = score(W_beta h) in R^K,   c = sum_k beta_k C_k

    A step costs O(K E) whatever |S| is. Queries (B x T x H) are mixed independently, so the
    hypotheses of one source can be passed as extra steps of its one memory row.
    """

    def __init__(self, query_dim: int, config: MemoryConfig):
        super().__init__()
        self.decoder_score = config.decoder_score
        self.W_beta = nn.Linear(query_dim, config.k, bias=False)  # Eq. 7

    def read_weights(self, query: Tensor) -> Tensor:
        """beta: B x T x K (Eq. 7), in float32 or wider."""
        return score_function(self.decoder_score, widen(self.W_beta(query)), dim=-1)

    def mix(self, beta: Tensor, contexts: Tensor) -> Tensor:
        """c = beta C (Eq. 6): B x T x E in float32 or wider, for contexts B x K x E."""
        return sum_of_products(beta, contexts)

    def onnx_mix(self, g, query: str, contexts: str, short=None, short_contexts: str = None) -> Tuple[str, str]:
        """Eq. 7 then Eq. 6 in ONNX for N = rows x group hypotheses (query N x H, the
        hypotheses of a source consecutive; contexts rows x K x E): (c: N x E, beta: rows x
        group x K). ``short`` (memory_reads.ShortSource): the first hypotheses are those of short
        sources, whose ``short_contexts`` are their projected states H W^T (rows x |S| x E), mixed
        through alpha: (beta alpha^T) H W^T."""
        K = self.W_beta.weight.shape[0]
        beta = onnx_score_function(g, self.decoder_score, g.linear(query, self.W_beta), axis=-1)  # Eq. 7

        def by_source(b, rows, group):  # R G x K -> R x G x K (``group`` given: ONNX cannot infer it for R = 0)
            return g.op("Reshape", b, g.op("Concat", rows, group, g.const([K], np.int64), axis=0))

        if short is None:
            beta = by_source(beta, g.dims(contexts, 0, 1), g.const([-1], np.int64))
            mixed = g.op("MatMul", beta, contexts)  # Eq. 6
        else:
            beta_short, beta_other = (by_source(b, rows, short.group)
                                      for b, rows in zip(short.split(g, beta), (short.rows, short.other_rows)))
            mixed = g.op("Concat", g.op("MatMul", g.op("MatMul", beta_short, short.alpha_rows(g)[1]), short_contexts),
                         g.op("MatMul", beta_other, contexts), axis=0)
            beta = g.op("Concat", beta_short, beta_other, axis=0)
        width = g.dims(contexts, 2, 3)
        return g.op("Reshape", mixed, g.op("Concat", g.const([-1], np.int64), width, axis=0)), beta


def source_alignment(read_weights: Tensor, alpha: Tensor) -> Tensor:
    """Sec. 5: "we multiply the attention scores alpha and beta" — the alignment of each
    query over the source tokens is its read weights times alpha^T. read_weights B x T x K
    (or B x H x T x K, per head), alpha B x S x K -> B x T x S (B x H x T x S), float32."""
    alpha_t = alpha.transpose(1, 2)
    if read_weights.dim() == 4:
        alpha_t = alpha_t.unsqueeze(1)
    return sum_of_products(read_weights, alpha_t)
