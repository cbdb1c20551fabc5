"""LSTM encoder-decoder with a pluggable attention, registered with fairseq.

Laid out like fairseq's own ``fairseq/models/lstm.py``: a model class that
reads the command line, an encoder, an incremental decoder, and named
architectures that fill in defaults. The attention (``modules/attention.py``)
is shared by both halves: the encoder builds its memory once per source, the
decoder looks it up at every step.
"""

import argparse
import logging

import torch
from fairseq.models import (
    ARCH_CONFIG_REGISTRY,
    FairseqEncoder,
    FairseqEncoderDecoderModel,
    FairseqIncrementalDecoder,
    register_model,
    register_model_architecture,
)
from fairseq.modules import FairseqDropout
from torch import Tensor, nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from ..errors import UserError
from ..hub import MemAttnHubModel
from ..modules.attention import ATTENTION_TYPES, LSTM_MEMORY_READS, MemoryAttention, build_attention
from ..modules.beam_sharing import select_shared_rows
from ..modules.numerics import check_positive_integer
from ..checkpoint_fit import check_family, check_lstm_fits, parameters_said_by_name
from ..arg_types import positive_int, probability_below_one
from .memory_options import (ALIGNMENT_CRITERION, add_memory_args, check_alignment_distribution,
                             check_all_embeddings_shared, fill_position_max_len, memory_defaults,
                             trains_alignment, warn_ignored_decoder_score)

logger = logging.getLogger(__name__)

DEFAULT_MAX_POSITIONS = 1024
NO_ALIGNMENT = ("--print-alignment needs an attention to align with, but this model was "
                "trained with --attention-type none")


def tokens_first(padding_mask: Tensor) -> Tensor:
    """For each row, the positions of its tokens in order, then those of its
    padding: the permutation that moves a row's padding to its end, whichever
    side (or sides) it was on (padding_mask is B x S, True at padding)."""
    return torch.argsort(padding_mask.to(torch.uint8), dim=1, stable=True)


def Embedding(dictionary, embed_dim):
    """Token embeddings initialised as fairseq's LSTM does (uniform, zero padding)."""
    embedding = nn.Embedding(len(dictionary), embed_dim, padding_idx=dictionary.pad())
    nn.init.uniform_(embedding.weight, -0.1, 0.1)
    nn.init.zeros_(embedding.weight[dictionary.pad()])
    return embedding


class LSTM(nn.LSTM):
    """``nn.LSTM`` that also runs under CPU bfloat16 autocast on any x86 CPU.

    torch picks oneDNN for a CPU LSTM from the dtype of its input alone. Under
    autocast a float32 input therefore reaches oneDNN with bfloat16 weights,
    which fails on CPUs without native bfloat16 (AVX2 only) with "could not
    create a primitive descriptor for the LSTM forward propagation primitive".
    Casting the input to the autocast dtype first, as autocast itself would,
    makes torch check the CPU and use its own kernel where oneDNN has none.
    """

    def forward(self, input, hx=None):
        if self.weight_ih_l0.device.type == "cpu" and torch.is_autocast_enabled("cpu"):
            dtype = torch.get_autocast_dtype("cpu")
            input = input.to(dtype)
            hx = None if hx is None else tuple(t.to(dtype) for t in hx)
        return super().forward(input, hx)


