#!/usr/bin/env python
"""Decoding speed where users deploy: fairseq's `transformer` in fairseq-generate and in CTranslate2
(float32, int8), against `transformer_memattn` in fairseq-generate and exported to ONNX Runtime
(fairseq-memattn-export, fairseq_memattn.deploy.Translator; float32, int8). The full grid:

    python -m recipes.speed.deploy --source-lens 50 200 800 2000 --target-len 50 --copy-lens 200 800 \\
        --sources 20 --beam 5 --threads 1 2 --out results/speed/deploy.md

Untrained models (seed 0) as fairseq-train builds them (recipes/speed/transformer_decode.build):
--size small, 3 + 3 layers of 256 units (4 heads, FFN 1024), or base, Transformer-base's 6 + 6 x 512
(8 heads, FFN 2048); --vocab symbols (the copy task's, one dictionary for both sides);
transformer_memattn with --memory-k (attention read, shared memory). Each is saved as a fairseq checkpoint, converted with
`ct2-fairseq-converter ... --unsafe_deserialization [--quantization int8]` or exported with
`python -m fairseq_memattn.export [--quantize int8]`. Per cell: one batch of --sources random
sources of exactly |S| symbols, beam --beam, every output forced to |T| tokens (minimum = maximum
length), so all engines decode |T| + 1 steps; seconds of the whole translation (encoder included,
model loading excluded), median of --repeats (fewer once a cell has taken --cell-seconds) after a
warm-up on one source; with --rounds R the grid is measured R times, engine after engine, and each
cell reports the median of its rounds. Each engine and thread count runs in its own process, whose
peak resident memory (ru_maxrss, model loading included) is reported; so is the GEMM backend
CTranslate2 picked on this CPU (MKL on Intel, oneDNN elsewhere). Needs the optional extra deploy
(onnx, onnxruntime) and ctranslate2. A model folder of --workdir records what its model was made
from (made_from.json) and is made again when that changes; each row of --rows records the models,
--sources, --beam and --split it was measured with, and rows of others are refused.

With --trained TRANSFORMER.pt MEMATTN.pt --data DIR the engines run trained checkpoints instead (a
fairseq `transformer` and a `transformer_memattn` with the same dictionaries, e.g. the Bible
models of recipes/bible and recipes/convert) on the test split of DIR (recipes.wmt17.run prepare's
layout: bpe/test.SRC and data-bin/dict.SRC.txt), in batches of --sources sentences in file order,
with natural output lengths (fairseq's defaults: at most 200 tokens, EOS when the model says so);
the table then gives the output tokens beside the seconds.
"""

import argparse
import json
import os
import re
import resource
import shutil
import statistics
import subprocess
import sys
import time

import numpy as np

from fairseq_memattn.cli import log_to_stderr
from fairseq_memattn.arg_types import positive_int, positive_number
from recipes.cli import (check, command_line, existing_dir, existing_file, folder_with, output_dir, output_file,
                         refuse_duplicates)
from recipes.speed.options import changed, require_ctranslate2, untrained_model

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
PLUGIN = os.path.join(REPO, "fairseq_memattn")

BASE_SIZE = ["--encoder-layers", "6", "--decoder-layers", "6", "--encoder-embed-dim", "512", "--decoder-embed-dim",
             "512", "--encoder-ffn-embed-dim", "2048", "--decoder-ffn-embed-dim", "2048",
             "--encoder-attention-heads", "8", "--decoder-attention-heads", "8"]
SIZE_NAMES = {"small": "3 + 3 layers x 256 (4 heads, FFN 1024)", "base": "6 + 6 layers x 512 (8 heads, FFN 2048)"}
SPECIALS = 4  # fairseq's <s>, <pad>, </s>, <unk> come before the copy task's symbols

