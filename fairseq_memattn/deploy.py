"""Translate with a model exported by ``fairseq_memattn.export``, on ONNX Runtime.

``Translator(folder)`` runs the exported encoder once per batch and the
decoder step once per output position, with fairseq's beam search
(``SequenceGenerator``: the same candidates, finalisation, length penalty,
``--min-len``, ``--max-len-a/b``, ``--unkpen``, ``--nbest``), so on float32
it returns fairseq-generate's hypotheses and scores. What the encoder
derives from a source (the memory, projected once per source) stays at one
row per source for all its hypotheses, as ``modules/beam_sharing.py`` keeps
it in fairseq; only the decoder's own state is reordered per hypothesis:
the LSTM's h and c, or for the Transformer each hypothesis's list of slots
in a self-attention cache that is written once and never moved
(``SelfAttentionCache``).

Alignments (``alignment=True``): the soft alignment of target step i over the
source is beta_i alpha^T (Sec. 5), beta_i the read weights of the last decoder
layer over the K rows and alpha the write weights of Eq. 4-5; the hard one
takes each target token's most attended source token, as fairseq's
``utils.extract_hard_alignment``.

Command line, like fairseq-interactive (raw text in, detokenized text out):

    python -m fairseq_memattn.deploy FOLDER [--beam 5] [--nbest 1] [--lenpen 1] \\
        [--max-tokens 4096] [--print-alignment] < input.txt

sentencepiece is applied when FOLDER has spm.model or with
``--bpe sentencepiece --sentencepiece-model PATH``.
"""

import argparse
import json
import os
import sys
from typing import Dict, List, Optional

import numpy as np

NEG_INF = np.float32(-np.inf)