class MemAttnEncoder(FairseqEncoder):
    """Bidirectional multi-layer LSTM; returns the attention's memory, not the states.

    ``encoder_out`` is a dict of batch-first tensors:
      * ``memory``: what the attention built from the states (see modules/attention.py);
      * ``final_state``: B x 4H, the top layer's last h and c in both
        directions, from which the decoder starts;
      * ``group``: how many consecutive decoder rows share each row above.
    For memory attention nothing here grows with |S|, so beam search, which
    reorders ``encoder_out`` at every step, never copies the encoder states;
    and since all hypotheses of a source share its row (:func:`share_rows`),
    it does not copy the memory either.
    """

    def __init__(self, dictionary, embed_dim, hidden_size, num_layers, dropout, attention,
                 max_source_positions=DEFAULT_MAX_POSITIONS):
        super().__init__(dictionary)
        self.padding_idx = dictionary.pad()
        self.max_source_positions = max_source_positions
        self.embed_tokens = Embedding(dictionary, embed_dim)
        # on the input of every cell; fairseq's, so that --retain-dropout reaches it
        self.dropout = FairseqDropout(dropout, module_name=type(self).__name__)
        self.lstm = LSTM(embed_dim, hidden_size, num_layers, batch_first=True,
                         dropout=dropout if num_layers > 1 else 0.0, bidirectional=True)
        self.final_state_dim = 4 * hidden_size
        self.attention = attention

    def forward(self, src_tokens: Tensor, src_lengths: Tensor):
        padding_mask = src_tokens.eq(self.padding_idx)
        lengths = (~padding_mask).sum(dim=1)
        # The LSTM reads each sentence from position 0. Which side a row is padded
        # on is the command's choice, not the model's (fairseq-interactive pads
        # left, fairseq-generate as its own --left-pad-source says), so each row's
        # tokens are moved to its front as its padding mask shows, and the states
        # are put back afterwards: states and alignments then line up with
        # src_tokens in whatever layout it came (fairseq #3625).
        order = tokens_first(padding_mask)
        x = self.dropout(self.embed_tokens(src_tokens.gather(1, order)))
        packed = pack_padded_sequence(x, lengths.cpu().clamp_min(1), batch_first=True,
                                      enforce_sorted=False)
        packed_out, (h_n, c_n) = self.lstm(packed)
        front_states, _ = pad_packed_sequence(packed_out, batch_first=True,
                                              total_length=src_tokens.size(1))
        # states[b, order[b, j]] = front_states[b, j]
        states = torch.zeros_like(front_states).scatter(
            1, order.unsqueeze(-1).expand_as(front_states), front_states)
        states = self.dropout(states)

        final_state = torch.cat([h_n[-2], h_n[-1], c_n[-2], c_n[-1]], dim=-1)
        return {
            "memory": self.attention.build_memory(states, padding_mask),
            "final_state": final_state,
            "group": 1,
        }

    def reorder_encoder_out(self, encoder_out, new_order):
        rows = {**encoder_out["memory"], "final_state": encoder_out["final_state"]}
        rows, group = select_shared_rows(rows, new_order, encoder_out["group"])
        final_state = rows.pop("final_state")
        return {"memory": rows, "final_state": final_state, "group": group}

    def max_positions(self):
        # fairseq filters, skips or refuses longer sources with this limit, so a
        # source beyond the position encodings' S never reaches them.
        covered = self.attention.writer.position_encoding_max_len if isinstance(self.attention, MemoryAttention) else None
        return self.max_source_positions if covered is None else min(self.max_source_positions, covered)