ENGINES = {  # name: (label, model)
    "fairseq": ("transformer, fairseq-generate", "transformer"),
    "ct2-f32": ("transformer, CTranslate2 float32", "transformer"),
    "ct2-int8": ("transformer, CTranslate2 int8", "transformer"),
    "memattn": ("transformer_memattn, fairseq-generate", "memattn"),
    "onnx-f32": ("transformer_memattn, exported float32", "memattn"),
    "onnx-int8": ("transformer_memattn, exported int8", "memattn"),
}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--source-lens", nargs="*", type=positive_int, default=[50, 200, 800, 2000], metavar="S")
    p.add_argument("--target-len", type=positive_int, default=50)
    p.add_argument("--copy-lens", nargs="*", type=positive_int, default=[200, 800], metavar="L", help="|T| = |S| = L")
    p.add_argument("--sources", type=positive_int, default=20)
    p.add_argument("--beam", type=positive_int, default=5)
    p.add_argument("--memory-k", type=positive_int, default=32)
    p.add_argument("--size", choices=list(SIZE_NAMES), default="small")
    p.add_argument("--vocab", type=positive_int, default=20, help="symbols of the copy task's dictionary")
    p.add_argument("--trained", nargs=2, type=existing_file, metavar=("TRANSFORMER", "MEMATTN"),
                   help="trained checkpoints to time on --data's test split (natural lengths)")
    p.add_argument("--data", type=existing_dir,
                   help="with --trained: the data folder (bpe/test.SRC, data-bin/dict.SRC.txt)")
    p.add_argument("--source-lang", default="en")
    p.add_argument("--threads", nargs="+", type=positive_int, default=[1, 2])
    p.add_argument("--repeats", type=positive_int, default=3)
    p.add_argument("--cell-seconds", type=positive_number, default=60,
                   help="no further repeat once a cell's timed runs have taken this long")
    p.add_argument("--engines", nargs="+", default=list(ENGINES), choices=list(ENGINES))
    p.add_argument("--workdir", type=output_dir, default="/tmp/memattn-deploy-bench",
                   help="checkpoints and converted models, each in a folder made again when the options it "
                        "depends on change")
    p.add_argument("--out", type=output_file, help="write the markdown here (and the plot beside it, .png)")
    p.add_argument("--rows", type=output_file,
                   help="JSON lines of measured rows: read, and appended to cell by cell; a cell "
                        "already there is not measured again (a long grid in several runs; rows "
                        "measured with other models, --sources, --beam or --split are refused)")
    p.add_argument("--rounds", type=positive_int, default=1,
                   help="measure the grid this many times, every engine in turn each round, and report "
                        "each cell's median over the rounds: the machine's drift then falls on all engines")
    p.add_argument("--split", action="store_true",
                   help="with T threads, each engine splits a batch into T parts decoded at once on one thread "
                        "each (CTranslate2: inter_threads T, max_batch_size; the export: T workers), instead of "
                        "running one batch on T threads (keep these rows in their own --rows file)")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    refuse_duplicates(p, args, "engines", "threads", "source_lens", "copy_lens")
    if args.split and {"fairseq", "memattn"} & set(args.engines):
        p.error("--split: fairseq-generate (engines fairseq, memattn) decodes a batch as one; "
                "time it without --split")
    if args.worker:
        return args
    ct2 = [engine for engine in args.engines if engine.startswith("ct2-")]
    if ct2:
        require_ctranslate2(p, f"--engines {' '.join(ct2)}", ", or leave them out of --engines")
    check_models(p, args)
    args.workdir = os.path.abspath(args.workdir)  # the export runs in the repository's folder
    args.earlier_rows = earlier_rows(p, args)
    return args


