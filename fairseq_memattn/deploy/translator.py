"""Beam search over a model exported by ``fairseq-memattn-export``, on ONNX Runtime.

``Translator(folder)`` runs the exported encoder once per batch and the
decoder step once per output position, with fairseq's beam search
(``SequenceGenerator``: the same candidates, finalisation, length penalty,
``--min-len``, ``--max-len-a/b``, ``--unkpen``, ``--nbest``), so on float32
it returns the hypotheses and scores (natural log) of fairseq's
SequenceGenerator run on each source alone. What the encoder derives from a
source (the memory, projected once per source) stays at one row per source
for all its hypotheses, as ``modules/beam_sharing.py`` keeps it in fairseq;
only the decoder's own state is reordered per hypothesis: the LSTM's h and c,
or for the Transformer each hypothesis's list of slots in a self-attention
cache (``SelfAttentionCache``). The log-probabilities stay in the graph: it
ends in the beam search's choice of candidates (export/search.py), and the
translator keeps the hypotheses.

Alignments (``alignment=True``): the soft alignment of target step i over the
source is beta_i alpha^T (Sec. 5), beta_i the read weights of the last decoder
layer over the K rows and alpha the write weights of Eq. 4-5; the hard one
takes each target token's most attended source token, as fairseq's
``utils.extract_hard_alignment``.

Needs numpy and onnxruntime only: neither torch nor fairseq.
"""

import json
import os
from concurrent.futures import ThreadPoolExecutor
from typing import Dict, List, Optional

import numpy as np

NEG_INF = np.float32(-np.inf)
# config.json's format_version values this translator reads (fairseq_memattn.export.FORMAT_VERSION)
FORMAT_VERSIONS = (2,)
CONFIG_KEYS = ("model", "pad", "eos", "unk", "source_pad", "source_eos", "source_padding", "memory_k",
               "memory_outputs", "decoder_state", "alignment_memory", "max_source_positions",
               "max_target_positions")


class ModelFolderError(ValueError):
    """An exported model folder that is incomplete or unreadable; the message names the file."""


class SourceError(ValueError):
    """A source that cannot be translated with the given limits (an impossible --min-len)."""


class SourceTooLong(SourceError):
    """A source longer than the model's positions or the batch's --max-tokens."""


def require_onnxruntime():
    try:
        import onnxruntime
    except ImportError:
        raise ImportError('the translator needs onnxruntime: pip install "fairseq_memattn[deploy]"') from None
    return onnxruntime


def default_session_options(threads: Optional[int] = None):
    """The translator's ONNX Runtime SessionOptions: ``threads`` intra-op threads (ONNX Runtime's
    default if None) and every graph optimization."""
    ort = require_onnxruntime()
    options = ort.SessionOptions()
    if threads:
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    return options


def read_config(folder: str) -> dict:
    """config.json of an exported model, checked for its format version and the keys the translator reads."""
    if not os.path.isdir(folder):
        raise ModelFolderError(f"not an exported model folder (no such folder): {folder}")
    path = os.path.join(folder, "config.json")
    if not os.path.isfile(path):
        raise ModelFolderError(f"not an exported model folder (no config.json): {folder}")
    try:
        with open(path, encoding="utf-8") as f:
            config = json.load(f)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ModelFolderError(f"{path}: not readable as JSON ({error})") from None
    if not isinstance(config, dict):
        raise ModelFolderError(f"{path}: not a JSON object")
    version = config.get("format_version")
    if version not in FORMAT_VERSIONS:
        found = "no format_version" if version is None else f"format_version {version!r}"
        raise ModelFolderError(f"{path}: {found}, this translator reads format_version "
                               f"{', '.join(map(str, FORMAT_VERSIONS))} (export the model again with this "
                               f"version of fairseq-memattn-export)")
    missing = [key for key in CONFIG_KEYS if key not in config]
    if missing:
        raise ModelFolderError(f"{path}: missing key {', '.join(map(repr, missing))}")
    return config


