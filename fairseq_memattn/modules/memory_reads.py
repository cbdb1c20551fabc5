"""The reads of the Transformer's memory: what each decoder layer does in place of fairseq's
encoder-attention, registered by name (``--memory-read``) in :data:`READS`.

* ``attention``: fairseq's multi-head attention over the K memory rows (:class:`AttentionRead`);
* ``mix``: the paper's Eq. 6-7, per layer (:class:`MixRead`).

Each read derives what it needs from the memory once per source (``project_memory``) and
reads it for a batch of queries (``read``); ``onnx_project`` and ``onnx_read`` build the same
into the exported graphs.
"""

from typing import Dict, List, Optional, Tuple

import numpy as np
import torch
import torch.nn.functional as F
from fairseq.incremental_decoding_utils import FairseqIncrementalState
from fairseq.modules import FairseqDropout, MultiheadAttention
from fairseq.modules.quant_noise import quant_noise
from torch import Tensor, nn

from .beam_sharing import select_rows
from .memory import MemoryConfig, MemoryMix, source_alignment


def group_tensor(group: int) -> Tensor:
    """``group`` as a 1-element tensor: encoder_out and the incremental state
    hold tensors only (TorchScript). On the CPU, so that reading it back
    never waits for an accelerator."""
    return torch.full((1,), group, dtype=torch.long)


class MemoryRead(FairseqIncrementalState, nn.Module):
    """A decoder layer's read of the memory, in the place (and with the call
    signature) of fairseq's encoder-attention. fairseq's decoder hands every
    layer two tensors: ``key`` (= ``value``) are the memories B x M x K x d
    (``encoder_out["memory"][0]``), of which this layer reads memory
    ``memory_index``, and ``key_padding_mask`` is alpha B x M x S x K when
    alignments are kept (``encoder_out["alpha"]``), else None: the memory has
    no padding.

    Returned weights, with ``need_weights`` or ``need_head_weights`` and
    alpha given, are over source positions (:func:`memory.source_alignment`),
    per head (H x N x T x S) with ``need_head_weights``, as fairseq's decoder
    expects for its alignments; otherwise None, and the O(K |S|) product is not computed.
    """

    name = ""  # the --memory-read value
    memory_parts: Tuple[str, ...] = ()  # what project_memory returns, in the exported graphs' order

    @classmethod
    def from_config(cls, cfg, embed_dim: int, memory_index: int, q_noise: float, qn_block_size: int):
        """The read of a decoder layer of width ``embed_dim`` built from transformer_memattn's config."""
        raise NotImplementedError

    def project_memory(self, contexts: Tensor) -> Dict[str, Tensor]:
        """What the read needs from C (B x K x d), computed once per source."""
        raise NotImplementedError

    def read(self, query: Tensor, cache: Dict[str, Tensor]) -> Tuple[Tensor, Tensor]:
        """(output B x T' x D, weights B x H x T' x K) for queries B x T' x D."""
        raise NotImplementedError

    def forward(self, query: Tensor, key: Optional[Tensor], value: Optional[Tensor],
                key_padding_mask: Optional[Tensor] = None,
                incremental_state: Optional[Dict[str, Dict[str, Optional[Tensor]]]] = None,
                need_weights: bool = True, static_kv: bool = False, attn_mask: Optional[Tensor] = None,
                before_softmax: bool = False, need_head_weights: bool = False
                ) -> Tuple[Tensor, Optional[Tensor]]:
        assert key is not None, "a memory read needs the memory (encoder_out)"
        memories, alpha = key, key_padding_mask
        steps, hypotheses, dim = query.shape
        rows = memories.size(0)
        group = hypotheses // rows
        cache = self.cached_memory(incremental_state, memories, query.dtype, group)
        # The hypotheses sharing a row are read as extra query steps of that row.
        x = query.transpose(0, 1).reshape(rows, group * steps, dim)
        out, weights = self.read(x, cache)
        out = out.reshape(hypotheses, steps, -1).transpose(0, 1)

        if not (need_weights or need_head_weights) or alpha is None:
            return out, None
        align = source_alignment(weights, alpha[:, self.memory_index])  # B x H x gT x S
        heads = align.size(1)
        align = align.reshape(rows, heads, group, steps, -1).transpose(0, 1)
        align = align.reshape(heads, hypotheses, steps, -1)
        return out, (align if need_head_weights else align.mean(dim=0))

    def cached_memory(self, incremental_state: Optional[Dict[str, Dict[str, Optional[Tensor]]]],
                      memories: Tensor, dtype: torch.dtype, group: int) -> Dict[str, Tensor]:
        """project_memory of this layer's memory, once per source while decoding step by step."""
        saved = self.get_incremental_state(incremental_state, "memory")
        cache: Dict[str, Tensor] = {}
        if saved is not None:
            for name, tensor in saved.items():
                if tensor is not None and name != "group":
                    cache[name] = tensor
            return cache
        # The memory is written in float32 (numerics.sum_of_products); a
        # half-precision layer reads it in its own dtype.
        cache = self.project_memory(memories[:, self.memory_index].to(dtype))
        if incremental_state is not None:
            stored: Dict[str, Optional[Tensor]] = {"group": group_tensor(group)}
            for name, tensor in cache.items():
                stored[name] = tensor
            self.set_incremental_state(incremental_state, "memory", stored)
        return cache

    def _set_input_buffer(self, incremental_state: Dict[str, Dict[str, Optional[Tensor]]],
                          buffer: Dict[str, Optional[Tensor]]):
        # fairseq's decoder layer reaches its encoder-attention's cache by this
        # name (its prev_attn_state argument)
        return self.set_incremental_state(incremental_state, "memory", buffer)

    @torch.jit.export
    def reorder_incremental_state(self, incremental_state: Dict[str, Dict[str, Optional[Tensor]]],
                                  new_order: Tensor):
        saved = self.get_incremental_state(incremental_state, "memory")
        if saved is None:
            return
        names: List[str] = []
        tensors: List[Tensor] = []
        group = 1
        for name, tensor in saved.items():
            if tensor is not None:
                if name == "group":
                    group = int(tensor[0])
                else:
                    names.append(name)
                    tensors.append(tensor)
        tensors, group = select_rows(tensors, new_order, group)
        reordered: Dict[str, Optional[Tensor]] = {"group": group_tensor(group)}
        for name, tensor in zip(names, tensors):
            reordered[name] = tensor
        self.set_incremental_state(incremental_state, "memory", reordered)

    # --- the exported graphs (export/transformer.py) ---------------------------------

    def memory_shape(self, rows: str, width: str = "memory_rows") -> list:
        """The shape of each of ``memory_parts`` in the graphs: ``rows`` sources of ``width`` rows."""
        raise NotImplementedError

    def onnx_project(self, g, contexts: str) -> Dict[str, str]:
        """:meth:`project_memory` in ONNX."""
        raise NotImplementedError

    def onnx_project_states(self, g, states: str) -> Dict[str, str]:
        """The same parts for a short source, from its states H (B x S x E) instead of C = alpha^T H:
        each part is linear in C, so its |S| rows of H projected stand for the K rows, read through
        alpha (``ShortSource``); biases are left to the read."""
        raise NotImplementedError

    def onnx_read(self, g, x: str, memory: Dict[str, str], short: "ShortSource" = None) -> Tuple[str, str]:
        """:meth:`read` in ONNX for N = rows x group hypotheses (x: N x D, a source's
        hypotheses consecutive): (output N x D, weights rows x group x K, mean over heads).
        ``short``: the first rows are short sources' hypotheses, read from ``short.memory``."""
        raise NotImplementedError