def check_models(p, args):
    """--trained's checkpoints (a transformer, then a transformer_memattn) and --data, or the cells
    of the untrained models: before anything is converted or timed."""
    if not args.trained:
        if args.data:
            p.error("--data goes with --trained")
        if not cells(args):
            p.error("no cells to time: give lengths to --source-lens or --copy-lens (or --trained)")
        return
    if not args.data:
        p.error("--trained needs --data, the folder with its test split and dictionaries")
    check(p, "--data", folder_with(os.path.join("bpe", f"test.{args.source_lang}"),
                                   os.path.join("data-bin", f"dict.{args.source_lang}.txt")), args.data)
    from fairseq.models.transformer import TransformerModel

    from fairseq_memattn.checkpoint_safety import architecture, read_checkpoint, registered_model
    from fairseq_memattn.errors import UserError
    from fairseq_memattn.models.transformer_memattn import MemAttnTransformerModel

    for checkpoint, wanted, kind in zip(args.trained, (TransformerModel, MemAttnTransformerModel),
                                        ("transformer", "transformer_memattn")):
        try:
            cfg = read_checkpoint(checkpoint)["cfg"]
        except UserError as error:
            p.error(f"argument --trained: {error}")
        if registered_model(cfg["model"]) is not wanted:
            p.error(f"argument --trained: {checkpoint} holds a {architecture(cfg['model'])} model, not a {kind} "
                    f"(give a fairseq transformer, then a transformer_memattn)")
        source, target = (getattr(cfg["task"], key, None) for key in ("source_lang", "target_lang"))
        if source and source != args.source_lang:  # the test split of another language would be timed
            p.error(f"--source-lang {args.source_lang}: {checkpoint} translates from {source}")
        if target and not os.path.isfile(os.path.join(args.data, "data-bin", f"dict.{target}.txt")):
            p.error(f"argument --data: {args.data}: no data-bin/dict.{target}.txt in it (the target "
                    f"dictionary of {checkpoint})")


def measured_with(args) -> dict:
    """What a row's time depends on besides its engine, threads and cell (not how often it is repeated)."""
    models = ({"trained": [os.path.abspath(path) for path in args.trained], "data": os.path.abspath(args.data),
               "source_lang": args.source_lang} if args.trained
              else {"size": args.size, "vocab": args.vocab, "memory_k": args.memory_k})
    return {"trained": None, **models, "sources": args.sources, "beam": args.beam, "split": args.split}


def earlier_rows(p, args) -> list:
    """--rows's rows, refused where measured with other settings: they would be reported as this
    run's (rows written before the settings were kept with them are taken as they are)."""
    if not (args.rows and os.path.exists(args.rows)):
        return []
    rows, now = [], measured_with(args)
    with open(args.rows) as f:
        for number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except ValueError:
                row = None
            if not isinstance(row, dict) or not {"engine", "threads", "S", "T", "seconds", "peak_mib"} <= row.keys():
                p.error(f"--rows {args.rows}: line {number} is not a row of recipes.speed.deploy")
            differs = changed(row.get("settings", now), now)
            if differs:
                p.error(f"--rows {args.rows} holds times measured with other settings: {differs}; "
                        f"give another --rows")
            rows.append(row)
    return rows


TEST_SPLIT = (0, 0)  # the cell of --trained: --data's test split, natural output lengths


def cells(args):
    if args.trained:
        return [TEST_SPLIT]
    return [(s, args.target_len) for s in args.source_lens] + [(n, n) for n in args.copy_lens]


# --- models, once per workdir --------------------------------------------------------

