"""Beam search over a model exported by ``fairseq-memattn-export``, on ONNX Runtime.

``Translator(folder)`` runs the exported encoder on each batch's sources and the
decoder step once per output position, with fairseq's beam search
(``SequenceGenerator``: the same candidates, finalisation, length penalty,
``--min-len``, ``--max-len-a/b``, ``--unkpen``, ``--nbest``), so on float32
it returns the hypotheses and scores (natural log) of fairseq's
SequenceGenerator run on each source alone. What the encoder derives from a
source (the memory, projected once per source) stays at one row per source
for all its hypotheses, as ``modules/beam_sharing.py`` keeps it in fairseq;
only the decoder's own state is reordered per hypothesis: the LSTM's h and c,
or for the Transformer each hypothesis's list of slots in a self-attention
cache (``SelfAttentionCache``). The first step decodes one row per source, as
a source's hypotheses all start alike, and its state then stands for each of
them. The log-probabilities stay in the graph: it
ends in the beam search's choice of candidates (export/search.py), and the
translator keeps the hypotheses.

Alignments (``alignment=True``): the soft alignment of target step i over the
source is beta_i alpha^T (Sec. 5), beta_i the read weights of the last decoder
layer over the K rows and alpha the write weights of Eq. 4-5; the hard one
takes each target token's most attended source token, as fairseq's
``utils.extract_hard_alignment``.

The parts: config.py (config.json), dictionary.py, graphs.py (the sessions, checked at load),
search.py (the beam search), decoder.py and cache.py (the decoder step's state), batching.py.
Needs numpy and onnxruntime only: neither torch nor fairseq.
"""

import os
from concurrent.futures import ThreadPoolExecutor
from typing import Dict, List, Optional

import numpy as np

from ..errors import UserError
from .batching import batches_by_tokens, padded, spread
from .config import check_symbols, config_path, read_config
from .decoder import DecoderRun
from .dictionary import Dictionary
from .exceptions import ModelFolderError, SourceError, SourceTooLong
from .graphs import check_graphs, default_session_options, load_session, require_onnxruntime
from .search import BeamSearch


