#!/usr/bin/env python
"""Decoding speed where users deploy: fairseq's `transformer` in fairseq-generate and in CTranslate2
(float32, int8), against `transformer_memattn` in fairseq-generate and exported to ONNX Runtime
(fairseq-memattn-export, fairseq_memattn.deploy.Translator; float32, int8). The full grid:

    python -m recipes.speed.deploy --source-lens 50 200 800 2000 --target-len 50 --copy-lens 200 800 \\
        --sources 20 --beam 5 --threads 1 2 --out results/speed/deploy.md

Untrained models (seed 0) as fairseq-train builds them (recipes/speed/transformer_decode.build),
3 + 3 layers of 256 units (4 heads, FFN 1024), 20 symbols; transformer_memattn with --memory-k
(attention read, shared memory). Each is saved as a fairseq checkpoint, converted with
`ct2-fairseq-converter ... --unsafe_deserialization [--quantization int8]` or exported with
`python -m fairseq_memattn.export [--quantize int8]`. Per cell: one batch of --sources random
sources of exactly |S| symbols, beam --beam, every output forced to |T| tokens (minimum = maximum
length), so all engines decode |T| + 1 steps; seconds of the whole translation (encoder included,
model loading excluded), median of --repeats (fewer once a cell has taken --cell-seconds) after a
warm-up on one source. Each engine and thread count runs in its own process, whose peak resident
memory (ru_maxrss, model loading included) is reported. Needs the optional extra deploy (onnx,
onnxruntime) and ctranslate2.
"""

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
PLUGIN = os.path.join(REPO, "fairseq_memattn")

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
    p.add_argument("--source-lens", nargs="*", type=int, default=[50, 200, 800, 2000], metavar="S")
    p.add_argument("--target-len", type=int, default=50)
    p.add_argument("--copy-lens", nargs="*", type=int, default=[200, 800], metavar="L", help="|T| = |S| = L")
    p.add_argument("--sources", type=int, default=20)
    p.add_argument("--beam", type=int, default=5)
    p.add_argument("--memory-k", type=int, default=32)
    p.add_argument("--threads", nargs="*", type=int, default=[1, 2])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--cell-seconds", type=float, default=60,
                   help="no further repeat once a cell's timed runs have taken this long")
    p.add_argument("--engines", nargs="*", default=list(ENGINES), choices=list(ENGINES))
    p.add_argument("--workdir", default="/tmp/memattn-deploy-bench", help="checkpoints and converted models")
    p.add_argument("--out", help="write the markdown here (and the plot beside it, .png)")
    p.add_argument("--rows", help="JSON lines of measured rows: read, and appended to cell by cell; a cell "
                                  "already there is not measured again (a long grid in several runs)")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    return p.parse_args(argv)


def cells(args):
    return [(s, args.target_len) for s in args.source_lens] + [(n, n) for n in args.copy_lens]


# --- models, once per workdir --------------------------------------------------------

def prepare(args):
    """Checkpoints, CTranslate2 models and ONNX exports in args.workdir (made when missing)."""
    import torch
    from fairseq import options, tasks
    from recipes.speed.transformer_decode import SIZES

    longest = max(max(s, t) for s, t in cells(args))
    models = {"transformer": ["--arch", "transformer"],
              "memattn": ["--arch", "transformer_memattn", "--memory-k", str(args.memory_k)]}
    paths = {}
    for name, arch in models.items():
        folder = os.path.join(args.workdir, f"{name}-{longest}")
        checkpoint = os.path.join(folder, "checkpoint.pt")
        if not os.path.exists(checkpoint):
            os.makedirs(folder, exist_ok=True)
            # as transformer_decode.build: the copy task's 20 symbols, positions for the longest cell
            memory = ["--memory-position-max-len", str(longest + 1)] if name == "memattn" else []
            train_args = options.parse_args_and_arch(options.get_training_parser(), [
                "--user-dir", PLUGIN, "--task", "copy_task", "--copy-max-len", str(longest), "--cpu",
                "--max-source-positions", str(longest + 2), "--max-target-positions", str(longest + 2),
                "--encoder-layers", "3", "--decoder-layers", "3", *SIZES, *arch, *memory])
            task = tasks.setup_task(train_args)
            torch.manual_seed(0)
            model = task.build_model(train_args)
            torch.save({"args": train_args, "model": model.state_dict(), "extra_state": {"train_iterator": {"epoch": 0}},
                        "optimizer_history": [{"criterion_name": "CrossEntropyCriterion", "optimizer_name": "Adam",
                                               "lr_scheduler_state": {"best": None}, "num_updates": 0}]}, checkpoint)
        paths[name] = folder
    converters = {"ct2-f32": [], "ct2-int8": ["--quantization", "int8"]}
    for engine, extra in converters.items():
        out = os.path.join(paths["transformer"], engine)
        if engine in args.engines and not os.path.exists(out):
            subprocess.run([os.path.join(os.path.dirname(sys.executable), "ct2-fairseq-converter"),
                            "--model_path", os.path.join(paths["transformer"], "checkpoint.pt"),
                            "--data_dir", paths["transformer"], "--user_dir", PLUGIN, "--output_dir", out,
                            "--unsafe_deserialization", *extra], check=True)
    for engine, extra in {"onnx-f32": [], "onnx-int8": ["--quantize", "int8"]}.items():
        out = os.path.join(paths["memattn"], engine)
        if engine in args.engines and not os.path.exists(out):
            subprocess.run([sys.executable, "-m", "fairseq_memattn.export",
                            os.path.join(paths["memattn"], "checkpoint.pt"), out, *extra], check=True, cwd=REPO)
    return paths