def prepare(args):
    """Checkpoints, CTranslate2 models and ONNX exports in args.workdir (made when missing)."""
    import torch

    import fairseq_memattn
    from recipes.speed.transformer_decode import SIZES  # imports torch: not at the top, for the workers

    fairseq_memattn.register()  # imported already (log_to_stderr), so --user-dir imports nothing

    if args.trained:
        return prepare_trained(args)
    longest = max(max(s, t) for s, t in cells(args))
    models = {"transformer": ["--arch", "transformer"],
              "memattn": ["--arch", "transformer_memattn", "--memory-k", str(args.memory_k)]}
    size = BASE_SIZE if args.size == "base" else ["--encoder-layers", "3", "--decoder-layers", "3", *SIZES]
    paths = {}
    for name, arch in models.items():
        # as transformer_decode.build: the copy task's symbols, positions for the longest cell
        memory = ["--memory-position-max-len", str(longest + 1)] if name == "memattn" else []
        command = ["--user-dir", PLUGIN, "--task", "copy_task", "--copy-max-len", str(longest), "--cpu",
                   "--copy-vocab-size", str(args.vocab), "--max-source-positions", str(longest + 2),
                   "--max-target-positions", str(longest + 2), *size, *arch, *memory]
        label = f"{name}-{args.size}-{args.vocab}-{longest}" + (f"-k{args.memory_k}" if name == "memattn" else "")
        folder = model_folder(os.path.join(args.workdir, label), {"fairseq-train": command})
        checkpoint = os.path.join(folder, "checkpoint.pt")
        if not os.path.exists(checkpoint):
            model, _, train_args = untrained_model(command)
            torch.save({"args": train_args, "model": model.state_dict(), "extra_state": {"train_iterator": {"epoch": 0}},
                        "optimizer_history": [{"criterion_name": "CrossEntropyCriterion", "optimizer_name": "Adam",
                                               "lr_scheduler_state": {"best": None}, "num_updates": 0}]},
                       checkpoint + ".partial")
            os.replace(checkpoint + ".partial", checkpoint)
        paths[name] = folder
    convert_and_export(args, paths, data_dir=paths["transformer"])
    return paths


def prepare_trained(args):
    """--trained: each checkpoint linked into its folder of args.workdir, converted and exported there."""
    data_dir = os.path.abspath(os.path.join(args.data, "data-bin"))
    paths = {}
    for name, checkpoint in zip(("transformer", "memattn"), args.trained):
        checkpoint, found = os.path.abspath(checkpoint), os.stat(checkpoint)
        folder = model_folder(os.path.join(args.workdir, f"trained-{name}"), {
            "checkpoint": checkpoint, "bytes": found.st_size, "modified_ns": found.st_mtime_ns, "data": data_dir})
        link = os.path.join(folder, "checkpoint.pt")
        if not os.path.lexists(link):
            os.symlink(checkpoint, link)
        paths[name] = folder
    convert_and_export(args, paths, data_dir=data_dir)
    return paths


def model_folder(folder, made_from):
    """FOLDER, for a model made from MADE_FROM (all it depends on, as JSON): emptied first where it
    holds one made from anything else, so that a model of other options is never timed under these."""
    record = os.path.join(folder, "made_from.json")
    try:
        with open(record) as f:
            if json.load(f) == made_from:
                return folder
    except (OSError, ValueError):
        pass
    if os.path.lexists(folder):
        print(f"{folder}: made from other options, made again", file=sys.stderr, flush=True)
        shutil.rmtree(folder)
    os.makedirs(folder)
    with open(record, "w") as f:
        json.dump(made_from, f)
    return folder


def convert_and_export(args, paths, data_dir):
    """The CTranslate2 models of paths["transformer"] and the ONNX exports of paths["memattn"], each
    written to a .partial folder first: an interrupted one is not taken for finished."""
    for engine in args.engines:
        model = ENGINES[engine][1]
        out = os.path.join(paths[model], engine)
        if engine in ("fairseq", "memattn") or os.path.exists(out):
            continue
        checkpoint, partial = os.path.join(paths[model], "checkpoint.pt"), out + ".partial"
        shutil.rmtree(partial, ignore_errors=True)
        if engine.startswith("ct2"):
            command = [os.path.join(os.path.dirname(sys.executable), "ct2-fairseq-converter"), "--model_path",
                       checkpoint, "--data_dir", data_dir, "--user_dir", PLUGIN, "--output_dir", partial,
                       "--unsafe_deserialization", *(["--quantization", "int8"] if engine == "ct2-int8" else [])]
        else:
            command = [sys.executable, "-m", "fairseq_memattn.export", checkpoint, partial, "--data", data_dir,
                       *(["--quantize", "int8"] if engine == "onnx-int8" else [])]
        if subprocess.run(command, cwd=REPO).returncode != 0:
            sys.exit(f"{engine}: converting {os.path.realpath(checkpoint)} failed (its error is above)")
        os.rename(partial, out)