def require_onnxruntime():
    try:
        import onnxruntime
    except ImportError:
        raise ImportError('the translator needs onnxruntime: pip install "fairseq_memattn[deploy]"') from None
    return onnxruntime


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

    def __init__(self, folder: str, threads: Optional[int] = None, providers=None):
        ort = require_onnxruntime()
        config_path = os.path.join(folder, "config.json")
        if not os.path.isfile(config_path):
            raise ValueError(f"not an exported model folder (no config.json): {folder}")
        with open(config_path) as f:
            self.config = json.load(f)
        options = ort.SessionOptions()
        if threads:
            options.intra_op_num_threads = threads
            options.inter_op_num_threads = 1
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        providers = providers or ["CPUExecutionProvider"]
        self.ort = ort
        self.encoder = ort.InferenceSession(os.path.join(folder, "encoder.onnx"), options, providers=providers)
        self.decoder = ort.InferenceSession(os.path.join(folder, "decoder.onnx"), options, providers=providers)
        self.decoder_outputs = [o.name for o in self.decoder.get_outputs()]
        self.src_dict = Dictionary(os.path.join(folder, "dict.source.txt"))
        self.tgt_dict = Dictionary(os.path.join(folder, "dict.target.txt"))
        spm = os.path.join(folder, "spm.model")
        self.sentencepiece_model = spm if os.path.isfile(spm) else None
        c = self.config
        self.pad, self.eos, self.unk = c["pad"], c["eos"], c["unk"]

    # --- the model's two graphs --------------------------------------------------

    def encode(self, src_tokens: np.ndarray, tokens_per_run: int = 8192) -> Dict[str, np.ndarray]:
        """The encoder's outputs, run on slices of at most ``tokens_per_run`` padded tokens: the
        self-attention's scores grow with rows x |S|^2, and smaller runs stay in cache."""
        names = [o.name for o in self.encoder.get_outputs()]
        rows = max(1, tokens_per_run // src_tokens.shape[1])
        runs = [self.encoder.run(None, {"src_tokens": src_tokens[start: start + rows]})
                for start in range(0, len(src_tokens), rows)]
        return {name: np.concatenate([run[i] for run in runs]) for i, name in enumerate(names)}

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

    def step(self, tokens: np.ndarray, step: int, state, memory, reorder: np.ndarray, cache):
        """(log-probs N x V, read weights N x K, next state) for one target position; row j
        continues row reorder[j] of the previous step. The state and the memory stay in ONNX
        Runtime's memory (OrtValues bound to the graph's inputs and outputs); the new position's
        keys and values are appended to the cache."""
        arrays = {"prev_tokens": np.ascontiguousarray(tokens), "step": np.array([step], np.int64)}
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
            binding.bind_output(name, "cpu")
        self.decoder.run_with_iobinding(binding)
        outputs = dict(zip(self.decoder_outputs, binding.get_outputs()))
        if cache is not None:
            cache.append(step, outputs)
        new_state = {name: outputs["new_" + name] for name in state}
        return outputs["lprobs"].numpy(), outputs["read_weights"].numpy(), new_state

    # --- beam search (fairseq's SequenceGenerator with BeamSearch) -------------------

    def generate(self, src_tokens: np.ndarray, beam: int = 5, lenpen: float = 1.0, max_len_a: float = 0.0,
                 max_len_b: int = 200, min_len: int = 1, unk_penalty: float = 0.0,
                 normalize_scores: bool = True, alignment: bool = False) -> List[List[dict]]:
        """Hypotheses (best first, ``beam`` of them) for a batch of padded
        sources (B x S int64, each ending in EOS), as SequenceGenerator.generate
        returns them: dicts of tokens (EOS last), score, positional_scores and,
        with ``alignment``, attention (T x |x|: every target token over its
        source's tokens) and alignment (hard pairs (source, target), EOS excluded)."""
        beam = min(beam, len(self.tgt_dict) - 1)  # as SequenceGenerator clamps it
        src_tokens = self.padded_as_exported(np.asarray(src_tokens, dtype=np.int64))
        bsz, src_len = src_tokens.shape
        max_len = min(int(max_len_a * src_len + max_len_b), self.config["max_target_positions"] - 1)
        if min_len > max_len:
            raise ValueError(f"invalid --min-len: {min_len} (the maximum length for this batch is {max_len}: "
                             f"raise --max-len-a/--max-len-b)")
        encoded = self.encode(src_tokens)
        ort_value = self.ort.OrtValue.ortvalue_from_numpy
        memory_rows = {name: encoded[name] for name in self.config["memory_outputs"]}
        memory = {name: ort_value(value) for name, value in memory_rows.items()}
        state = {name: ort_value(value) for name, value in self.initial_state(encoded, bsz * beam).items()}
        layers = self.config.get("self_attention_cache")  # the Transformer's; the LSTM's state is h and c
        cache = SelfAttentionCache(layers, bsz * beam, max_len + 1, ort_value) if layers else None
        vocab = len(self.tgt_dict)
        cand_size = 2 * beam
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
            lprobs, read_weights, state = self.step(tokens[:, step], step, state, memory, reorder, cache)
            lprobs = lprobs.copy()
            lprobs[np.isnan(lprobs)] = NEG_INF
            lprobs[:, self.pad] = NEG_INF
            lprobs[:, self.unk] -= unk_penalty
            if step >= max_len:
                lprobs[:, : self.eos] = NEG_INF
                lprobs[:, self.eos + 1:] = NEG_INF
            if step < min_len:
                lprobs[:, self.eos] = NEG_INF
            if reads is not None:
                reads[:, :, step + 1] = read_weights

            # BeamSearch.step: the best 2 x beam of (hypothesis, token) by cumulative score
            lp = lprobs.reshape(bsz, beam, vocab)
            lp = lp[:, :1] if step == 0 else lp + scores.reshape(bsz, beam, -1)[:, :, step - 1, None]
            flat = lp.reshape(bsz, -1)
            order = best_first(flat, min(cand_size, flat.shape[1] - 1))
            cand_scores = np.take_along_axis(flat, order, axis=1)
            cand_beams, cand_indices = order // vocab, order % vocab
            offsets = (np.arange(bsz) * beam)[:, None]
            cand_bbsz_idx = cand_beams + offsets

            eos_mask = (cand_indices == self.eos) & (cand_scores != NEG_INF)
            eos_mask[:, :beam][cands_to_ignore] = False
            finalized_sents = []
            top_eos = eos_mask[:, :beam]
            if top_eos.any():
                finalized_sents = self._finalize(
                    step, cand_bbsz_idx[:, :beam][top_eos], cand_scores[:, :beam][top_eos], tokens, scores,
                    reads, finalized, finished, sentence_ids, beam, max_len, lenpen, normalize_scores)
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
                  beam, max_len, lenpen, normalize_scores):
        """SequenceGenerator.finalize_hypos: the hypotheses ending in EOS at
        ``step``; returns the rows of the sentences that now have ``beam``."""
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
            if not finished[sent] and (len(finalized[sent]) == beam or step == max_len):
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
                      batch_size: Optional[int] = None, **options) -> List[List[dict]]:
        """Hypotheses for each source (token ids ending in EOS), batched by
        length as fairseq does: sources sorted by length, batches of at most
        ``max_tokens`` padded source tokens and ``batch_size`` sources."""
        limit = self.config["max_source_positions"]
        for i, source in enumerate(sources):
            if len(source) > limit:
                raise ValueError(f"source {i} has {len(source)} tokens (EOS included), more than the model's "
                                 f"maximum of {limit}")
        results = [None] * len(sources)
        for batch in batches_by_tokens([len(s) for s in sources], max_tokens, batch_size):
            width = max(len(sources[i]) for i in batch)
            src = np.full((len(batch), width), self.config["source_pad"], np.int64)
            for row, i in enumerate(batch):  # the padding side the exported encoder expects
                start = width - len(sources[i]) if self.config["source_padding"] == "left" else 0
                src[row, start: start + len(sources[i])] = sources[i]
            for i, hypotheses in zip(batch, self.generate(src, **options)):
                results[i] = hypotheses
        return results