# --- one engine in its own process -----------------------------------------------------

def sources_for(length, n, symbols, offset):
    rng = np.random.default_rng(0)
    return rng.integers(offset, offset + symbols, size=(n, length))


def worker(args):
    """Time the cells given for one engine (args.worker = 'ENGINE:THREADS:FOLDER:S,T;S,T...'); print a
    JSON row per cell as soon as it is measured."""
    engine, threads, folder, todo = args.worker.split(":", 3)
    threads = int(threads)
    translate = load_engine(engine, folder, threads, args)
    for cell in todo.split(";"):
        source_len, target_len = map(int, cell.split(","))
        ids = sources_for(source_len, args.sources, 20, 4)  # the copy task's 20 symbols follow 4 specials
        translate(ids[:1], target_len)  # warm-up: one source at this cell's lengths
        times = []
        while len(times) < args.repeats and sum(times) < args.cell_seconds:
            start = time.perf_counter()
            translate(ids, target_len)
            times.append(time.perf_counter() - start)
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # so far in this process
        print(json.dumps({"engine": engine, "threads": threads, "S": source_len, "T": target_len,
                          "seconds": statistics.median(times), "peak_mib": peak}), flush=True)


def load_engine(engine, folder, threads, args):
    """A function (ids: n x |S| symbols without EOS, |T|) -> outputs, checking that each is |T| long."""
    eos = 2
    if engine in ("fairseq", "memattn"):
        import torch
        from fairseq import checkpoint_utils
        from fairseq.sequence_generator import SequenceGenerator

        import fairseq_memattn  # noqa: F401

        torch.set_num_threads(threads)
        models, _, task = checkpoint_utils.load_model_ensemble_and_task([os.path.join(folder, "checkpoint.pt")])
        model = models[0].eval()
        model.make_generation_fast_(need_attn=False)  # as fairseq-generate without --print-alignment

        def run(ids, target_len):
            tokens = torch.cat([torch.from_numpy(ids), torch.full((len(ids), 1), eos)], dim=1)
            generator = SequenceGenerator([model], task.target_dictionary, beam_size=args.beam, max_len_a=0,
                                          max_len_b=target_len, min_len=target_len)
            with torch.no_grad():
                hypos = generator.generate([model], {"net_input": {
                    "src_tokens": tokens, "src_lengths": torch.full((len(ids),), ids.shape[1] + 1)}})
            assert all(len(h[0]["tokens"]) == target_len + 1 for h in hypos)
        return run
    if engine.startswith("ct2"):
        import ctranslate2

        translator = ctranslate2.Translator(os.path.join(folder, engine), device="cpu", intra_threads=threads,
                                            inter_threads=1)
        symbols = [str(i) for i in range(20)]

        def run(ids, target_len):
            batch = [[symbols[i - 4] for i in row] for row in ids]
            results = translator.translate_batch(batch, beam_size=args.beam, max_decoding_length=target_len,
                                                 min_decoding_length=target_len, max_input_length=0)
            assert all(len(r.hypotheses[0]) == target_len for r in results)
        return run
    from fairseq_memattn.deploy import Translator

    translator = Translator(os.path.join(folder, engine), threads=threads)

    def run(ids, target_len):
        src = np.concatenate([ids, np.full((len(ids), 1), eos)], axis=1)
        hypos = translator.generate(src, beam=args.beam, max_len_a=0, max_len_b=target_len, min_len=target_len)
        assert all(len(h[0]["tokens"]) == target_len + 1 for h in hypos)
    return run