class MemAttnDecoder(FairseqIncrementalDecoder):
    """Multi-layer LSTM decoder; output layer softmax(W [h_i; c_i] + b) (Eq. 3).

    Without input feeding the LSTM runs over the whole target at once and all
    attention lookups are one batched call. With input feeding the previous
    context c_{i-1} is concatenated to the input at step i (as google/seq2seq,
    which the paper used), which forces a loop over time in training.

    With the attention mix the output layer is softmax(W_o tanh(W_m [h_i; c_i]) + b)
    instead: the "attentional hidden state" of Luong et al. (2015), which
    google/seq2seq's decoder ("attention_mix") and fairseq's lstm have. Eq. 3's
    logits are a sum of a term in h_i and a term in c_i; the tanh layer lets the
    decoder state decide what to take from the context. With
    share_input_output_embed, W_o is the embedding table (Press & Wolf, 2017),
    so the tanh layer has the embeddings' width.
    """

    def __init__(self, dictionary, embed_dim, hidden_size, num_layers, dropout, attention,
                 encoder_final_state_dim, input_feeding=False, attention_mix=False,
                 max_target_positions=DEFAULT_MAX_POSITIONS, embed_tokens=None,
                 share_input_output_embed=False):
        super().__init__(dictionary)
        self.hidden_size = hidden_size
        self.num_layers = num_layers
        self.max_target_positions = max_target_positions
        self.attention = attention
        context_dim = attention.context_dim
        self.input_feeding = input_feeding and context_dim > 0

        self.embed_tokens = embed_tokens if embed_tokens is not None else Embedding(dictionary, embed_dim)
        self.dropout = FairseqDropout(dropout, module_name=type(self).__name__)
        # The decoder starts from the encoder's final states ("bridge").
        self.bridge = nn.Linear(encoder_final_state_dim, 2 * num_layers * hidden_size)
        input_size = embed_dim + (context_dim if self.input_feeding else 0)
        self.lstm = LSTM(input_size, hidden_size, num_layers, batch_first=True,
                         dropout=dropout if num_layers > 1 else 0.0)
        if attention_mix and context_dim > 0:
            # Tied to the embeddings, the output layer reads embedding-sized vectors.
            mixed_dim = embed_dim if share_input_output_embed else hidden_size
            self.attention_mix = nn.Linear(hidden_size + context_dim, mixed_dim)
            self.output_projection = nn.Linear(mixed_dim, len(dictionary))
        else:
            self.attention_mix = None
            self.output_projection = nn.Linear(hidden_size + context_dim, len(dictionary))  # Eq. 3
        if share_input_output_embed:
            self.output_projection.weight = self.embed_tokens.weight  # sizes checked by check_sharing

    @property
    def need_attn(self) -> bool:
        """Whether forward() returns alignments (B x T x S, fairseq's "attn").

        As in fairseq's LSTMDecoder they are there by default in eval mode, so
        callers such as SequenceGeneratorWithAlignment get them without asking,
        but not in training mode unless guided alignment's criterion, the only
        one that reads them, is trained (build_model switches them on): for memory
        attention they cost an extra B x T x K x S product (beta x alpha^T,
        Sec. 5) that the fixed-size memory otherwise avoids. fairseq-generate
        and fairseq-interactive switch them on or off through
        make_generation_fast_ (--print-alignment). The flag lives in the
        attention, which both halves share: the encoder keeps alpha for it.
        """
        return self.attention.keep_alignment

    @need_attn.setter
    def need_attn(self, value: bool) -> None:
        self.attention.keep_alignment = value

    def initial_state(self, encoder_out):
        init = torch.tanh(self.bridge(encoder_out["final_state"]))
        init = init.repeat_interleave(encoder_out["group"], dim=0)  # one row per hypothesis
        bsz = init.size(0)
        h0, c0 = init.view(bsz, 2, self.num_layers, self.hidden_size).permute(1, 2, 0, 3)
        state = {"h": h0.contiguous(), "c": c0.contiguous()}
        if self.input_feeding:
            state["context"] = init.new_zeros(bsz, self.attention.context_dim)
        return state

    def forward(self, prev_output_tokens, encoder_out, incremental_state=None, **kwargs):
        features, attn = self.extract_features(prev_output_tokens, encoder_out, incremental_state)
        return self.output_layer(features), {"attn": [attn]}

    def extract_features(self, prev_output_tokens, encoder_out, incremental_state=None):
        state = None
        if incremental_state is not None:
            prev_output_tokens = prev_output_tokens[:, -1:]
            state = self.get_incremental_state(incremental_state, "state")
        if state is None:
            state = self.initial_state(encoder_out)
        x = self.dropout(self.embed_tokens(prev_output_tokens))

        if self.input_feeding:
            hidden, context, attn, state = self._run_with_input_feeding(x, encoder_out, state)
        else:
            hidden, (h, c) = self.lstm(x, (state["h"], state["c"]))
            state = {"h": h, "c": c}
            context, attn = self.lookup(encoder_out, hidden)

        if incremental_state is not None:
            self.set_incremental_state(incremental_state, "state", state)
        features = hidden if context is None else torch.cat([hidden, context], dim=-1)
        return self.dropout(features), (attn if self.need_attn else None)

    def lookup(self, encoder_out, hidden):
        """The attention's lookup for B*group x T queries in B rows of memory:
        the hypotheses sharing a row are looked up as extra query steps. The
        context comes back in float32 for a half-precision model (modules/attention.py)
        and continues in the decoder's precision."""
        group = encoder_out["group"]
        rows, steps = hidden.size(0) // group, hidden.size(1)
        context, attn = self.attention.lookup(encoder_out["memory"],
                                              hidden.reshape(rows, group * steps, -1))

        def per_hypothesis(t):
            return None if t is None else t.reshape(rows * group, steps, -1)

        context = None if context is None else context.to(hidden.dtype)
        return per_hypothesis(context), per_hypothesis(attn)

    def _run_with_input_feeding(self, x, encoder_out, state):
        hiddens, contexts, attns = [], [], []
        h, c, context = state["h"], state["c"], state["context"]
        for step in range(x.size(1)):
            step_input = torch.cat([x[:, step : step + 1], context.unsqueeze(1)], dim=-1)
            hidden, (h, c) = self.lstm(step_input, (h, c))
            step_context, step_attn = self.lookup(encoder_out, hidden)
            context = step_context.squeeze(1)
            hiddens.append(hidden)
            contexts.append(step_context)
            attns.append(step_attn)
        attn = None if attns[0] is None else torch.cat(attns, dim=1)
        new_state = {"h": h, "c": c, "context": context}
        return torch.cat(hiddens, dim=1), torch.cat(contexts, dim=1), attn, new_state

    def output_layer(self, features):
        if self.attention_mix is not None:
            features = torch.tanh(self.attention_mix(features))
        return self.output_projection(features)

    def reorder_incremental_state(self, incremental_state, new_order):
        state = self.get_incremental_state(incremental_state, "state")
        if state is None:
            return
        reordered = {
            name: tensor.index_select(1 if name in ("h", "c") else 0, new_order)
            for name, tensor in state.items()
        }
        self.set_incremental_state(incremental_state, "state", reordered)

    def max_positions(self):
        return self.max_target_positions

    def make_generation_fast_(self, need_attn=False, **kwargs):
        if need_attn and self.attention.context_dim == 0:
            raise UserError(NO_ALIGNMENT)
        # fairseq passes print_alignment itself, None when it is not given: that is a "no".
        self.need_attn = bool(need_attn)