class ShortSource:
    """In the exported decoder step, the sources shorter than short_source_rows: each layer's memory
    holds their |S| projected states (``memory``, the parts of :meth:`MemoryRead.onnx_project_states`,
    rows x ... x |S| x ...) rather than K projected contexts, read through the write weights alpha
    (rows x M x S x K): sum_k w_k (alpha^T H W^T)_k = (w alpha^T) (H W^T). Fewer rows to read while
    |S| < K. Their hypotheses are the step's first ``rows`` x ``group`` rows, the other sources'
    (``other_rows`` of them, K memory rows each) follow, so one step reads both layouts."""

    def __init__(self, alpha: str, rows: str, other_rows: str, group: str, memory: Dict[str, str],
                 memory_index: int):
        self.alpha, self.rows, self.other_rows, self.group = alpha, rows, other_rows, group
        self.memory, self.memory_index = memory, memory_index

    @staticmethod
    def layout(g, alpha: str, hypotheses: str, other_memory: str) -> dict:
        """The sizes every layer's ShortSource shares: rows (short sources), other_rows, group
        (hypotheses per source), as 1-D int64 of one element."""
        rows, other_rows = g.dims(alpha, 0, 1), g.dims(other_memory, 0, 1)
        group = g.op("Div", g.dims(hypotheses, 0, 1), g.op("Add", rows, other_rows))
        return {"alpha": alpha, "rows": rows, "other_rows": other_rows, "group": group}

    def split(self, g, x: str) -> Tuple[str, str]:
        """x's rows (one per hypothesis) of the short sources, and of the others."""
        first = g.op("Mul", self.rows, self.group)
        return (g.op("Slice", x, g.const([0], np.int64), first, g.const([0], np.int64)),
                g.op("Slice", x, first, g.const([np.iinfo(np.int64).max], np.int64), g.const([0], np.int64)))

    def alpha_rows(self, g) -> Tuple[str, str]:
        """(alpha of this memory, rows x S x K; its transpose, rows x K x S)."""
        alpha = g.op("Gather", self.alpha, g.const(self.memory_index, np.int64), axis=1)
        return alpha, g.op("Transpose", alpha, perm=[0, 2, 1])