def load_session(ort, path: str, options, providers):
    """An ONNX Runtime session of one exported graph; a missing or unreadable file is named."""
    if not os.path.isfile(path):
        raise ModelFolderError(f"{path}: no such file (the folder's export is incomplete)")
    try:
        return ort.InferenceSession(path, options, providers=providers)
    except Exception as error:  # onnxruntime's own exception types (InvalidProtobuf, Fail, ...)
        reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise ModelFolderError(f"{path}: not a readable ONNX graph ({reason})") from None


class Dictionary:
    """fairseq's Dictionary file (``dict.txt``: symbol count per line) with its
    four special symbols first, as ``fairseq.data.Dictionary.load`` reads it."""

    def __init__(self, path: str):
        self.symbols = ["<s>", "<pad>", "</s>", "<unk>"]
        with open(path, encoding="utf-8") as f:
            for line in f:
                symbol = line.rstrip("\n").rsplit(" ", 1)[0]
                if line.rstrip().endswith("#fairseq:overwrite"):
                    symbol = line.rstrip().rsplit(" ", 2)[0]
                    if symbol in self.symbols:
                        continue
                self.symbols.append(symbol)
        self.index = {s: i for i, s in enumerate(self.symbols)}
        self.bos, self.pad, self.eos, self.unk = 0, 1, 2, 3

    def __len__(self):
        return len(self.symbols)

    def encode(self, line: str) -> List[int]:
        """Token ids of a whitespace-tokenized line, EOS appended."""
        return [self.index.get(w, self.unk) for w in line.split()] + [self.eos]

    def string(self, ids) -> str:
        """As fairseq's Dictionary.string: without EOS, padding and BOS."""
        return " ".join(self.symbols[i] for i in ids if i not in (self.eos, self.pad, self.bos))