@register_model("memattn_lstm")
class MemAttnLSTMModel(MemAttnHubModel, FairseqEncoderDecoderModel):
    """LSTM seq2seq with fixed-size memory attention or one of its baselines."""

    @staticmethod
    def add_args(parser):
        for option, meaning in (("--encoder-embed-dim", "source token embedding size"),
                                ("--encoder-hidden-size", "units per direction of the bidirectional encoder"),
                                ("--encoder-layers", "number of bidirectional encoder LSTM layers"),
                                ("--decoder-embed-dim", "target token embedding size"),
                                ("--decoder-hidden-size", "units of each decoder LSTM layer"),
                                ("--decoder-layers", "number of decoder LSTM layers")):
            parser.add_argument(option, type=positive_int, metavar="N", help=meaning)
        parser.add_argument("--dropout", type=probability_below_one, metavar="P",
                            help="dropout on the input of every LSTM cell and on the output layer")
        parser.add_argument("--input-feeding", action="store_true",
                            help="feed the previous context into the decoder input")
        parser.add_argument("--attention-mix", action="store_true",
                            help="output layer softmax(W_o tanh(W_m [h; c])) instead of Eq. 3's "
                                 "softmax(W [h; c]): Luong et al.'s attentional hidden state, as in "
                                 "google/seq2seq (the paper's implementation) and fairseq's lstm")
        parser.add_argument("--share-decoder-input-output-embed", action="store_true",
                            help="tie the output layer's weights to the decoder's embeddings; needs "
                                 "--attention-mix (its tanh layer then has --decoder-embed-dim units), "
                                 "or with --attention-type none a --decoder-hidden-size equal to "
                                 "--decoder-embed-dim")
        parser.add_argument("--share-all-embeddings", action="store_true",
                            help="one embedding table for the encoder, the decoder and the output layer "
                                 "(implies --share-decoder-input-output-embed); needs a joined "
                                 "dictionary and --encoder-embed-dim equal to --decoder-embed-dim")
        parser.add_argument("--attention-type", choices=ATTENTION_TYPES,
                            help="the decoder's attention: memory (the paper's fixed-size memory, "
                                 "Sec. 3), one over all encoder states (additive, general, dot, "
                                 "scaled_dot: Eq. 1-2), de Brebisson & Vincent's linear or "
                                 "gated_linear, or none")
        parser.add_argument("--attention-dim", type=positive_int, metavar="N",
                            help="hidden size of additive attention (default: decoder hidden size)")
        add_memory_args(parser)
        parser.add_argument("--memory-read", choices=LSTM_MEMORY_READS,
                            help="how the decoder reads the K memory rows: the paper's mix c = beta C "
                                 "with beta from the decoder state alone (Eq. 6-7), or attention over "
                                 "the rows (Eq. 1-2 with the rows in place of the source states): "
                                 "additive (attention; --attention-dim its size) or bilinear, h^T W C_k "
                                 "(general: as fast as the mix) (default: mix)")
        parser.add_argument("--max-source-positions", type=positive_int, metavar="N",
                            help="longest source in tokens (EOS included) the model accepts")
        parser.add_argument("--max-target-positions", type=positive_int, metavar="N",
                            help="longest target in tokens (EOS included) the model generates")

    @classmethod
    def build_model(cls, args, task):
        base_architecture(args)
        check_sizes(args)
        alignment = trains_alignment(args, task)
        if alignment and args.attention_type in ("none", "linear", "gated_linear"):
            raise UserError(f"--criterion {ALIGNMENT_CRITERION} trains each target token's attention as a "
                            f"distribution over the source, which --attention-type {args.attention_type} does not "
                            f"give (none has no attention, linear's weights have any sign): use memory, additive, "
                            f"general, dot or scaled_dot")
        if alignment and args.attention_type == "memory":
            check_alignment_distribution(args)
        if args.attention_type == "memory":
            fill_position_max_len(args, task)
        encoder_dim = 2 * args.encoder_hidden_size
        attention = build_attention(args, encoder_dim, args.decoder_hidden_size)
        warn_ignored_options(args, attention.context_dim)
        check_sharing(args, task, attention.context_dim)
        encoder = MemAttnEncoder(
            task.source_dictionary, args.encoder_embed_dim, args.encoder_hidden_size,
            args.encoder_layers, args.dropout, attention,
            max_source_positions=args.max_source_positions,
        )
        decoder = MemAttnDecoder(
            task.target_dictionary, args.decoder_embed_dim, args.decoder_hidden_size,
            args.decoder_layers, args.dropout, attention, encoder.final_state_dim,
            input_feeding=args.input_feeding, attention_mix=args.attention_mix,
            max_target_positions=args.max_target_positions,
            embed_tokens=encoder.embed_tokens if args.share_all_embeddings else None,
            share_input_output_embed=args.share_decoder_input_output_embed,
        )
        model = cls(encoder, decoder)
        if alignment:
            model.alignment_switch.keep_alignment = True  # in training too: the criterion's loss reads them
        return model

    @property
    def alignment_switch(self):
        return self.decoder.attention

    def __prepare_scriptable__(self):
        # torch.jit.script calls this first, also for a SequenceGenerator over the model.
        raise NotImplementedError(
            "lstm_memattn cannot be scripted with TorchScript: its encoder_out carries the attention's "
            "memory as a dict whose keys depend on --attention-type; run it eagerly (transformer_memattn "
            "scripts, also inside SequenceGenerator)")

    @property
    def full_context_alignment(self) -> bool:
        """Read by fairseq's SequenceGeneratorWithAlignment (and nothing else in
        fairseq) before it reads the hypotheses' alignments: a model without
        attention stops it here with a clear message instead of an IndexError
        on the alignment it does not have. Ours come from decoding, as fairseq's
        LSTM's do."""
        if self.decoder.attention.context_dim == 0:
            raise UserError(NO_ALIGNMENT)
        return False

    def load_state_dict(self, state_dict, strict=True, model_cfg=None, args=None):
        self.upgrade_state_dict(state_dict)  # older parameter names, before they are compared
        check_family(state_dict, self.state_dict())
        if strict:
            check_lstm_fits(state_dict, self.state_dict())
        with parameters_said_by_name():
            return super().load_state_dict(state_dict, strict, model_cfg, args)