# --- one engine in its own process -----------------------------------------------------

def sources_for(length, n, symbols, offset):
    rng = np.random.default_rng(0)
    return list(rng.integers(offset, offset + symbols, size=(n, length)))


def source_symbols(args):
    """The source dictionary's symbols, id SPECIALS first: --data's (dict.SRC.txt, in file order, as
    fairseq loads it) or the copy task's ("0", "1", ... sorted as strings by fairseq's finalize())."""
    if not args.trained:
        return sorted(str(i) for i in range(args.vocab))
    with open(os.path.join(args.data, "data-bin", f"dict.{args.source_lang}.txt"), encoding="utf-8") as f:
        return [line.split(" ")[0] for line in f]


def test_split_batches(args, symbols):
    """--data's test split as id lists (unknown pieces as <unk>), in batches of --sources."""
    index = {symbol: i + SPECIALS for i, symbol in enumerate(symbols)}
    with open(os.path.join(args.data, "bpe", f"test.{args.source_lang}"), encoding="utf-8") as f:
        sources = [[index.get(piece, 3) for piece in line.split()] for line in f]
    return [sources[i:i + args.sources] for i in range(0, len(sources), args.sources)]


def worker(args):
    """Time the cells given for one engine (args.worker = 'ENGINE:THREADS:FOLDER:S,T;S,T...'); print a
    JSON row per cell as soon as it is measured."""
    engine, threads, folder, todo = args.worker.split(":", 3)
    threads = int(threads)
    translate = load_engine(engine, folder, threads, args)
    for cell in todo.split(";"):
        source_len, target_len = map(int, cell.split(","))
        if (source_len, target_len) == TEST_SPLIT:
            batches, target_len = test_split_batches(args, translate.symbols), None
        else:
            batches = [sources_for(source_len, args.sources, args.vocab, SPECIALS)]
        translate(batches[0][:1], target_len)  # warm-up: one source at this cell's lengths
        times = []
        while len(times) < args.repeats and sum(times) < args.cell_seconds:
            start = time.perf_counter()
            output_tokens = sum(translate(batch, target_len) for batch in batches)
            times.append(time.perf_counter() - start)
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # so far in this process
        print(json.dumps({"engine": engine, "threads": threads, "split": args.split, "S": source_len, "T": target_len or 0,
                          "seconds": statistics.median(times), "peak_mib": peak,
                          "output_tokens": int(output_tokens)}), flush=True)


def padded_left(sources, pad=1, eos=2):
    """Id lists with EOS appended, left-padded as fairseq batches sources: (B x S array, lengths)."""
    width = max(len(source) for source in sources) + 1
    batch = np.full((len(sources), width), pad, dtype=np.int64)
    for row, source in enumerate(sources):
        batch[row, width - len(source) - 1:] = [*source, eos]
    return batch, np.array([len(source) + 1 for source in sources])


def length_options(target_len):
    """(max_len_a, max_len_b, min_len) as fairseq takes them: |T| forced, or fairseq's defaults."""
    return (0, target_len, target_len) if target_len else (0, 200, 1)