class Translator:
    """Beam search over an exported model; see the module docstring."""

    # padded source tokens per encoder run: the self-attention's scores grow with rows x |S|^2,
    # and smaller runs stay in cache
    encoder_tokens_per_run = 8192

    def __init__(self, folder: str, threads: Optional[int] = None, providers=None, session_options=None):
        """``session_options``: ONNX Runtime's SessionOptions for both graphs (profiling, say),
        instead of the default: ``threads`` intra-op threads and every graph optimization."""
        self.config = read_config(folder)
        ort = require_onnxruntime()
        options = session_options if session_options is not None else default_session_options(threads)
        providers = providers or ["CPUExecutionProvider"]
        self.ort = ort
        self.encoder = load_session(ort, os.path.join(folder, "encoder.onnx"), options, providers)
        self.decoder = load_session(ort, os.path.join(folder, "decoder.onnx"), options, providers)
        self.decoder_outputs = [o.name for o in self.decoder.get_outputs()]
        self.src_dict = Dictionary(os.path.join(folder, "dict.source.txt"))
        self.tgt_dict = Dictionary(os.path.join(folder, "dict.target.txt"))
        spm = os.path.join(folder, "spm.model")
        self.sentencepiece_model = spm if os.path.isfile(spm) else None
        c = self.config
        self.pad, self.eos, self.unk = c["pad"], c["eos"], c["unk"]

    # --- each source's limits ----------------------------------------------------------

    def max_len(self, source_len, max_len_a: float, max_len_b: int):
        """fairseq's max_len_a * |x| + max_len_b (|x| counts EOS), within the decoder's positions;
        |x| is the source's own length, as SequenceGenerator has it for a batch of one."""
        limit = (max_len_a * np.asarray(source_len) + max_len_b).astype(np.int64)
        return np.minimum(limit, self.config["max_target_positions"] - 1)

    def check_source(self, source: List[int], max_len_a: float = 0.0, max_len_b: int = 200, min_len: int = 1,
                     max_tokens: Optional[int] = None) -> None:
        """Raises SourceTooLong or SourceError for a source (token ids ending in EOS) these limits
        cannot translate."""
        limit = self.config["max_source_positions"]
        if len(source) > limit:
            raise SourceTooLong(f"{len(source)} tokens (EOS included), more than the model's maximum of {limit}")
        if max_tokens is not None and len(source) > max_tokens:
            raise SourceTooLong(f"{len(source)} tokens (EOS included), more than --max-tokens {max_tokens}")
        max_len = int(self.max_len(len(source), max_len_a, max_len_b))
        if min_len > max_len:
            raise SourceError(f"invalid --min-len: {min_len} (the maximum length for this source is {max_len}: "
                              f"raise --max-len-a/--max-len-b)")

    # --- the model's two graphs --------------------------------------------------

    def encode(self, src_tokens: np.ndarray) -> Dict[str, np.ndarray]:
        """The encoder's outputs, run on slices of at most ``encoder_tokens_per_run`` padded tokens."""
        names = [o.name for o in self.encoder.get_outputs()]
        rows = max(1, self.encoder_tokens_per_run // src_tokens.shape[1])
        runs = [self.encoder.run(None, {"src_tokens": src_tokens[start: start + rows]})
                for start in range(0, len(src_tokens), rows)]
        return {name: np.concatenate([run[i] for run in runs], axis=0) for i, name in enumerate(names)}

    def initial_state(self, encoded: Dict[str, np.ndarray], hypotheses: int) -> Dict[str, np.ndarray]:
        """The decoder's state before the first step, one row per hypothesis."""
        state = {}
        for entry in self.config["decoder_state"]:
            if "from" in entry:  # one row per source from the encoder, one per hypothesis here
                rows = encoded[entry["from"]]
                state[entry["name"]] = np.repeat(rows, hypotheses // len(rows), axis=0)
            else:
                state[entry["name"]] = np.zeros((hypotheses, *entry["zeros"]), np.float32)
        return state

    def step(self, tokens: np.ndarray, step: int, state, memory, reorder: np.ndarray, cache, search: dict):
        """(candidate scores and indices, sources x candidates; read weights N x K; next state) for
        one target position; row j continues row reorder[j] of the previous step, ``search`` holds
        the inputs of export/search.py. The state and the memory stay in ONNX Runtime's memory
        (OrtValues bound to the graph's inputs and outputs), and the new position's keys and values
        are written straight into the cache."""
        arrays = {"prev_tokens": np.ascontiguousarray(tokens), "step": np.array([step], np.int64), **search}
        values = {**state, **memory}
        if cache is None:  # the state is reordered by the graph
            arrays["reorder"] = reorder
        else:
            cache.reorder(reorder)
            arrays["history"] = cache.history(step)
            values.update(cache.inputs)
        binding = self.decoder.io_binding()
        for name, value in arrays.items():
            binding.bind_cpu_input(name, value)
        for name, value in values.items():
            binding.bind_ortvalue_input(name, value)
        for name in self.decoder_outputs:
            if cache is None or name not in cache.tables:
                binding.bind_output(name, "cpu")
        if cache is not None:
            cache.bind_new_position(binding, step)
        self.decoder.run_with_iobinding(binding)
        outputs = dict(zip(self.decoder_outputs, binding.get_outputs()))
        new_state = {name: outputs["new_" + name] for name in state}
        return (outputs["candidate_scores"].numpy(), outputs["candidate_indices"].numpy(),
                outputs["read_weights"].numpy(), new_state)

    # --- beam search (fairseq's SequenceGenerator with BeamSearch) -------------------

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
        beam = min(beam, len(self.tgt_dict) - 1)  # as SequenceGenerator clamps it
        src_tokens = self.padded_as_exported(np.asarray(src_tokens, dtype=np.int64))
        bsz = len(src_tokens)
        max_lens = self.max_len((src_tokens != self.config["source_pad"]).sum(axis=1), max_len_a, max_len_b)
        if min_len > max_lens.min():
            row = int(max_lens.argmin())
            raise SourceError(f"invalid --min-len: {min_len} (the maximum length for source {row} is "
                              f"{max_lens[row]}: raise --max-len-a/--max-len-b)")
        max_len = int(max_lens.max())
        encoded = self.encode(src_tokens)
        ort_value = self.ort.OrtValue.ortvalue_from_numpy
        memory_rows = {name: encoded[name] for name in self.config["memory_outputs"]}
        memory = {name: ort_value(value) for name, value in memory_rows.items()}
        state = {name: ort_value(value) for name, value in self.initial_state(encoded, bsz * beam).items()}
        layers = self.config.get("self_attention_cache")  # the Transformer's; the LSTM's state is h and c
        cache = SelfAttentionCache(layers, bsz * beam, max_len + 1, ort_value) if layers else None
        vocab = len(self.tgt_dict)
        cand_size = 2 * beam
        # export/search.py's edits: after --min-len (row 0), before it (1), at the maximum length (2)
        lprob_edits = np.zeros((3, vocab), np.float32)
        lprob_edits[:2, self.pad] = NEG_INF
        lprob_edits[:2, self.unk] = -unk_penalty
        lprob_edits[1, self.eos] = NEG_INF
        lprob_edits[2] = NEG_INF
        lprob_edits[2, self.eos] = 0
        first_hypotheses = np.where(np.arange(bsz * beam) % beam == 0, 0, NEG_INF).astype(np.float32)
        tokens = np.full((bsz * beam, max_len + 2), self.pad, np.int64)
        tokens[:, 0] = self.eos
        scores = np.zeros((bsz * beam, max_len + 1), np.float32)
        reads = np.zeros((bsz * beam, self.config["memory_k"], max_len + 2), np.float32) if alignment else None
        cands_to_ignore = np.zeros((bsz, beam), bool)
        finalized: List[List[dict]] = [[] for _ in range(bsz)]
        finished = [False] * bsz
        sentence_ids = np.arange(bsz)  # the original sentence of each row still decoded
        remaining = bsz
        reorder, state_rows = np.arange(bsz * beam), None
        for step in range(max_len + 1):
            if state_rows is not None:  # sentences were dropped: rows of the state before the drop
                reorder, state_rows = state_rows[reorder], None
            search = {
                "lprob_edits": lprob_edits,
                "edit_rows": np.where(np.repeat(max_lens[sentence_ids] <= step, beam), 2, int(step < min_len)),
                "hypothesis_scores": np.ascontiguousarray(scores[:, step - 1]) if step else first_hypotheses,
                "beam": np.array([beam], np.int64),
                # BeamSearch.step's best 2 x beam (at step 0, of the first hypothesis's tokens)
                "candidates": np.array([min(cand_size, (beam if step else 1) * vocab - 1)], np.int64),
            }
            cand_scores, candidates, read_weights, state = self.step(tokens[:, step], step, state, memory,
                                                                     reorder, cache, search)
            if reads is not None:
                reads[:, :, step + 1] = read_weights
            cand_beams, cand_indices = candidates // vocab, candidates % vocab
            offsets = (np.arange(bsz) * beam)[:, None]
            cand_bbsz_idx = cand_beams + offsets

            eos_mask = (cand_indices == self.eos) & (cand_scores != NEG_INF)
            eos_mask[:, :beam][cands_to_ignore] = False
            finalized_sents = []
            top_eos = eos_mask[:, :beam]
            if top_eos.any():
                finalized_sents = self._finalize(
                    step, cand_bbsz_idx[:, :beam][top_eos], cand_scores[:, :beam][top_eos], tokens, scores,
                    reads, finalized, finished, sentence_ids, beam, max_lens, lenpen, normalize_scores)
                remaining -= len(finalized_sents)
            if remaining == 0:
                break
            if finalized_sents:  # drop finished sentences from the batch
                keep = np.ones(bsz, bool)
                keep[finalized_sents] = False
                batch_idxs = np.flatnonzero(keep)
                bsz = len(batch_idxs)
                eos_mask, cand_beams = eos_mask[batch_idxs], cand_beams[batch_idxs]
                cand_scores, cand_indices = cand_scores[batch_idxs], cand_indices[batch_idxs]
                cands_to_ignore = cands_to_ignore[batch_idxs]
                cand_bbsz_idx = cand_beams + (np.arange(bsz) * beam)[:, None]
                old_rows = (batch_idxs[:, None] * beam + np.arange(beam)).reshape(-1)
                tokens, scores = tokens[old_rows], scores[old_rows]
                if reads is not None:
                    reads = reads[old_rows]
                state_rows = old_rows  # the state is reordered once, by the next step
                sentence_ids = sentence_ids[batch_idxs]
                memory_rows = {name: value[batch_idxs] for name, value in memory_rows.items()}
                memory = {name: ort_value(value) for name, value in memory_rows.items()}

            # the best beam candidates that do not end in EOS continue
            eos_mask[:, :beam] = ~(~cands_to_ignore & ~eos_mask[:, :beam])
            active_mask = eos_mask.astype(np.int64) * cand_size + np.arange(eos_mask.shape[1])
            active_hypos = np.argsort(active_mask, axis=1, kind="stable")[:, :beam]
            cands_to_ignore = np.take_along_axis(active_mask, active_hypos, axis=1) >= cand_size
            active_bbsz_idx = np.take_along_axis(cand_bbsz_idx, active_hypos, axis=1).reshape(-1)
            tokens[:, : step + 1] = tokens[active_bbsz_idx, : step + 1]
            tokens[:, step + 1] = np.take_along_axis(cand_indices, active_hypos, axis=1).reshape(-1)
            if step > 0:
                scores[:, :step] = scores[active_bbsz_idx, :step]
            scores[:, step] = np.take_along_axis(cand_scores, active_hypos, axis=1).reshape(-1)
            if reads is not None:
                reads[:, :, : step + 2] = reads[active_bbsz_idx, :, : step + 2]
            reorder = active_bbsz_idx

        for sent, hypotheses in enumerate(finalized):
            order = np.argsort([-h["score"] for h in hypotheses], kind="stable")
            finalized[sent] = [hypotheses[i] for i in order]
            if alignment:
                self._align(finalized[sent], src_tokens[sent], encoded["alpha"][sent, self.config["alignment_memory"]])
        return finalized

    def padded_as_exported(self, src_tokens: np.ndarray) -> np.ndarray:
        """The LSTM's exported encoder reads each row from its start: padding moved to the end."""
        if self.config["source_padding"] == "left":
            return np.ascontiguousarray(src_tokens)
        order = np.argsort(src_tokens == self.config["source_pad"], axis=1, kind="stable")
        return np.ascontiguousarray(np.take_along_axis(src_tokens, order, axis=1))

    def _finalize(self, step, bbsz_idx, eos_scores, tokens, scores, reads, finalized, finished, sentence_ids,
                  beam, max_lens, lenpen, normalize_scores):
        """SequenceGenerator.finalize_hypos: the hypotheses ending in EOS at
        ``step``; returns the rows of the sentences that now have ``beam`` or
        reached their maximum length."""
        tokens_clone = tokens[bbsz_idx, 1: step + 2].copy()
        tokens_clone[:, step] = self.eos
        pos_scores = scores[bbsz_idx, : step + 1].copy()
        pos_scores[:, step] = eos_scores
        pos_scores[:, 1:] = pos_scores[:, 1:] - pos_scores[:, :-1]
        if normalize_scores:
            eos_scores = eos_scores / (step + 1) ** lenpen
        unfin_idx = bbsz_idx // beam
        for i, row in enumerate(unfin_idx):
            sent = sentence_ids[row]
            if len(finalized[sent]) < beam:
                hypothesis = {"tokens": tokens_clone[i], "score": float(eos_scores[i]),
                              "positional_scores": pos_scores[i]}
                if reads is not None:
                    hypothesis["reads"] = reads[bbsz_idx[i], :, 1: step + 2].T.copy()  # T x K
                finalized[sent].append(hypothesis)
        newly_finished = []
        for row in np.unique(unfin_idx):
            sent = sentence_ids[row]
            if not finished[sent] and (len(finalized[sent]) == beam or step == max_lens[sent]):
                finished[sent] = True
                newly_finished.append(int(row))
        return newly_finished

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
        batch's small products keep one core busy better than several). A
        source's hypotheses do not depend on the other sources."""
        limits = {key: options[key] for key in ("max_len_a", "max_len_b", "min_len") if key in options}
        for i, source in enumerate(sources):
            try:
                self.check_source(source, max_tokens=max_tokens, **limits)
            except SourceError as error:
                raise type(error)(f"source {i}: {error}") from None

        def decode(batch: List[int]) -> List[List[dict]]:
            width = max(len(sources[i]) for i in batch)
            src = np.full((len(batch), width), self.config["source_pad"], np.int64)
            for row, i in enumerate(batch):  # the padding side the exported encoder expects
                start = width - len(sources[i]) if self.config["source_padding"] == "left" else 0
                src[row, start: start + len(sources[i])] = sources[i]
            return self.generate(src, **options)

        batches = list(batches_by_tokens([len(s) for s in sources], max_tokens, batch_size))
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


class SelfAttentionCache:
    """Each decoder layer's self-attention keys and values of every position decoded so far
    (export/transformer._cached_self_attention), in tables of rows of D/H that ONNX Runtime reads
    and writes in place: the keys of position t of the hypothesis in row j are rows
    (t * rows + j) * H + h, h = 0 .. H - 1, written by the decoder step itself (its outputs are
    bound to them). Beam search reorders each hypothesis's list of slots t * rows + j, N x t
    integers, never the tables; the decoder graph gathers each hypothesis's N x t x D keys and
    values from them, per layer and step."""

    def __init__(self, layers: List[dict], rows: int, steps: int, ort_value):
        self.rows, self.heads = rows, layers[0]["heads"]  # fairseq's decoder layers have one head count
        self.tables, self.inputs = {}, {}  # by output name, by input name
        for index, layer in enumerate(layers):
            for part in ("key", "value"):
                table = np.empty((steps * rows * self.heads, layer["head_dim"]), np.float32)
                self.tables[f"new_{part}_{index}"] = table
                self.inputs[f"self_{part}_{index}"] = ort_value(table)  # the same memory
        self.slots = np.zeros((rows, steps), np.int64)

    def reorder(self, rows: np.ndarray) -> None:
        self.slots = self.slots[rows]

    def history(self, step: int) -> np.ndarray:
        """H x N x step: the table row of each head's key and value at each past position."""
        return self.slots[None, :, :step] * self.heads + np.arange(self.heads)[:, None, None]

    def bind_new_position(self, binding, step: int) -> None:
        """The step's new keys and values (N x H x D/H) are written to the rows of slots step * rows + j."""
        hypotheses = len(self.slots)
        first = step * self.rows * self.heads
        for name, table in self.tables.items():
            binding.bind_output(name, "cpu", 0, np.float32, [hypotheses, self.heads, table.shape[1]],
                                table[first:].ctypes.data)
        self.slots[:, step] = step * self.rows + np.arange(hypotheses)


# Padded source tokens per batch. The decoder's state and self-attention cache grow with
# sources x beam x maximum length; 1024 tokens are a few dozen sentences of ordinary length.
MAX_TOKENS = 1024


def batches_by_tokens(lengths: List[int], max_tokens: Optional[int], batch_size: Optional[int]):
    """Index batches of sources sorted by length, each within max_tokens padded tokens and batch_size sources."""
    if max_tokens is not None and max_tokens < max(lengths, default=0):
        raise ValueError(f"invalid --max-tokens: {max_tokens} (the longest source has {max(lengths)} tokens)")
    batch, width = [], 0
    for i in np.argsort(lengths, kind="stable"):
        new_width = max(width, lengths[i])
        if batch and ((max_tokens and new_width * (len(batch) + 1) > max_tokens)
                      or (batch_size and len(batch) >= batch_size)):
            yield batch
            batch, new_width = [], lengths[i]
        batch.append(int(i))
        width = new_width
    if batch:
        yield batch