def check_sizes(args):
    for name in ("encoder_embed_dim", "encoder_hidden_size", "encoder_layers",
                 "decoder_embed_dim", "decoder_hidden_size", "decoder_layers",
                 "max_source_positions", "max_target_positions"):  # the memory's: MemoryConfig
        check_positive_integer(f"--{name.replace('_', '-')}", getattr(args, name))
    if not 0.0 <= args.dropout < 1.0:
        raise UserError(f"invalid --dropout: {args.dropout!r} (must be in [0, 1))")


def warn_ignored_options(args, context_dim) -> None:
    """Options the chosen attention has no use for: trained without them, said once."""
    without_context = [flag for flag, given in (("--input-feeding", args.input_feeding),
                                                ("--attention-mix", args.attention_mix)) if given]
    if context_dim == 0 and without_context:
        logger.warning(f"{' and '.join(without_context)} ignored: --attention-type {args.attention_type} gives "
                       f"the decoder no context to feed or mix")
    memory_read = args.memory_read if args.attention_type == "memory" else None
    if args.attention_dim is not None and args.attention_type != "additive" and memory_read != "attention":
        logger.warning(f"--attention-dim {args.attention_dim} ignored: only additive attention has a layer of that "
                       f"size (--attention-type additive, or memory with --memory-read attention; this model: "
                       f"--attention-type {args.attention_type}"
                       + (f" --memory-read {memory_read})" if memory_read else ")"))
    if memory_read is not None:
        warn_ignored_decoder_score(args)
    memory_flags = memory_options_set(args) if args.attention_type != "memory" else []
    if memory_flags:
        logger.warning(f"{', '.join(memory_flags)} ignored: only --attention-type memory has a memory "
                       f"(this model: --attention-type {args.attention_type})")