def load_engine(engine, folder, threads, args):
    """A function (sources: id lists without EOS, |T| or None for natural lengths) -> output tokens
    (EOS excluded), checking forced lengths; its ``symbols`` are the source dictionary's."""
    symbols = source_symbols(args)
    if engine in ("fairseq", "memattn"):
        import torch
        from fairseq import checkpoint_utils
        from fairseq.sequence_generator import SequenceGenerator

        import fairseq_memattn

        fairseq_memattn.register()
        torch.set_num_threads(threads)
        models, _, task = checkpoint_utils.load_model_ensemble_and_task([os.path.join(folder, "checkpoint.pt")])
        model = models[0].eval()
        model.make_generation_fast_(need_attn=False)  # as fairseq-generate without --print-alignment

        def run(sources, target_len):
            tokens, lengths = padded_left(sources)
            max_len_a, max_len_b, min_len = length_options(target_len)
            generator = SequenceGenerator([model], task.target_dictionary, beam_size=args.beam, max_len_a=max_len_a,
                                          max_len_b=max_len_b, min_len=min_len)
            with torch.no_grad():
                hypos = generator.generate([model], {"net_input": {
                    "src_tokens": torch.from_numpy(tokens), "src_lengths": torch.from_numpy(lengths)}})
            return checked([len(h[0]["tokens"]) - 1 for h in hypos], target_len)
    elif engine.startswith("ct2"):
        import ctranslate2

        translator = ctranslate2.Translator(os.path.join(folder, engine), device="cpu",
                                            intra_threads=1 if args.split else threads,
                                            inter_threads=threads if args.split else 1)

        def run(sources, target_len):
            batch = [[symbols[i - SPECIALS] if i >= SPECIALS else "<unk>" for i in row] for row in sources]
            _, max_len_b, min_len = length_options(target_len)
            results = translator.translate_batch(batch, beam_size=args.beam, max_decoding_length=max_len_b,
                                                 min_decoding_length=min_len, max_input_length=0,
                                                 max_batch_size=part_size(sources, threads, args))
            return checked([len(r.hypotheses[0]) for r in results], target_len)
    else:
        from fairseq_memattn.deploy import Translator

        translator = Translator(os.path.join(folder, engine), threads=1 if args.split else threads)

        def run(sources, target_len):
            max_len_a, max_len_b, min_len = length_options(target_len)
            options = dict(beam=args.beam, max_len_a=max_len_a, max_len_b=max_len_b, min_len=min_len)
            if args.split:
                eos = translator.config["source_eos"]
                hypos = translator.translate_ids([[*map(int, row), eos] for row in sources],
                                                 batch_size=part_size(sources, threads, args), workers=threads,
                                                 **options)
            else:
                hypos = translator.generate(padded_left(sources)[0], **options)
            return checked([len(h[0]["tokens"]) - 1 for h in hypos], target_len)
    run.symbols = symbols
    return run


