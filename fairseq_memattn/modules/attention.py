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
  float16 context can overflow: see MemoryAttention), otherwise in the
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

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

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
SCORE_FUNCTIONS = ("softmax", "sigmoid")
# Eq. 5 normalises alpha_t over the K contexts at each encoder step ("contexts",
# the paper); some implementations normalise each context over time instead.
ENCODER_NORMALIZATIONS = ("contexts", "time")


def masked_fill_min(scores: Tensor, mask: Tensor) -> Tensor:
    """Fill masked scores with the dtype's most negative finite value.

    Unlike -inf this keeps a fully masked row finite under softmax (it becomes
    uniform instead of NaN), and it is representable in float16 and bfloat16.
    """
    # nan_to_num turns -inf into the dtype's most negative finite value, as
    # torch.finfo(dtype).min, which TorchScript does not have.
    lowest = torch.full((), float("-inf"), dtype=scores.dtype, device=scores.device).nan_to_num()
    return scores.masked_fill(mask, lowest)


def widen(x: Tensor) -> Tensor:
    """float16 and bfloat16 to float32; float32 and float64 unchanged (a no-op)."""
    return x.to(torch.promote_types(x.dtype, torch.float32))


def sum_of_products(a: Tensor, b: Tensor) -> Tensor:
    """``torch.bmm(a, b)`` accumulated and returned in float32 (or wider).

    The sums of the attention (Eq. 1, 4, 6 and the linear covariance) are
    reductions over up to |S| terms: in float16 a saturated Eq. 4-6 overflows
    (see MemoryAttention), and in bfloat16 each rounding costs 3 digits. So they
    run in float32 for a half-precision model (--fp16, --bf16) and under
    autocast (--amp), which would otherwise cast bmm back to half; float32 and
    float64 inputs go through unchanged, with identical results.
    """
    if torch.jit.is_scripting():
        # TorchScript takes only constant devices here (and ignores autocast)
        with torch.autocast("cpu", enabled=False), torch.autocast("cuda", enabled=False):
            return torch.bmm(widen(a), widen(b))
    with torch.autocast(a.device.type, enabled=False):
        return torch.bmm(widen(a), widen(b))


def _check_choice(name: str, value, choices) -> None:
    if value not in choices:
        raise ValueError(
            f"invalid {name}: {value!r} (choose from {', '.join(map(str, choices))})"
        )