def memory_options_set(args):
    """The --memory-* options ARGS sets away from its architecture's defaults (fairseq-train's
    --arch, fairseq-hydra-train's _name), written as given; a feature switched off is no loss."""
    defaults = argparse.Namespace()
    arch = getattr(args, "arch", None) or getattr(args, "_name", None)
    ARCH_CONFIG_REGISTRY.get(arch, base_architecture)(defaults)
    flags = []
    for name, default in vars(defaults).items():
        value = getattr(args, name, default)
        if name.startswith("memory_") and value != default and value is not False:
            flag = "--" + name.replace("_", "-")
            flags.append(flag if value is True else f"{flag} {value}")
    return flags


def check_sharing(args, task, context_dim):
    """The sizes and dictionaries that --share-all-embeddings and
    --share-decoder-input-output-embed need; the first implies the second, as in
    fairseq's transformer."""
    check_all_embeddings_shared(args, task)
    if args.share_all_embeddings:
        args.share_decoder_input_output_embed = True
    if not args.share_decoder_input_output_embed:
        return
    flag = "--share-all-embeddings" if args.share_all_embeddings else "--share-decoder-input-output-embed"
    if context_dim > 0 and not args.attention_mix:
        raise UserError(
            f"{flag} ties the output layer to the decoder's embeddings ({args.decoder_embed_dim} units), "
            f"but Eq. 3's output layer reads [h; c] ({args.decoder_hidden_size} + {context_dim} units): "
            f"add --attention-mix, whose tanh layer then gives it {args.decoder_embed_dim}")
    if context_dim == 0 and args.decoder_hidden_size != args.decoder_embed_dim:
        raise UserError(
            f"{flag} ties the output layer to the decoder's embeddings, and without attention it reads "
            f"the decoder's state: --decoder-hidden-size ({args.decoder_hidden_size}) must equal "
            f"--decoder-embed-dim ({args.decoder_embed_dim})")


