#!/usr/bin/env python
"""Where an exported model's decoding time goes: ONNX Runtime's own profile of the encoder and
decoder graphs, summed by operator, for one batch of random sources with forced output lengths
(the cells of recipes/speed/deploy.py):

    python -m recipes.speed.profile_export MODEL [--source-len 100] [--target-len 50] \\
        [--sources 16] [--beam 4] [--threads 1] [--out results/speed/export_profile.md]

MODEL is a folder written by fairseq-memattn-export. The batch is translated once unprofiled (the
wall time reported) and once profiled. "Matrix products with weights" are the operators that
multiply by a constant weight (Gemm and MatMul fused with their bias, int8's
DynamicQuantizeMatMul, and MatMuls by a weight): the time an engine doing nothing else would still
spend. Needs the optional extra deploy.
"""

import argparse
import collections
import json
import os
import shutil
import tempfile
import time

import numpy as np

from fairseq_memattn.arg_types import positive_int
from recipes.cli import command_line, output_file
from recipes.speed.options import load_export

WEIGHT_OPS = ("Gemm", "FusedGemm", "DynamicQuantizeMatMul", "MatMulIntegerToFloat")


def optimized_copy(model: str, out: str) -> str:
    """The export in ``out`` with both graphs rewritten by ONNX Runtime's transformer optimizer."""
    from onnxruntime.transformers.optimizer import optimize_model

    shutil.copytree(model, out)
    for part in ("encoder", "decoder"):
        path = os.path.join(out, f"{part}.onnx")
        optimize_model(path, model_type="bert", num_heads=0, hidden_size=0, opt_level=1).save_model_to_file(path)
    return out


def parser():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model", help="a folder written by fairseq-memattn-export")
    p.add_argument("--source-len", type=positive_int, default=100)
    p.add_argument("--target-len", type=positive_int, default=50)
    p.add_argument("--sources", type=positive_int, default=16)
    p.add_argument("--beam", type=positive_int, default=4)
    p.add_argument("--threads", type=positive_int, default=1)
    p.add_argument("--top", type=positive_int, default=12, help="operators listed per graph")
    p.add_argument("--transformer-optimizer", action="store_true",
                   help="also time the graphs as ONNX Runtime's transformer optimizer rewrites them "
                        "(onnxruntime.transformers.optimizer, model type bert: fused LayerNorm, SkipLayerNorm, "
                        "attention where its patterns match)")
    p.add_argument("--out", type=output_file, help="write the markdown tables here too")
    return p


def operator_times(profile_path: str):
    """(time by operator, time of the products with weights), microseconds. ONNX Runtime prepacks a
    product's constant weight and lists only its other inputs: a MatMul with one input is one."""
    with open(profile_path) as f:
        events = json.load(f)
    by_op, weights = collections.Counter(), 0
    for event in events:
        if event.get("cat") != "Node" or not event["name"].endswith("_kernel_time"):
            continue
        op = event["args"]["op_name"]
        by_op[op] += event["dur"]
        if op in WEIGHT_OPS or (op in ("MatMul", "FusedMatMul") and len(event["args"]["input_type_shape"]) == 1):
            weights += event["dur"]
    return by_op, weights


def time_in_runtime(translator, src, options):
    """(wall seconds, seconds inside ONNX Runtime's run calls) of one translation: the rest is the
    Python beam search and the copies between numpy and ONNX Runtime."""
    import cProfile
    import pstats

    profile = cProfile.Profile()
    start = time.perf_counter()
    profile.runcall(translator.generate, src, **options)
    wall = time.perf_counter() - start
    inside = sum(cumulative for (_, _, name), (_, _, _, cumulative, _) in pstats.Stats(profile).stats.items()
                 if name.startswith("<built-in method onnxruntime.") and name.endswith((".run>", ".run_with_iobinding>")))
    return wall, inside