class AttentionRead(MemoryRead, MultiheadAttention):
    """``--memory-read attention``: fairseq's multi-head encoder-attention
    (its parameters, initialisation, dropout and quant-noise) over the K memory
    rows instead of the |S| states. Keys and values (B x H x K x d/H) are
    projected once per source; the memory has no padding, so no mask is needed."""

    name = "attention"
    memory_parts = ("key", "value")

    def __init__(self, embed_dim, num_heads, memory_dim, dropout, memory_index, q_noise=0.0, qn_block_size=8):
        super().__init__(embed_dim, num_heads, kdim=memory_dim, vdim=memory_dim, dropout=dropout,
                         encoder_decoder_attention=True, q_noise=q_noise,
                         qn_block_size=qn_block_size)
        self.memory_index = memory_index

    @classmethod
    def from_config(cls, cfg, embed_dim, memory_index, q_noise, qn_block_size):
        return cls(embed_dim, cfg.decoder.attention_heads, cfg.encoder.embed_dim, cfg.attention_dropout,
                   memory_index, q_noise, qn_block_size)

    def split_heads(self, x: Tensor) -> Tensor:
        """B x L x D -> B x H x L x D/H"""
        return x.view(x.size(0), x.size(1), self.num_heads, self.head_dim).transpose(1, 2)

    def project_memory(self, contexts: Tensor) -> Dict[str, Tensor]:
        return {"key": self.split_heads(self.k_proj(contexts)),
                "value": self.split_heads(self.v_proj(contexts))}

    def read(self, query: Tensor, cache: Dict[str, Tensor]) -> Tuple[Tensor, Tensor]:
        q = self.split_heads(self.q_proj(query) * self.scaling)
        scores = torch.matmul(q, cache["key"].transpose(2, 3))  # B x H x T' x K
        weights = F.softmax(scores.float(), dim=-1).type_as(scores)
        out = torch.matmul(self.dropout_module(weights), cache["value"])  # B x H x T' x D/H
        out = out.transpose(1, 2).reshape(query.size(0), query.size(1), self.embed_dim)
        return self.out_proj(out), weights

    def memory_shape(self, rows, width="memory_rows"):
        return [rows, self.num_heads, width, self.head_dim]

    def onnx_project(self, g, contexts, bias=True):
        return {part: g.split_heads(g.linear(contexts, proj, bias=bias), self.num_heads, self.head_dim)
                for part, proj in (("key", self.k_proj), ("value", self.v_proj))}

    def onnx_project_states(self, g, states):
        return self.onnx_project(g, states, bias=False)

    def onnx_read(self, g, x, memory, short=None):
        q = g.op("Mul", g.linear(x, self.q_proj), g.const(self.scaling))
        if short is None:
            q = self.query_heads(g, q, g.dims(memory["value"], 0, 1), g.const([-1], np.int64))
            out, weights = g.attend(q, memory["key"], memory["value"])
        else:  # the short sources' hypotheses first, the others' after them
            q_short, q_other = short.split(g, q)
            out_short, weights_short = self.onnx_attend_states(
                g, self.query_heads(g, q_short, short.rows, short.group), short)
            out_other, weights_other = g.attend(self.query_heads(g, q_other, short.other_rows, short.group),
                                                memory["key"], memory["value"])
            out = g.op("Concat", out_short, out_other, axis=0)
            weights = g.op("Concat", weights_short, weights_other, axis=0)
        out = g.op("Reshape", g.op("Transpose", out, perm=[0, 2, 1, 3]), g.const([-1, self.embed_dim], np.int64))
        return g.linear(out, self.out_proj), g.op("ReduceMean", weights, axes=[1], keepdims=0)

    def query_heads(self, g, q: str, rows: str, group: str) -> str:
        """R G x D -> R x H x G x D/H (``group`` given: ONNX cannot infer it for R = 0)."""
        shape = g.op("Concat", rows, group, g.const([self.num_heads, self.head_dim], np.int64), axis=0)
        return g.op("Transpose", g.op("Reshape", q, shape), perm=[0, 2, 1, 3])

    def onnx_attend_states(self, g, q, short):
        """g.attend over the K rows alpha^T H W^T + b, from H W^T (R x H x S x D/H): the scores
        (q W_k H^T) alpha, less q b_k, the same for every row, which the softmax ignores; the output
        (w alpha^T) H W_v^T + b_v, as the weights sum to 1. The heads and queries of a source go
        through alpha together (R products, not R x H)."""
        alpha, alpha_t = short.alpha_rows(g)
        key, value = short.memory["key"], short.memory["value"]
        queries, width, k = g.dims(q, 0, 3), g.dims(key, 2, 3), g.dims(alpha, 2, 3)
        heads_queries = g.op("Mul", g.const([self.num_heads], np.int64), short.group)
        by_source = g.op("Concat", short.rows, heads_queries, width, axis=0)  # R x HG x S
        states = g.op("Reshape", g.op("MatMul", q, g.op("Transpose", key, perm=[0, 1, 3, 2])), by_source)
        scores = g.op("Reshape", g.op("MatMul", states, alpha), g.op("Concat", queries, k, axis=0))
        weights = g.op("Softmax", scores, axis=-1)  # R x H x G x K
        through = g.op("MatMul", g.op("Reshape", weights, g.op("Concat", short.rows, heads_queries, k, axis=0)),
                       alpha_t)  # R x HG x S
        out = g.op("MatMul", g.op("Reshape", through, g.op("Concat", queries, width, axis=0)), value)
        if self.v_proj.bias is not None:
            out = g.op("Add", out, g.weight(self.v_proj.bias.reshape(self.num_heads, 1, self.head_dim), "value_bias"))
        return out, weights