@register_model_architecture("memattn_lstm", "lstm_memattn")
def base_architecture(args):
    """The paper's copy-task setup (Sec. 4.1): 2x256 bi-LSTM encoder, 2x256
    decoder, 256-d embeddings, dropout 0.2, memory attention with K = 32."""
    args.encoder_embed_dim = getattr(args, "encoder_embed_dim", 256)
    args.encoder_hidden_size = getattr(args, "encoder_hidden_size", 256)
    args.encoder_layers = getattr(args, "encoder_layers", 2)
    args.decoder_embed_dim = getattr(args, "decoder_embed_dim", 256)
    args.decoder_hidden_size = getattr(args, "decoder_hidden_size", 256)
    args.decoder_layers = getattr(args, "decoder_layers", 2)
    args.dropout = getattr(args, "dropout", 0.2)
    args.input_feeding = getattr(args, "input_feeding", False)
    args.attention_mix = getattr(args, "attention_mix", False)
    args.share_decoder_input_output_embed = getattr(args, "share_decoder_input_output_embed", False)
    args.share_all_embeddings = getattr(args, "share_all_embeddings", False)
    args.attention_type = getattr(args, "attention_type", "memory")
    args.attention_dim = getattr(args, "attention_dim", None)
    memory_defaults(args, memory_k=32, position_encoding=False)
    args.memory_read = getattr(args, "memory_read", "mix")
    args.max_source_positions = getattr(args, "max_source_positions", DEFAULT_MAX_POSITIONS)
    args.max_target_positions = getattr(args, "max_target_positions", DEFAULT_MAX_POSITIONS)


@register_model_architecture("memattn_lstm", "lstm_memattn_wmt")
def wmt_architecture(args):
    """The paper's WMT setup (Sec. 4.2): 512 units and embeddings, K = 64,
    position encodings, a sigmoid encoder score and a softmax decoder score (the
    configuration of Fig. 4; softmax/softmax "consistently performs badly",
    Sec. 4.2)."""
    for name in ("encoder_embed_dim", "encoder_hidden_size",
                 "decoder_embed_dim", "decoder_hidden_size"):
        setattr(args, name, getattr(args, name, 512))
    args.memory_k = getattr(args, "memory_k", 64)
    args.memory_position_encoding = getattr(args, "memory_position_encoding", True)
    args.memory_encoder_score = getattr(args, "memory_encoder_score", "sigmoid")
    base_architecture(args)


def _baseline(name, attention_type, doc):
    def architecture(args):
        args.attention_type = getattr(args, "attention_type", attention_type)
        base_architecture(args)

    architecture.__doc__ = doc
    register_model_architecture("memattn_lstm", name)(architecture)


_baseline("lstm_att", "additive", "Standard (Bahdanau) attention baseline, copy-task sizes.")
_baseline("lstm_noatt", "none", "No-attention baseline, copy-task sizes.")
_baseline("lstm_linatt", "linear", "Cheap linear attention (de Brebisson & Vincent), copy-task sizes.")