def forced_batch(translator, rng, sources: int, source_len: int, target_len: int, beam: int):
    """(SOURCES random sources of SOURCE_LEN symbols, the last one EOS; the options of
    translator.generate that force every output to TARGET_LEN tokens)."""
    src = rng.integers(4, len(translator.src_dict), size=(sources, source_len))
    src[:, -1] = translator.config["source_eos"]
    return src, dict(beam=beam, min_len=target_len, max_len_a=0, max_len_b=target_len)


def main(argv=None):
    p = parser()
    args = p.parse_args(argv)
    from fairseq_memattn.deploy.translator import Translator, default_session_options

    def translator(model=args.model, profile_prefix=None):
        options = default_session_options(args.threads)
        if profile_prefix:
            options.enable_profiling, options.profile_file_prefix = True, profile_prefix
        return Translator(model, session_options=options)

    plain, _ = load_export(p, args.model, args.threads)
    src, options = forced_batch(plain, np.random.default_rng(0), args.sources, args.source_len, args.target_len,
                                args.beam)
    # a source's EOS takes a position; an output's tokens may take all but one
    for flag, length, most in (("--source-len", args.source_len, plain.config["max_source_positions"]),
                               ("--target-len", args.target_len, plain.config["max_target_positions"] - 1)):
        if length > most:
            p.error(f"invalid {flag}: {length} (this model's positions allow at most {most})")

    def seconds(translator):
        translator.generate(src[:1], **options)  # warm-up
        start = time.perf_counter()
        translator.generate(src, **options)
        return time.perf_counter() - start

    wall = seconds(plain)
    python_wall, in_runtime = time_in_runtime(plain, src, options)
    with tempfile.TemporaryDirectory() as folder:
        optimized = ""
        if args.transformer_optimizer:
            rewritten = seconds(translator(optimized_copy(args.model, os.path.join(folder, "optimized"))))
            optimized = (f"; with the graphs as ONNX Runtime's transformer optimizer rewrites them {rewritten:.2f} s, "
                         f"then the plain graphs again {seconds(plain):.2f} s")
        profiled = translator(profile_prefix=os.path.join(folder, "profile"))
        profiled.generate(src, **options)
        tables, total_weights = [], 0
        for part in ("encoder", "decoder"):
            session = getattr(profiled, part)
            path = session.end_profiling()
            by_op, weights = operator_times(path)
            os.remove(path)  # the other graph's profile may take the same file name
            total, total_weights = sum(by_op.values()), total_weights + weights
            rows = [f"| {op} | {us / 1e3:.0f} | {100 * us / total:.1f} |" for op, us in by_op.most_common(args.top)]
            tables.append(f"**{part}.onnx**: {total / 1e6:.2f} s in its operators, of which matrix products with "
                          f"weights {weights / 1e6:.2f} s\n\n| operator | ms | % |\n|---|---:|---:|\n" + "\n".join(rows))
    config = plain.config
    head = (f"{args.model} ({config['model']}, {'int8' if config.get('quantize') else 'float32'}), "
            f"{args.sources} sources of {args.source_len} tokens, beam {args.beam}, every output "
            f"{args.target_len} tokens, {args.threads} thread(s): {wall:.2f} s unprofiled{optimized}; under "
            f"Python's profiler {python_wall:.3f} s, of which {in_runtime:.3f} s in ONNX Runtime's run calls and "
            f"{python_wall - in_runtime:.3f} s in the Python beam search and the copies around them; matrix "
            f"products with weights {total_weights / 1e6:.2f} s of it (ONNX Runtime's profile)")
    report = head + "\n\n" + "\n\n".join(tables)
    print(report)
    if args.out:
        command = command_line("recipes.speed.profile_export", argv)
        with open(args.out, "w", encoding="utf-8") as f:
            f.write(f"# Where the exported model's time goes\n\nCommand: `{command}`\n\n{report}\n")


if __name__ == "__main__":
    main()