class AlignmentSwitch:
    """For an ``nn.Module`` that keeps what alignments need (alpha of Eq. 4-5):
    whether to keep it, shared by the LSTM's attention and the Transformer's
    encoder (``models/transformer_memattn.py``)."""

    # None: the default below; True or False: make_generation_fast_'s (or the hub's) request.
    alignment_request: Optional[bool] = None

    @property
    def keep_alignment(self) -> bool:
        """Whether to return alignments. They cost extra work at every decoder
        step for the fixed-size memories, and no criterion reads them, so by
        default (None) they are kept in eval mode only, as fairseq's LSTM returns
        its attention; make_generation_fast_ sets True or False (fairseq-generate
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

    def lookup(self, memory, query):
        scores = self.score(query, memory["keys"])
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
        """v^T tanh(W_q h_i + W_s s_j) for B x t projected queries and B x S keys."""
        hidden = torch.tanh(projected_query.unsqueeze(2) + keys.unsqueeze(1))
        return self.v(hidden).squeeze(-1)

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
        return torch.bmm(query, keys.transpose(1, 2))


class DotAttention(ContentAttention):
    """Luong "dot": f_att(h_i, s_j) = h_i^T s_j (optionally / sqrt(D)); needs the
    encoder output size to equal the decoder hidden size."""

    def __init__(self, encoder_dim: int, decoder_dim: int, scaled: bool):
        super().__init__(encoder_dim)
        if encoder_dim != decoder_dim:
            raise ValueError(
                f"dot attention compares encoder outputs with decoder states, so their sizes "
                f"must match: encoder output size {encoder_dim} (2 x --encoder-hidden-size, "
                f"bidirectional) != --decoder-hidden-size {decoder_dim}"
            )
        self.scale = 1.0 / math.sqrt(encoder_dim) if scaled else 1.0

    def score(self, query, keys):
        return torch.bmm(query, keys.transpose(1, 2)) * self.scale


def score_function(name: str, scores: Tensor, dim: int, mask: Optional[Tensor] = None) -> Tensor:
    """The paper's "scoring function": softmax (normalised) or sigmoid (gates).

    ``mask`` (True = padding) zeroes entries that must not count; softmax is
    taken over the unmasked entries of ``dim`` only.
    """
    if name == "softmax":
        if mask is not None:
            scores = masked_fill_min(scores, mask)
        probs = F.softmax(scores.float(), dim=dim).type_as(scores)
    else:
        probs = torch.sigmoid(scores)
    if mask is not None:
        probs = probs.masked_fill(mask, 0.0)
    return probs


def position_encodings(padding_mask: Tensor, num_contexts: int, max_len: int) -> Tensor:
    """Eq. 10 with the masking and renormalisation of Sec. 3.2.

    L_ks = (1 - k/K)(1 - s/S) + (k/K)(s/S), k = 1..K the context index and
    s = 1..|x| the position of a token within its own sentence (so left padding
    does not shift it), S = ``max_len``. Entries beyond each sentence's length
    are masked and every context's row is renormalised to sum to 1 over time.
    Returns l: B x S_batch x K.
    """
    lengths = (~padding_mask).sum(dim=1)
    too_long = lengths > max_len
    if too_long.any():
        raise ValueError(
            f"source length {int(lengths.max())} exceeds the position-encoding maximum "
            f"S = {max_len} (--memory-position-max-len); use a larger value or shorter sources"
        )
    s = (~padding_mask).cumsum(dim=1).unsqueeze(-1).to(torch.float32)  # 1-based positions
    k = torch.arange(1, num_contexts + 1, device=s.device, dtype=s.dtype) / num_contexts
    L = (1 - k) * (1 - s / max_len) + k * (s / max_len)
    L = L.masked_fill(padding_mask.unsqueeze(-1), 0.0)
    return L / L.sum(dim=1, keepdim=True).clamp_min(1e-12)


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
    lengths = (~padding_mask).sum(dim=1, keepdim=True).clamp_min(1)
    r = ((~padding_mask).cumsum(dim=1) - 0.5) / lengths  # B x S
    K = log_width.numel()
    c = (torch.arange(K, device=r.device, dtype=torch.float32) + 0.5) / K
    width = widen(log_width).exp()
    return -0.5 * ((r.unsqueeze(-1) - c) / width) ** 2


class MemoryWrite(nn.Module):
    """The encoder side of Sec. 3, on its own: the write of Eq. 4-5 (with the
    position encodings of Eq. 8-10), shared by the LSTM's memory attention and
    the Transformer's memory (``models/transformer_memattn.py``).

        alpha_t = score(W_alpha s_t [o l_t]) in R^K,   C_k = sum_t alpha_tk s_t

    Padding positions get alpha = 0, so they never contribute to C. alpha and
    C are computed in float32 for a half-precision model or under autocast
    (see :class:`MemoryAttention` for why).

    ``encoder_normalize`` chooses the axis of an encoder-side softmax: over the
    K contexts at each step as Eq. 5 writes it ("contexts"), or over time for
    each context ("time"). It does not matter for sigmoid scores.

    ``position_window`` adds :func:`window_scores` to the scores (after Eq. 9's
    product, if both are on): a learned soft window per context over the
    relative source position, each w_k starting at 1/K.
    """

    def __init__(
        self,
        encoder_dim: int,
        num_contexts: int,
        encoder_score: str = "softmax",
        encoder_normalize: str = "contexts",
        position_encoding_max_len: Optional[int] = None,
        position_window: bool = False,
    ):
        super().__init__()
        if not isinstance(num_contexts, int) or num_contexts < 1:
            raise ValueError(f"invalid --memory-k: {num_contexts!r} (must be an integer >= 1)")
        _check_choice("--memory-encoder-score", encoder_score, SCORE_FUNCTIONS)
        _check_choice("--memory-encoder-normalize", encoder_normalize, ENCODER_NORMALIZATIONS)
        self.num_contexts = num_contexts
        self.encoder_score = encoder_score
        self.encoder_normalize = encoder_normalize
        self.position_encoding_max_len = position_encoding_max_len
        self.W_alpha = nn.Linear(encoder_dim, num_contexts, bias=False)  # Eq. 5
        self.window_log_width = (nn.Parameter(torch.full((num_contexts,), -math.log(num_contexts)))
                                 if position_window else None)

    def encoder_scores(self, states: Tensor, padding_mask: Tensor) -> Tensor:
        """alpha: B x S x K (Eq. 5, or Eq. 9 with position encodings), in float32 or wider."""
        scores = widen(self.W_alpha(states))
        if self.position_encoding_max_len is not None:
            pe = position_encodings(padding_mask, self.num_contexts, self.position_encoding_max_len)
            scores = scores * pe.type_as(scores)  # Eq. 9: W_alpha h_s o l_s
        if self.window_log_width is not None:
            scores = scores + window_scores(padding_mask, self.window_log_width).type_as(scores)
        dim = -1 if self.encoder_normalize == "contexts" else 1
        return score_function(self.encoder_score, scores, dim, padding_mask.unsqueeze(-1))

    def write(self, states: Tensor, padding_mask: Tensor) -> Tuple[Tensor, Tensor]:
        """(C: B x K x E, alpha: B x S x K) from states B x S x E."""
        alpha = self.encoder_scores(states, padding_mask)
        return sum_of_products(alpha.transpose(1, 2), states), alpha  # Eq. 4: C = alpha^T s


class MemoryAttention(MemoryWrite, Attention):
    """The fixed-size memory attention of Sec. 3.

    Encoder side, once per source: the write of :class:`MemoryWrite` (Eq. 4-5).
    Decoder side, per step (Eq. 6-7):
        beta = score(W_beta h) in R^K,                 c = sum_k beta_k C_k
    The memory is C (B x K x E); a decoder step costs O(KE) whatever |S| is.

    With sigmoid scores neither sum is normalised: |c| <= K |S| max|s_t|, and
    in training dropout scales the LSTM's outputs (|h| <= 1) by 1/(1-p), so
    at K = 32, |S| = 2000, p = 0.2 the bound is 80,000, beyond float16's
    65,504. Hence alpha, beta, C and c are computed in float32 for a
    half-precision model or under autocast (C is small: K x E per source),
    and c is returned in float32; the function itself is Eq. 4-7 unscaled.
    """

    def __init__(
        self,
        encoder_dim: int,
        decoder_dim: int,
        num_contexts: int,
        encoder_score: str = "softmax",
        decoder_score: str = "softmax",
        encoder_normalize: str = "contexts",
        position_encoding_max_len: Optional[int] = None,
        position_window: bool = False,
    ):
        super().__init__(encoder_dim, num_contexts, encoder_score, encoder_normalize,
                         position_encoding_max_len, position_window)
        _check_choice("--memory-decoder-score", decoder_score, SCORE_FUNCTIONS)
        self.context_dim = encoder_dim
        self.decoder_score = decoder_score
        self.W_beta = nn.Linear(decoder_dim, num_contexts, bias=False)  # Eq. 7

    def build_memory(self, states, padding_mask):
        contexts, alpha = self.write(states, padding_mask)
        memory = {"contexts": contexts}
        if self.keep_alignment:
            memory["alpha"] = alpha
        return memory

    def decoder_scores(self, query: Tensor) -> Tensor:
        """beta: B x T x K (Eq. 7), in float32 or wider."""
        return score_function(self.decoder_score, widen(self.W_beta(query)), dim=-1)

    def lookup(self, memory, query):
        beta = self.decoder_scores(query)  # Eq. 7
        context = sum_of_products(beta, memory["contexts"])  # Eq. 6
        # Sec. 5: the alignment over source tokens is beta times alpha-transposed.
        weights = sum_of_products(beta, memory["alpha"].transpose(1, 2)) if "alpha" in memory else None
        return context, weights


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


def position_encoding_length(args) -> Optional[int]:
    """S of Eq. 10 from the command line, or None without position encodings.

    The models fill S in from the training data (memory_options.fill_position_max_len)
    before they get here; a caller that did not, gets an error rather than a
    silent --max-source-positions, which would be a different model (Eq. 10
    with S much longer than the sentences is nearly flat)."""
    if not args.memory_position_encoding:
        return None
    if args.memory_position_max_len is None:
        raise ValueError("--memory-position-encoding needs S of Eq. 10: pass --memory-position-max-len S "
                         "(the longest source, EOS included), or --no-memory-position-encoding")
    return args.memory_position_max_len


def build_attention(args, encoder_dim: int, decoder_dim: int) -> Attention:
    """Build the attention chosen by ``--attention-type`` and its options."""
    kind = args.attention_type
    _check_choice("--attention-type", kind, ATTENTION_TYPES)
    if kind == "none":
        return NoAttention()
    if kind == "additive":
        return AdditiveAttention(encoder_dim, decoder_dim, args.attention_dim or decoder_dim)
    if kind == "general":
        return GeneralAttention(encoder_dim, decoder_dim)
    if kind in ("dot", "scaled_dot"):
        return DotAttention(encoder_dim, decoder_dim, scaled=kind == "scaled_dot")
    if kind == "memory":
        return MemoryAttention(
            encoder_dim,
            decoder_dim,
            num_contexts=args.memory_k,
            encoder_score=args.memory_encoder_score,
            decoder_score=args.memory_decoder_score,
            encoder_normalize=args.memory_encoder_normalize,
            position_encoding_max_len=position_encoding_length(args),
            position_window=args.memory_position_window,
        )
    return LinearAttention(encoder_dim, decoder_dim, gated=kind == "gated_linear")