def part_size(sources, threads, args):
    """Sources per part of a batch: all of them, or with --split one part per thread (0: no limit)."""
    return -(-len(sources) // threads) if args.split else 0


def checked(output_lengths, target_len):
    assert target_len is None or all(n == target_len for n in output_lengths), output_lengths
    return sum(output_lengths)


# --- the report --------------------------------------------------------------------

def cell_label(source_len, target_len, columns=True):
    """A cell's |S| and |T|: as two table columns, or in words."""
    if (source_len, target_len) == TEST_SPLIT:
        return "test split | natural" if columns else "the test split, natural lengths"
    return f"{source_len} | {target_len}" if columns else f"|S| = {source_len}, |T| = {target_len}"


def table(rows, args):
    by = {(r["engine"], r["threads"], r["S"], r["T"]): r for r in rows}
    lines = []
    for threads in args.threads:
        engines = [e for e in args.engines if any(k[0] == e and k[1] == threads for k in by)]
        split = (f", each batch split in {threads} parts decoded at once, one thread each"
                 if args.split and threads > 1 else "")
        lines += [f"\n**{threads} thread{'s' if threads > 1 else ''}{split}** (seconds for {args.sources} sources, "
                  f"beam {args.beam}; peak MiB of the engine's process)\n",
                  "| \\|S\\| | \\|T\\| | " + " | ".join(ENGINES[e][0] for e in engines) + " |",
                  "|---|---|" + "---|" * len(engines)]
        for source_len, target_len in cells(args):
            values = [by.get((e, threads, source_len, target_len)) for e in engines]
            lines.append(f"| {cell_label(source_len, target_len)} | " + " | ".join(
                "-" if not v else f"{v['seconds']:.2f}" + (f" ({v['output_tokens']} tokens)" if args.trained else "")
                for v in values) + " |")
        peaks = [max((r["peak_mib"] for k, r in by.items() if k[0] == e and k[1] == threads), default=0)
                 for e in engines]
        lines.append("| peak MiB | | " + " | ".join(f"{p:.0f}" for p in peaks) + " |")
    return "\n".join(lines)


def engine_factors(rows, args):
    """Per cell and thread count, each engine's speed-up over fairseq-generate on the same model."""
    by = {(r["engine"], r["threads"], r["S"], r["T"]): r["seconds"] for r in rows}
    pairs = [(engine, base) for engine, base in (("ct2-f32", "fairseq"), ("ct2-int8", "fairseq"),
                                                 ("onnx-f32", "memattn"), ("onnx-int8", "memattn"))
             if engine in args.engines and base in args.engines]
    if not pairs:
        return ""
    lines = ["", "| threads | \\|S\\| | \\|T\\| | " + " | ".join(ENGINES[e][0] for e, _ in pairs) + " |",
             "|---|---|---|" + "---|" * len(pairs)]
    for threads in args.threads:
        for source_len, target_len in cells(args):
            factors = [(by.get((base, threads, source_len, target_len)), by.get((engine, threads, source_len, target_len)))
                       for engine, base in pairs]
            lines.append(f"| {threads} | {cell_label(source_len, target_len)} | "
                         + " | ".join(f"{b / e:.2f}x" if b and e else "-" for b, e in factors) + " |")
    return "\n".join(lines)


def ct2_backend(paths):
    """The GEMM backends CTranslate2 reports for this CPU (its CT2_VERBOSE log on loading a model)."""
    folders = [os.path.join(paths["transformer"], engine) for engine in ("ct2-f32", "ct2-int8")]
    folder = next((folder for folder in folders if os.path.isdir(folder)), None)
    if folder is None:
        return "not run"
    log = subprocess.run([sys.executable, "-c", f"import ctranslate2; ctranslate2.Translator({folder!r})"],
                         env={**os.environ, "CT2_VERBOSE": "1"}, capture_output=True, text=True).stderr
    found = {key: re.search(rf"{key}: (.+)", log) for key in ("CPU", "SGEMM backend", "GEMM_S8 backend")}
    return "backends: " + "; ".join(f"{key} {m.group(1).strip()}" for key, m in found.items() if m)


def targets(rows, args):
    """Per thread count and cell: each precision against its CTranslate2 counterpart, and the
    export's best time (either precision) over CTranslate2's best."""
    by = {(r["engine"], r["threads"], r["S"], r["T"]): r["seconds"] for r in rows}
    out = []
    for threads in args.threads:
        for source_len, target_len in cells(args):
            cell = cell_label(source_len, target_len, False)
            times = {engine: by.get((engine, threads, source_len, target_len)) for engine in ENGINES}
            for ours, theirs, label in (("onnx-int8", "ct2-int8", "int8"), ("onnx-f32", "ct2-f32", "float32")):
                a, b = times[ours], times[theirs]
                if a is not None and b is not None:
                    out.append(f"- {threads} thread(s), {label}, {cell}: exported memattn {a:.2f} s vs "
                               f"CTranslate2 {b:.2f} s ({b / a:.2f}x)")
            ours = [times[e] for e in ("onnx-f32", "onnx-int8") if times[e] is not None]
            theirs = [times[e] for e in ("ct2-f32", "ct2-int8") if times[e] is not None]
            if ours and theirs:
                out.append(f"- {threads} thread(s), {cell}: the export's best over CTranslate2's best "
                           f"**{min(ours) / min(theirs):.2f}**")
    return "\n".join(out)


def plot(rows, args, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(args.threads), figsize=(6 * len(args.threads), 4), squeeze=False)
    for ax, threads in zip(axes[0], args.threads):
        for engine in args.engines:
            points = sorted((r["S"], r["seconds"]) for r in rows if r["engine"] == engine
                            and r["threads"] == threads and r["T"] == args.target_len)
            if points:
                ax.plot(*zip(*points), marker="o", label=ENGINES[engine][0])
        ax.set(xlabel="|S| (source tokens)", ylabel=f"seconds ({args.sources} sources, beam {args.beam})",
               title=f"|T| = {args.target_len}, {threads} thread(s)", xscale="log", yscale="log")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def measure(engine, threads, folder, todo, argv, rows_path, settings, round_=0):
    """Run one engine's worker process on the cells todo; its rows (marked with the round and the
    settings), each appended to rows_path as it arrives (an interrupted grid resumes at the next cell)."""
    passed = list(argv if argv is not None else sys.argv[1:])
    spec = ";".join(f"{s},{t}" for s, t in todo)
    # in this process's folder: the paths passed on mean there what they mean here
    worker = subprocess.Popen([sys.executable, os.path.abspath(__file__), *passed, "--worker",
                               f"{engine}:{threads}:{folder}:{spec}"], stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": REPO, "OMP_NUM_THREADS": str(threads)})
    measured = []
    for line in worker.stdout:
        row = {**json.loads(line), "round": round_, "settings": settings}
        measured.append(row)
        if rows_path:
            with open(rows_path, "a") as f:
                f.write(json.dumps(row) + "\n")
        print(f"{engine} x{threads} |S|={row['S']} |T|={row['T']}: {row['seconds']:.2f} s", file=sys.stderr,
              flush=True)
    if worker.wait() != 0:
        sys.exit(f"{engine} with {threads} thread(s) failed (its error is above)")
    return measured


def median_over_rounds(rows):
    """One row per engine, thread count and cell: the median of its rounds' seconds, the largest
    peak memory."""
    by_cell = {}
    for row in rows:
        by_cell.setdefault((row["engine"], row["threads"], row["S"], row["T"]), []).append(row)
    return [{**same[0], "seconds": statistics.median(r["seconds"] for r in same),
             "peak_mib": max(r["peak_mib"] for r in same), "rounds": len(same)} for same in by_cell.values()]


def main(argv=None):
    args = parse_args(argv)
    log_to_stderr()
    if args.worker:
        return worker(args)
    paths = prepare(args)
    rows = args.earlier_rows
    for round_ in range(args.rounds):
        for threads in args.threads:
            for engine in args.engines:
                done = {(r["S"], r["T"]) for r in rows
                        if r["engine"] == engine and r["threads"] == threads and r.get("round", 0) == round_}
                todo = [cell for cell in cells(args) if cell not in done]
                if todo:
                    rows += measure(engine, threads, paths[ENGINES[engine][1]], todo, argv, args.rows,
                                    measured_with(args), round_)
    rows = median_over_rounds(rows)
    command = command_line("recipes.speed.deploy", argv)
    factors = engine_factors(rows, args)
    report = (f"# Decoding where users deploy\n\nCommand: `{command}`\n\n"
              + (f"Models: {' and '.join(args.trained)}, trained; the test split of {args.data}. " if args.trained else
                 f"Models: {SIZE_NAMES[args.size]}, untrained, {args.vocab} symbols; memattn K = {args.memory_k}. ")
              + f"CTranslate2 {ct2_backend(paths)}.\n"
              + table(rows, args)
              + ("\n\n## Each engine against fairseq on its own model\n\n"
                 "fairseq-generate's time over the engine's (CTranslate2 on `transformer`, the export on "
                 "`transformer_memattn`):\n" + factors if factors else "")
              + "\n\n## Exported against CTranslate2\n\n" + targets(rows, args) + "\n")
    print(report)
    if args.out:
        with open(args.out, "w") as f:
            f.write(report)
        if not args.trained:
            plot(rows, args, os.path.splitext(args.out)[0] + ".png")


if __name__ == "__main__":
    main()