class Translator:
    """Beam search over an exported model; see the module docstring. The folder is checked whole
    here (config.json, the dictionaries' format and sizes, the graphs' inputs and outputs): a
    folder whose parts do not fit raises ModelFolderError naming the file."""

    # padded source tokens per encoder run: the self-attention's scores grow with rows x |S|^2,
    # and smaller runs stay in cache
    encoder_tokens_per_run = 8192

    def __init__(self, folder: str, threads: Optional[int] = None, providers=None, session_options=None):
        """``session_options``: ONNX Runtime's SessionOptions for both graphs (profiling, say),
        instead of the default: ``threads`` intra-op threads and every graph optimization."""
        self.ort = ort = require_onnxruntime()
        self.config = c = read_config(folder)
        self.src_dict = Dictionary(os.path.join(folder, "dict.source.txt"))
        self.tgt_dict = Dictionary(os.path.join(folder, "dict.target.txt"))
        check_symbols(c, config_path(folder), len(self.src_dict), len(self.tgt_dict))
        options = session_options if session_options is not None else default_session_options(threads)
        providers = providers or ["CPUExecutionProvider"]
        self.encoder = load_session(ort, os.path.join(folder, "encoder.onnx"), options, providers)
        self.decoder = load_session(ort, os.path.join(folder, "decoder.onnx"), options, providers)
        check_graphs(self.encoder, self.decoder, c, folder, len(self.src_dict), len(self.tgt_dict))
        spm = os.path.join(folder, "spm.model")
        if os.path.exists(spm) and not os.path.isfile(spm):
            raise ModelFolderError(f"{spm}: not a file (the folder's sentencepiece model, where it has one)")
        self.sentencepiece_model = spm if os.path.isfile(spm) else None
        self.pad, self.eos, self.unk = c["pad"], c["eos"], c["unk"]

    # --- each source's limits ----------------------------------------------------------

    def max_len(self, source_len, max_len_a: float, max_len_b: int):
        """fairseq's max_len_a * |x| + max_len_b (|x| counts EOS), within the decoder's positions;
        |x| is the source's own length, as SequenceGenerator has it for a batch of one."""
        most = self.config["max_target_positions"] - 1
        # in float64 and capped before the cast: a huge a or b is the model's maximum, not an int64 overflow
        with np.errstate(over="ignore"):  # a beyond float64 times |x| is inf, capped as well
            limit = max_len_a * np.asarray(source_len, np.float64) + min(max_len_b, most)
        return np.minimum(limit, most).astype(np.int64)

    def check_source(self, source: List[int], max_len_a: float = 0.0, max_len_b: int = 200, min_len: int = 1,
                     max_tokens: Optional[int] = None) -> None:
        """Raises SourceTooLong or SourceError for a source (token ids ending in EOS) these limits
        cannot translate, or that holds the padding symbol."""
        symbols, eos = len(self.src_dict), self.config["source_eos"]
        if len(source) == 0 or source[-1] != eos:
            raise SourceError(f"it does not end in EOS (id {eos}): end each source with it, as fairseq's "
                              f"Dictionary.encode_line does")
        outside = next(((position, token) for position, token in enumerate(source, start=1)
                        if not 0 <= token < symbols), None)
        if outside is not None:  # ONNX Runtime's Gather would wrap a negative id round to another word
            raise SourceError(f"token {outside[0]} is id {outside[1]}, outside the source dictionary's "
                              f"0 to {symbols - 1}")
        pad = self.config["source_pad"]
        padding = next((position for position, token in enumerate(source, start=1) if token == pad), None)
        if padding is not None:  # the batches' padding is told from the tokens by this id
            raise SourceError(f"token {padding} is the padding symbol {self.src_dict.symbols[pad]!r}, "
                              f"which is not a word: remove it")
        limit = self.config["max_source_positions"]
        if len(source) > limit:
            raise SourceTooLong(f"{len(source)} tokens (EOS included), more than the model's maximum of {limit}")
        if max_tokens is not None and len(source) > max_tokens:
            raise SourceTooLong(f"{len(source)} tokens (EOS included), more than --max-tokens {max_tokens}")
        max_len = int(self.max_len(len(source), max_len_a, max_len_b))
        if min_len > max_len:
            raise SourceError(f"invalid --min-len: {min_len} (the maximum length for this source is "
                              f"{self.max_len_reason(max_len)})")

    def batch_max_lens(self, src_tokens: np.ndarray, max_len_a: float, max_len_b: int, min_len: int) -> np.ndarray:
        """Each source's maximum output length; SourceError where it is below ``min_len``."""
        max_lens = self.max_len((src_tokens != self.config["source_pad"]).sum(axis=1), max_len_a, max_len_b)
        if min_len > max_lens.min():
            row = int(max_lens.argmin())
            raise SourceError(f"invalid --min-len: {min_len} (the maximum length for source {row} is "
                              f"{self.max_len_reason(int(max_lens[row]))})")
        return max_lens

    def max_len_reason(self, max_len: int) -> str:
        """A maximum length, and what sets it: --max-len-a/b, or the model's positions."""
        if max_len == self.config["max_target_positions"] - 1:
            return f"{max_len}, the most the model's {self.config['max_target_positions']} target positions allow"
        return f"{max_len}: raise --max-len-a/--max-len-b"

    # --- the encoder, and the search over the decoder -----------------------------------

    def short_sources(self, src_tokens: np.ndarray) -> np.ndarray:
        """Which sources the exported encoder gives |S| memory rows rather than K: those shorter
        than config.json's short_source_rows (none without it)."""
        lengths = (src_tokens != self.config["source_pad"]).sum(axis=1)
        return lengths < self.config.get("short_source_rows", 0)

    def encode(self, src_tokens: np.ndarray) -> Dict[str, np.ndarray]:
        """The encoder's outputs for each source as if it ran alone: the sources of one length run
        together at their own width, at most ``encoder_tokens_per_run`` tokens a run, and outputs
        with a source axis are padded back to the batch's width (a short source's memory rows too:
        alpha is 0 at padding). Padding moves the float32 sums of the self-attention in their last
        bits, enough to tip an int8 rounding step, so that a sentence's int8 translation would
        depend on the batch. The sources are all short or all not (``generate`` encodes them apart)."""
        pad, width = self.config["source_pad"], src_tokens.shape[1]
        left = self.config["source_padding"] == "left"
        lengths = (src_tokens != pad).sum(axis=1)
        source_axes = ("src_len", "memory_rows") if self.short_sources(src_tokens).all() else ("src_len",)
        outputs = {o.name: next((o.shape.index(axis) for axis in source_axes if axis in o.shape), None)
                   for o in self.encoder.get_outputs()}
        encoded = {}
        for length in np.unique(lengths):
            rows = np.flatnonzero(lengths == length)
            tokens = src_tokens[rows][:, width - length:] if left else src_tokens[rows][:, :length]
            step = max(1, self.encoder_tokens_per_run // int(length))
            if step >= len(rows) == len(src_tokens) and length == width:  # one run of the whole batch, as it is
                return dict(zip(outputs, self.encoder.run(None, {"src_tokens": tokens})))
            for start in range(0, len(rows), step):
                run = self.encoder.run(None, {"src_tokens": tokens[start: start + step]})
                for (name, source_axis), value in zip(outputs.items(), run):
                    if name not in encoded:
                        shape = [len(src_tokens), *value.shape[1:]]
                        if source_axis is not None:
                            shape[source_axis] = width
                        encoded[name] = np.zeros(shape, value.dtype)
                    into = [rows[start: start + step]] + [slice(None)] * (value.ndim - 1)
                    if source_axis is not None:
                        into[source_axis] = slice(width - length, width) if left else slice(0, length)
                    encoded[name][tuple(into)] = value
        return encoded

    def generate(self, src_tokens: np.ndarray, beam: int = 5, lenpen: float = 1.0, max_len_a: float = 0.0,
                 max_len_b: int = 200, min_len: int = 1, unk_penalty: float = 0.0,
                 normalize_scores: bool = True, alignment: bool = False) -> List[List[dict]]:
        """Hypotheses (best first, ``beam`` of them) for a batch of padded
        sources (B x S int64, each ending in EOS), as SequenceGenerator.generate
        returns them for each source alone: dicts of tokens (EOS last), score,
        positional_scores (natural log) and, with ``alignment``, attention
        (T x |x|: every target token over its source's tokens) and alignment
        (hard pairs (source, target), EOS excluded). Each source's maximum length
        counts its own tokens, not the batch's padded width."""
        src_tokens = np.asarray(src_tokens, dtype=np.int64)
        beam = min(beam, len(self.tgt_dict) - 1)  # as SequenceGenerator clamps it
        short = self.short_sources(src_tokens)
        # Short sources first: the decoder step reads their hypotheses' rows through their |S| memory
        # rows, the others' through K rows, in one run.
        order = np.argsort(~short, kind="stable")
        src_tokens, first_long = src_tokens[order], int(short.sum())
        max_lens = self.batch_max_lens(src_tokens, max_len_a, max_len_b, min_len)
        # Columns of padding only go: a batch of short sources then holds no more memory rows than it needs
        # (int8: short sources at one width whatever the batch, at_short_width).
        sets = [self.padded_as_exported(tokens[:, (tokens != self.config["source_pad"]).any(axis=0)])
                for tokens in (src_tokens[:first_long], src_tokens[first_long:])]
        if self.config.get("quantize") == "int8" and self.config.get("short_source_rows"):
            sets[0] = self.at_short_width(sets[0])
        encoded = [self.encode(tokens) if len(tokens) else None for tokens in sets]
        search = BeamSearch(max_lens, beam, len(self.tgt_dict), self.eos, self.pad, self.unk, min_len=min_len,
                            lenpen=lenpen, unk_penalty=unk_penalty, normalize_scores=normalize_scores,
                            read_width=self.config["memory_k"] if alignment else None)
        decoder = DecoderRun(self.decoder, self.ort, self.config, encoded[1], len(src_tokens) * beam,
                             search.max_len + 1, short=encoded[0])
        finalized = search.run(decoder)
        if alignment:
            for tokens, outputs, start in zip(sets, encoded, (0, first_long)):
                alpha = outputs["alpha"][:, self.config["alignment_memory"]] if outputs is not None else []
                for row, (source, source_alpha) in enumerate(zip(tokens, alpha)):
                    self._align(finalized[start + row], source, source_alpha)
        in_order = [None] * len(finalized)
        for row, hypotheses in zip(order, finalized):
            in_order[row] = hypotheses
        return in_order

    def at_short_width(self, src_tokens: np.ndarray) -> np.ndarray:
        """Short sources left-padded to short_source_rows - 1 tokens, the longest a short source has,
        whatever the batch holds: ONNX Runtime's float products give a row other last bits beside
        more or fewer columns (seen with AVX-512), enough to tip an int8 rounding step, so that
        int8 answers would depend on the batch."""
        missing = self.config["short_source_rows"] - 1 - src_tokens.shape[1]
        return np.pad(src_tokens, ((0, 0), (missing, 0)), constant_values=self.config["source_pad"])

    def padded_as_exported(self, src_tokens: np.ndarray) -> np.ndarray:
        """The LSTM's exported encoder reads each row from its start: padding moved to the end."""
        if self.config["source_padding"] == "left":
            return np.ascontiguousarray(src_tokens)
        order = np.argsort(src_tokens == self.config["source_pad"], axis=1, kind="stable")
        return np.ascontiguousarray(np.take_along_axis(src_tokens, order, axis=1))

    def _align(self, hypotheses, src_tokens, alpha):
        """Sec. 5: attention = beta alpha^T over the source's own tokens; hard
        alignment as fairseq's extract_hard_alignment (EOS and padding excluded)."""
        own = src_tokens != self.config["source_pad"]
        alpha = alpha[own]  # |x| x K
        words = src_tokens[own] != self.config["source_eos"]
        for hypothesis in hypotheses:
            attention = hypothesis.pop("reads") @ alpha.T  # T x |x|
            hypothesis["attention"] = attention
            targets = np.flatnonzero((hypothesis["tokens"] != self.eos) & (hypothesis["tokens"] != self.pad))
            if len(targets) and words.any():
                masked = np.where(words, attention[targets], -np.inf)
                hypothesis["alignment"] = [(int(s), int(t)) for t, s in zip(targets, masked.argmax(axis=1))]
            else:
                hypothesis["alignment"] = []

    # --- batches of token ids, and raw text ------------------------------------------

    def translate_ids(self, sources: List[List[int]], max_tokens: Optional[int] = None,
                      batch_size: Optional[int] = None, workers: int = 1, **options) -> List[List[dict]]:
        """Hypotheses for each source (token ids ending in EOS), batched by
        length as fairseq does: sources sorted by length, batches of at most
        ``max_tokens`` padded source tokens and ``batch_size`` sources;
        ``workers`` batches decoded at once, each on the session's threads (a
        batch's small products keep one core busy better than several), the
        batches cut in halves where there are fewer than workers. A source's
        hypotheses do not depend on the other sources (float32 scores to their
        last digits: a product's rounding follows the batch's shape)."""
        for name, value in (("beam", options.get("beam", 1)), ("workers", workers), ("batch_size", batch_size),
                            ("max_tokens", max_tokens)):
            if value is not None and value < 1:
                raise UserError(f"invalid {name}: {value} (must be >= 1)")
        limits = {key: options[key] for key in ("max_len_a", "max_len_b", "min_len") if key in options}
        for i, source in enumerate(sources):
            try:
                self.check_source(source, max_tokens=max_tokens, **limits)
            except SourceError as error:
                raise type(error)(f"source {i}: {error}") from None

        def decode(batch: List[int]) -> List[List[dict]]:  # padded on the side the exported encoder expects
            return self.generate(padded([sources[i] for i in batch], self.config["source_pad"],
                                        self.config["source_padding"] == "left"), **options)

        # fewer batches than workers (a short input, a small buffer): cut so that every worker decodes
        batches = spread(batches_by_tokens([len(s) for s in sources], max_tokens, batch_size), workers)
        if workers > 1:  # ONNX Runtime runs a session's calls in parallel, without the GIL
            with ThreadPoolExecutor(workers, thread_name_prefix="translate") as pool:
                decoded = list(pool.map(decode, batches))
        else:
            decoded = map(decode, batches)
        results = [None] * len(sources)
        for batch, hypotheses in zip(batches, decoded):
            for i, hypothesis in zip(batch, hypotheses):
                results[i] = hypothesis
        return results