def best_first(scores: np.ndarray, k: int) -> np.ndarray:
    """Column indices of each row's k highest scores, highest first, ties to the lower index
    (a stable sort's order): a partition and a sort of k columns, not a sort of beam x
    vocabulary ones; a row whose k-th score is tied with one left out is sorted whole."""
    top = np.argpartition(-scores, k - 1, axis=1)[:, :k]
    values = np.take_along_axis(scores, top, axis=1)
    kth = values.min(axis=1, keepdims=True)
    for row in np.flatnonzero((scores == kth).sum(axis=1) != (values == kth).sum(axis=1)):
        top[row] = np.argsort(-scores[row], kind="stable")[:k]
    values = np.take_along_axis(scores, top, axis=1)
    return np.take_along_axis(top, np.lexsort((top, -values), axis=1), axis=1)


class SelfAttentionCache:
    """Each decoder layer's self-attention keys and values of every position decoded so far
    (export/transformer._cached_self_attention), written once and never moved: position t of the
    hypothesis in row j is slot t * rows + j, and beam search reorders each hypothesis's list of
    slots (``history``), N x t integers, instead of N x t x D floats per layer and step."""

    def __init__(self, layers: List[dict], rows: int, steps: int, ort_value):
        self.rows = rows
        self.buffers, self.inputs = {}, {}  # by output name (H x steps x rows x D/H), by input name
        for index, layer in enumerate(layers):
            for part in ("key", "value"):
                buffer = np.empty((layer["heads"], steps, rows, layer["head_dim"]), np.float32)
                self.buffers[f"new_{part}_{index}"] = buffer
                # the same memory, which ONNX Runtime reads in place
                self.inputs[f"self_{part}_{index}"] = ort_value(buffer.reshape(layer["heads"], -1, layer["head_dim"]))
        self.slots = np.zeros((rows, steps), np.int64)

    def reorder(self, rows: np.ndarray) -> None:
        self.slots = self.slots[rows]

    def history(self, step: int) -> np.ndarray:
        return np.ascontiguousarray(self.slots[:, :step])

    def append(self, step: int, outputs) -> None:
        hypotheses = len(self.slots)
        for name, buffer in self.buffers.items():
            buffer[:, step, :hypotheses] = outputs[name].numpy()
        self.slots[:, step] = step * self.rows + np.arange(hypotheses)


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