# --- the report --------------------------------------------------------------------

def table(rows, args):
    by = {(r["engine"], r["threads"], r["S"], r["T"]): r for r in rows}
    lines = []
    for threads in args.threads:
        engines = [e for e in args.engines if any(k[0] == e and k[1] == threads for k in by)]
        lines += [f"\n**{threads} thread{'s' if threads > 1 else ''}** (seconds for {args.sources} sources, "
                  f"beam {args.beam}; peak MiB of the engine's process)\n",
                  "| \\|S\\| | \\|T\\| | " + " | ".join(ENGINES[e][0] for e in engines) + " |",
                  "|---|---|" + "---|" * len(engines)]
        for source_len, target_len in cells(args):
            values = [by.get((e, threads, source_len, target_len)) for e in engines]
            lines.append(f"| {source_len} | {target_len} | "
                         + " | ".join(f"{v['seconds']:.2f}" if v else "-" for v in values) + " |")
        peaks = [max((r["peak_mib"] for k, r in by.items() if k[0] == e and k[1] == threads), default=0)
                 for e in engines]
        lines.append("| peak MiB | | " + " | ".join(f"{p:.0f}" for p in peaks) + " |")
    return "\n".join(lines)


def targets(rows, args):
    by = {(r["engine"], r["threads"], r["S"], r["T"]): r["seconds"] for r in rows}
    out = []
    for threads in args.threads:
        for ours, theirs, label in (("onnx-int8", "ct2-int8", "int8"), ("onnx-f32", "ct2-f32", "float32")):
            for source_len, target_len in cells(args):
                a, b = by.get((ours, threads, source_len, target_len)), by.get((theirs, threads, source_len, target_len))
                if a is None or b is None or source_len < 200:
                    continue
                out.append(f"- {threads} thread(s), {label}, |S| = {source_len}, |T| = {target_len}: exported "
                           f"memattn {a:.2f} s vs CTranslate2 {b:.2f} s ({b / a:.2f}x)")
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


def measure(engine, threads, folder, todo, argv, rows_path):
    """Run one engine's worker process on the cells todo; its rows, each appended to rows_path as
    it arrives (an interrupted grid resumes at the next cell)."""
    passed = list(argv if argv is not None else sys.argv[1:])
    spec = ";".join(f"{s},{t}" for s, t in todo)
    worker = subprocess.Popen([sys.executable, __file__, *passed, "--worker", f"{engine}:{threads}:{folder}:{spec}"],
                              stdout=subprocess.PIPE, text=True, cwd=REPO,
                              env={**os.environ, "PYTHONPATH": REPO, "OMP_NUM_THREADS": str(threads)})
    measured = []
    for line in worker.stdout:
        row = json.loads(line)
        measured.append(row)
        if rows_path:
            with open(rows_path, "a") as f:
                f.write(json.dumps(row) + "\n")
        print(f"{engine} x{threads} |S|={row['S']} |T|={row['T']}: {row['seconds']:.2f} s", file=sys.stderr,
              flush=True)
    if worker.wait() != 0:
        sys.exit(f"{engine} with {threads} thread(s) failed (its error is above)")
    return measured


def main(argv=None):
    args = parse_args(argv)
    if args.worker:
        return worker(args)
    paths = prepare(args)
    rows = []
    if args.rows and os.path.exists(args.rows):
        with open(args.rows) as f:
            rows = [json.loads(line) for line in f if line.strip()]
    for threads in args.threads:
        for engine in args.engines:
            done = {(r["S"], r["T"]) for r in rows if r["engine"] == engine and r["threads"] == threads}
            todo = [cell for cell in cells(args) if cell not in done]
            if todo:
                rows += measure(engine, threads, paths[ENGINES[engine][1]], todo, argv, args.rows)
    command = "python -m recipes.speed.deploy " + " ".join(argv if argv is not None else sys.argv[1:])
    report = (f"# Decoding where users deploy\n\nCommand: `{command}`\n\n"
              f"Models: 3 + 3 layers x 256 (4 heads, FFN 1024), untrained, 20 symbols; memattn K = {args.memory_k}.\n"
              + table(rows, args) + "\n\n## Exported against CTranslate2\n\n" + targets(rows, args) + "\n")
    print(report)
    if args.out:
        with open(args.out, "w") as f:
            f.write(report)
        plot(rows, args, os.path.splitext(args.out)[0] + ".png")


if __name__ == "__main__":
    main()