class MixRead(MemoryRead, MemoryMix):
    """``--memory-read mix``: the paper's decoder side (Eq. 6-7, :class:`memory.MemoryMix`),
    per layer, with the layer's input h to its encoder-attention as the decoder state:

        beta = score(W_beta h) in R^K,   c = sum_k beta_k C_k,   output W_o c + b_o

    How c enters the layer: in place of the encoder-attention's output, so it
    goes through the layer's own dropout, residual connection and layer norm,
    exactly where fairseq adds the attention context. Like the attention's
    out_proj, W_o maps the memory (encoder size) into the decoder's residual
    stream, which lets every layer use a shared memory in its own way and
    allows different encoder and decoder sizes. Since W_o (beta C) = beta (C W_o^T),
    C W_o^T is computed once per source and a step costs O(K D), not O(D^2).

    As the attention read: --attention-dropout drops entries of beta in
    training (the returned weights are beta before dropout), and quant-noise
    (--quant-noise-pq) wraps W_beta and W_o.
    """

    name = "mix"
    memory_parts = ("value",)

    def __init__(self, embed_dim, memory_dim, config: MemoryConfig, memory_index, dropout=0.0, q_noise=0.0,
                 qn_block_size=8):
        MemoryMix.__init__(self, embed_dim, config)
        self.init_incremental_state()  # FairseqIncrementalState's, which the call above skips
        self.memory_index = memory_index
        self.dropout_module = FairseqDropout(dropout, module_name=self.__class__.__name__)
        self.W_beta = quant_noise(self.W_beta, q_noise, qn_block_size)
        self.out_proj = quant_noise(nn.Linear(memory_dim, embed_dim), q_noise, qn_block_size)
        nn.init.xavier_uniform_(self.out_proj.weight)
        nn.init.zeros_(self.out_proj.bias)

    @classmethod
    def from_config(cls, cfg, embed_dim, memory_index, q_noise, qn_block_size):
        return cls(embed_dim, cfg.encoder.embed_dim, MemoryConfig.from_options(cfg), memory_index, cfg.attention_dropout, q_noise,
                   qn_block_size)

    def project_memory(self, contexts: Tensor) -> Dict[str, Tensor]:
        # C W_o^T (B x K x D), through out_proj itself so that its quant-noise
        # applies; its bias is added once per output in read.
        return {"value": self.out_proj(contexts) - self.out_proj.bias}

    def read(self, query: Tensor, cache: Dict[str, Tensor]) -> Tuple[Tensor, Tensor]:
        beta = self.read_weights(query)  # Eq. 7
        out = self.mix(self.dropout_module(beta), cache["value"]).type_as(query) + self.out_proj.bias  # Eq. 6
        return out, beta.unsqueeze(1)

    def memory_shape(self, rows, width="memory_rows"):
        return [rows, width, self.out_proj.weight.shape[0]]

    def onnx_project(self, g, contexts):
        return {"value": g.linear(contexts, self.out_proj, bias=False)}

    def onnx_project_states(self, g, states):
        return self.onnx_project(g, states)

    def onnx_read(self, g, x, memory, short=None):
        out, beta = self.onnx_mix(g, x, memory["value"], short, short and short.memory["value"])
        return g.op("Add", out, g.weight(self.out_proj.bias, "b_o")), beta


READS = {read.name: read for read in (AttentionRead, MixRead)}