class SentencePiece:
    """fairseq's --bpe sentencepiece: pieces joined by spaces in, and back out."""

    def __init__(self, path: str):
        import sentencepiece

        self.model = sentencepiece.SentencePieceProcessor(model_file=path)

    def encode(self, line: str) -> str:
        return " ".join(self.model.encode(line, out_type=str))

    @staticmethod
    def decode(line: str) -> str:
        return line.replace(" ", "").replace("\u2581", " ").strip()


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="python -m fairseq_memattn.deploy", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model", help="a folder written by fairseq-memattn-export")
    p.add_argument("--input", default="-", help="file to translate (default: standard input)")
    p.add_argument("--beam", type=int, default=5)
    p.add_argument("--nbest", type=int, default=1)
    p.add_argument("--lenpen", type=float, default=1.0)
    p.add_argument("--unkpen", type=float, default=0.0)
    p.add_argument("--unnormalized", action="store_true", help="do not divide scores by length^lenpen")
    p.add_argument("--min-len", type=int, default=1)
    p.add_argument("--max-len-a", type=float, default=0.0)
    p.add_argument("--max-len-b", type=int, default=200)
    p.add_argument("--max-tokens", type=int, help="padded source tokens per batch")
    p.add_argument("--batch-size", type=int, help="sources per batch")
    p.add_argument("--print-alignment", action="store_true", help="print A- lines (beta alpha^T, hard)")
    p.add_argument("--bpe", choices=["sentencepiece"], help="default: sentencepiece if the folder has spm.model")
    p.add_argument("--sentencepiece-model", help="default: the folder's spm.model")
    p.add_argument("--threads", type=int, help="ONNX Runtime intra-op threads")
    p.add_argument("--plain", action="store_true", help="print only the best detokenized hypothesis per line")
    args = p.parse_args(argv)
    for name in ("beam", "nbest", "max_tokens", "batch_size", "threads"):
        value = getattr(args, name)
        if value is not None and value < 1:
            p.error(f"invalid --{name.replace('_', '-')}: {value} (must be >= 1)")
    if args.nbest > args.beam:
        p.error(f"invalid --nbest: {args.nbest} (must be <= --beam {args.beam})")
    if args.min_len < 0:
        p.error(f"invalid --min-len: {args.min_len} (must be >= 0)")
    if args.sentencepiece_model and args.bpe != "sentencepiece":
        p.error("--sentencepiece-model needs --bpe sentencepiece")
    return p, args


def main(argv=None):
    parser, args = parse_args(argv)
    try:
        translator = Translator(args.model, threads=args.threads)
    except (ValueError, ImportError, OSError) as error:
        parser.error(str(error))
    spm_path = args.sentencepiece_model or (translator.sentencepiece_model if args.bpe in (None, "sentencepiece")
                                            else None)
    if args.bpe == "sentencepiece" and not spm_path:
        parser.error(f"--bpe sentencepiece needs --sentencepiece-model (no spm.model in {args.model})")
    bpe = SentencePiece(spm_path) if spm_path else None
    stream = sys.stdin if args.input == "-" else open(args.input, encoding="utf-8")
    lines = [line.rstrip("\n") for line in stream]
    pieces = [bpe.encode(line) if bpe else line for line in lines]
    sources = [translator.src_dict.encode(p) for p in pieces]
    try:
        results = translator.translate_ids(
            sources, max_tokens=args.max_tokens, batch_size=args.batch_size, beam=args.beam, lenpen=args.lenpen,
            max_len_a=args.max_len_a, max_len_b=args.max_len_b, min_len=args.min_len, unk_penalty=args.unkpen,
            normalize_scores=not args.unnormalized, alignment=args.print_alignment)
    except ValueError as error:
        parser.error(str(error))
    for i, (line, source, hypotheses) in enumerate(zip(lines, pieces, results)):
        if not args.plain:
            print(f"S-{i}\t{source}")
        for hypothesis in hypotheses[: args.nbest]:
            text = translator.tgt_dict.string(hypothesis["tokens"])
            detok = bpe.decode(text) if bpe else text
            if args.plain:
                print(detok)
                break
            score = hypothesis["score"] / np.log(2)  # fairseq-interactive prints base-2 scores
            print(f"H-{i}\t{score}\t{text}")
            print(f"D-{i}\t{score}\t{detok}")
            print(f"P-{i}\t" + " ".join(f"{s / np.log(2):.4f}" for s in hypothesis["positional_scores"]))
            if args.print_alignment:
                print(f"A-{i}\t" + " ".join(f"{s}-{t}" for s, t in hypothesis["alignment"]))


if __name__ == "__main__":
    main()
