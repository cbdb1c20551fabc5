"""The WMT'17 recipe's command line (Sec. 4.2, Tables 2 and 3): prepare, train, evaluate.

    python -m recipes.wmt17.run prepare PAIR [--out DIR] [--raw-dir DIR]
    python -m recipes.wmt17.run train PAIR CONFIG [--data DIR] [fairseq-train options]
    python -m recipes.wmt17.run evaluate PAIR CHECKPOINT [--data DIR] [--subset test]

(``recipes/wmt17/{prepare,train,evaluate}.sh`` call these.) ``prepare`` is the
data library ``data.py``: the WMT'17 download for en-cs, en-de, en-fi, en-tr,
or ``--raw-dir`` with a corpus of any pair, then BPE and fairseq-preprocess.
``train`` builds one fairseq-train command line from the paper's settings and
runs it; options it does not know go to fairseq-train last, so they override
the recipe's (e.g. ``--max-update 1000``). The best checkpoint is the one with
the highest validation BLEU (fairseq's ``--eval-bleu``, beam 10, BPE removed).
``evaluate`` decodes with beam 10, removes the BPE and scores the plain-text
output with sacreBLEU against the official reference, printing the signature
and fairseq-generate's decoding time (which, like Table 3's, excludes model
setup and data loading).
"""

import argparse
import importlib.util
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from typing import List, Optional, Tuple

import sacrebleu

from fairseq_memattn.arg_types import non_negative_int, positive_int
from recipes.cli import output_dir
from recipes.wmt17 import data as wmt17
from recipes.wmt17.data import PAIRS, VOCAB_SIZE, DataError, check_pair

# fairseq's --user-dir takes the plugin's folder: the installed package's, or the checkout's on PYTHONPATH
PLUGIN_DIR = importlib.util.find_spec("fairseq_memattn").submodule_search_locations[0]
SCORES = ("softmax", "sigmoid")
CONFIG = re.compile(r"(?:att|k(?P<k>32|64)(?P<pe>_pe)?(?:_(?P<enc>\w+?)-(?P<dec>\w+))?)")
# Table 2 reports the best of the four scoring combinations on validation (Sec. 4.2). Train
# all four (k64_pe_softmax-softmax, ..._softmax-sigmoid, ..._sigmoid-softmax, ..._sigmoid-sigmoid)
# to do the same; a name without a suffix trains encoder sigmoid / decoder softmax, Fig. 4's
# configuration and lstm_memattn_wmt's default (docs/wmt17.md, train.sh).
DEFAULT_SCORES = ("sigmoid", "softmax")
# The Transformer: fairseq's own ``transformer`` (the baseline) and ``transformer_memattn``
# (K rows written with the architecture's defaults; the decoder layers read them by attention, or
# by the paper's mix).
TRANSFORMER_CONFIG = re.compile(r"transformer(?:_k(?P<k>32|64)(?P<mix>_mix)?)?")
CONFIGS_HELP = ("att (standard attention), k32, k64, k32_pe, k64_pe (memory attention, K contexts, "
                "+ position encodings), each k... optionally with _ENC-DEC scoring functions, "
                f"ENC and DEC in {{{', '.join(SCORES)}}} (e.g. k64_pe_softmax-softmax; default "
                f"{'-'.join(DEFAULT_SCORES)}); transformer (fairseq's Transformer base), "
                "transformer_k32, transformer_k64 (transformer_memattn, attention read), "
                "transformer_k32_mix, transformer_k64_mix (the paper's mix read)")
# Longest BPE sequence kept in training and covered by the position encodings (S
# of Eq. 10); newstest sentences average 35 tokens.
MAX_POSITIONS = 128


def transformer_config_args(found) -> List[str]:
    """--arch and model options of a Transformer configuration (TRANSFORMER_CONFIG's match)."""
    if not found["k"]:
        return ["--arch", "transformer"]
    return ["--arch", "transformer_memattn", "--memory-k", found["k"],
            "--memory-read", "mix" if found["mix"] else "attention"]


def config_args(config: str) -> List[str]:
    """fairseq-train options, after --arch lstm_memattn_wmt, for one of the paper's
    configurations (Transformer configurations: transformer_config_args)."""
    found = CONFIG.fullmatch(config)
    if not found or (found["enc"] and not {found["enc"], found["dec"]} <= set(SCORES)):
        raise DataError(f"unknown configuration {config!r} (choose from {CONFIGS_HELP})")
    if config == "att":
        return ["--attention-type", "additive", "--no-memory-position-encoding"]
    args = ["--attention-type", "memory", "--memory-k", found["k"]]
    args += (["--memory-position-encoding", "--memory-position-max-len", str(MAX_POSITIONS)] if found["pe"]
             else ["--no-memory-position-encoding"])
    # Without a suffix: DEFAULT_SCORES (the architecture's default), not softmax/softmax, which
    # the paper found "consistently performs badly".
    enc, dec = (found["enc"], found["dec"]) if found["enc"] else DEFAULT_SCORES
    return args + ["--memory-encoder-score", enc, "--memory-decoder-score", dec]


def data_bin(data: str, pair: str) -> str:
    path = os.path.join(data, "data-bin")
    src, tgt = check_pair(pair)
    if not os.path.isfile(os.path.join(path, f"dict.{tgt}.txt")):
        own_corpus = "" if pair in PAIRS else " --raw-dir DIR"
        raise DataError(f"no binarized {pair} data in {path}: run recipes/wmt17/prepare.sh {pair} "
                        f"--out {data}{own_corpus} first")
    return path


def fairseq_tool(name: str) -> str:
    """fairseq's console script NAME: the one beside this Python, else the first on PATH (where
    fairseq was installed with pip's --target, as on the GPU machine)."""
    return shutil.which(name, path=os.path.dirname(sys.executable)) or shutil.which(name) or name


def fairseq_train_options(argv: List[str]) -> argparse.Namespace:
    """ARGV parsed as fairseq-train parses it, with this plugin's models and tasks: a ValueError
    with fairseq's message ("unrecognized arguments: --memory-kk 8") where it would refuse them.
    Seconds, not the minutes a training takes to fail."""
    import fairseq_memattn

    fairseq_memattn.register()
    from fairseq import options

    parser = options.get_training_parser()

    def refuse(message):
        raise ValueError(message)

    parser.error = refuse
    args, unknown = options.parse_args_and_arch(parser, argv, parse_known=True)
    if unknown:
        raise ValueError(f"unrecognized arguments: {' '.join(unknown)}")
    return args


def device_args(gpus: int) -> List[str]:
    """--fp16 and fairseq's own one-process-per-GPU spawning on GPUs, --cpu otherwise."""
    if gpus == 0:
        return ["--cpu"]
    return ["--fp16", "--distributed-world-size", str(gpus)]


# Sec. 4.1/4.2: Adam 1e-4, batch 128 (per worker), dropout 0.2 (the architecture's), up to 1M steps.
LSTM_TRAINING = ["--optimizer", "adam", "--lr", "1e-4", "--batch-size", "128", "--max-update", "1000000",
                 "--criterion", "cross_entropy"]
# fairseq's Transformer recipe (Vaswani et al. 2017; fairseq's examples/translation, WMT'14 en-de):
# Adam (0.9, 0.98), inverse square root schedule with 4000 warm-up steps to lr 5e-4, label
# smoothing 0.1, batches of up to 4096 tokens per worker, one embedding matrix for the source, the
# target and the output layer (prepare builds one joint dictionary), dropout 0.1 (the architecture's).
TRANSFORMER_TRAINING = ["--optimizer", "adam", "--adam-betas", "(0.9, 0.98)", "--lr", "5e-4",
                        "--lr-scheduler", "inverse_sqrt", "--warmup-updates", "4000",
                        "--warmup-init-lr", "1e-07", "--weight-decay", "0.0001", "--clip-norm", "0.0",
                        "--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.1",
                        "--max-tokens", "4096", "--max-update", "300000", "--share-all-embeddings"]


def train_command(pair: str, config: str, data: str, save_dir: str, gpus: int,
                  extra: List[str]) -> List[str]:
    src, tgt = check_pair(pair)
    transformer = TRANSFORMER_CONFIG.fullmatch(config)
    if transformer:
        model, training = transformer_config_args(transformer), TRANSFORMER_TRAINING
    else:
        model, training = ["--arch", "lstm_memattn_wmt", *config_args(config)], LSTM_TRAINING
    return [
        fairseq_tool("fairseq-train"), data_bin(data, pair), "--user-dir", PLUGIN_DIR,
        "--task", "translation", "--source-lang", src, "--target-lang", tgt, *model,
        "--max-source-positions", str(MAX_POSITIONS), "--max-target-positions", str(MAX_POSITIONS),
        *training, "--required-batch-size-multiple", "1",
        "--eval-bleu", "--eval-bleu-args", json.dumps({"beam": 10}),
        "--eval-bleu-remove-bpe", "sentencepiece", "--eval-bleu-detok", "space",
        "--best-checkpoint-metric", "bleu", "--maximize-best-checkpoint-metric",
        "--validate-interval-updates", "5000", "--save-interval-updates", "5000",
        "--keep-interval-updates", "5", "--no-epoch-checkpoints",
        "--skip-invalid-size-inputs-valid-test", "--save-dir", save_dir,
        *device_args(gpus), *extra,
    ]


def read_hypotheses(generate_output: str, n: int):
    """Detokenised hypotheses (D- lines) in sentence order; missing ones (skipped
    as too long) become empty lines, and their count is returned too."""
    found = {}
    for line in generate_output.splitlines():
        fields = line.split("\t")
        if fields[0].startswith("D-") and fields[0][2:].isdigit():
            found.setdefault(int(fields[0][2:]), fields[2] if len(fields) > 2 else "")
    return [found.get(i, "") for i in range(n)], n - len(found)


def decoding_stats(log: str) -> Tuple[float, float]:
    """(seconds, output tokens) of fairseq-generate's "Translated N sentences (T tokens) in Xs";
    its T counts the BPE tokens of the printed hypotheses, EOS included."""
    found = re.search(r"Translated [\d,]+ sentences \(([\d,]+) tokens\) in ([\d.]+)s", log)
    if not found:
        return float("nan"), float("nan")
    return float(found.group(2)), float(found.group(1).replace(",", ""))


def evaluate(pair: str, checkpoint: str, data: str, subset: str, out: str, gpus: int,
             runs: int, extra: List[str], timeout: Optional[float] = None) -> dict:
    """fairseq-generate on SUBSET, RUNS times (the decoding time is their mean), scored with
    sacreBLEU; a run still going after TIMEOUT seconds is killed and raises TimeoutError."""
    src, tgt = check_pair(pair)
    if not os.path.isfile(checkpoint):
        raise DataError(f"checkpoint {checkpoint} does not exist")
    binarized = data_bin(data, pair)
    reference = os.path.join(data, "ref", f"{subset}.{tgt}")
    if not os.path.isfile(reference):  # prepare keeps the target side's: data of TGT-SRC has none
        raise DataError(f"no reference translations {reference}: --data {data} was not prepared for {pair} "
                        f"(recipes/wmt17/prepare.sh {pair} --out DIR)")
    with open(reference, encoding="utf-8") as f:
        refs = [line.rstrip("\n") for line in f]
    command = [fairseq_tool("fairseq-generate"), binarized, "--user-dir", PLUGIN_DIR,
               "--task", "translation", "--source-lang", src, "--target-lang", tgt,
               "--path", checkpoint, "--gen-subset", subset, "--beam", "10",
               "--post-process", "sentencepiece", "--batch-size", "64",
               "--required-batch-size-multiple", "1", "--skip-invalid-size-inputs-valid-test",
               *(["--cpu"] if gpus == 0 else ["--fp16"]), *extra]
    print(shlex.join(command), flush=True)
    seconds, tokens = [], float("nan")
    for _ in range(runs):
        try:
            result = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            raise TimeoutError(f"fairseq-generate on {checkpoint} ({subset}) did not finish within {timeout:.0f} s")
        if result.returncode != 0:
            sys.stderr.write(result.stderr)
            raise SystemExit(f"wmt17 evaluate: fairseq-generate failed (exit {result.returncode})")
        run_seconds, tokens = decoding_stats(result.stdout + result.stderr)
        seconds.append(run_seconds)
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, f"generate.{subset}.txt"), "w", encoding="utf-8") as f:
        f.write(result.stdout)
    hyps, missing = read_hypotheses(result.stdout, len(refs))
    # Written whole, then renamed: a report scoring the folder meanwhile never reads half a file.
    hypotheses = os.path.join(out, f"hyp.{subset}.{tgt}")
    with open(hypotheses + ".part", "w", encoding="utf-8") as f:
        f.writelines(h + "\n" for h in hyps)
    os.replace(hypotheses + ".part", hypotheses)
    bleu = sacrebleu.metrics.BLEU()
    score = bleu.corpus_score(hyps, [refs])
    return {"bleu": round(score.score, 2), "score": str(score), "signature": str(bleu.get_signature()),
            "sentences": len(refs), "missing": missing,
            "decoding_seconds": round(sum(seconds) / len(seconds), 2), "output_tokens": tokens, "runs": runs}


def default_gpus() -> int:
    import torch

    return torch.cuda.device_count()


def add_prepare_parser(sub):
    prep = sub.add_parser("prepare", allow_abbrev=False,
                          help="download (or take --raw-dir), BPE, fairseq-preprocess")
    prep.add_argument("pair", help=f"SRC-TGT language codes: {', '.join(PAIRS)} to download the "
                      "WMT'17 data, any pair (e.g. en-fr) with --raw-dir")
    prep.add_argument("--out", type=output_dir, help="output directory (default data/wmt17/PAIR)")
    prep.add_argument("--raw-dir", help="plain-text {train,valid,test}.{SRC,TGT} to use instead "
                      "of downloading (for offline machines and other pairs)")
    prep.add_argument("--vocab-size", type=int, default=VOCAB_SIZE,
                      help=f"joint BPE vocabulary size (default {VOCAB_SIZE}, the paper's)")
    prep.add_argument("--workers", type=int, default=1, help="fairseq-preprocess workers")


def run_prepare(args):
    for name in ("vocab_size", "workers"):
        if getattr(args, name) < 1:
            raise DataError(f"invalid --{name.replace('_', '-')}: {getattr(args, name)} "
                            "(must be an integer >= 1)")
    if args.raw_dir is not None:  # "" too: not a folder, never the download
        wmt17.check_pair(args.pair)
        if not os.path.isdir(args.raw_dir):
            raise DataError(f"--raw-dir {args.raw_dir} is not a directory")
    else:
        wmt17.check_download_pair(args.pair)
    wmt17.prepare(args.pair, args.out or os.path.join("data", "wmt17", args.pair), args.raw_dir,
                  args.vocab_size, args.workers)


def main(argv: List[str] = None):
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="wmt17", allow_abbrev=False,
                                     description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    add_prepare_parser(sub)
    train = sub.add_parser("train", allow_abbrev=False,
                           help="fairseq-train one configuration; unknown options go to fairseq-train")
    train.add_argument("pair")
    train.add_argument("config", help=CONFIGS_HELP)
    train.add_argument("--save-dir", help="default checkpoints/wmt17/PAIR/CONFIG")
    train.add_argument("--dry-run", action="store_true", help="print the command, do not run it")
    ev = sub.add_parser("evaluate", allow_abbrev=False,
                        help="beam 10, sacreBLEU; unknown options go to fairseq-generate")
    ev.add_argument("pair")
    ev.add_argument("checkpoint")
    ev.add_argument("--subset", choices=("test", "valid"), default="test")
    ev.add_argument("--out", type=output_dir, help="where to write the hypotheses (default: the checkpoint's folder)")
    ev.add_argument("--runs", type=positive_int, default=1, help="decode N times, report the mean time (Table 3: 10)")
    for p in (train, ev):
        p.add_argument("--data", help="prepare's output directory (default data/wmt17/PAIR)")
        p.add_argument("--gpus", type=non_negative_int, default=None, help="GPUs to use (default: all; 0 = CPU)")
    args, extra = parser.parse_known_args(argv)
    if args.command == "prepare" and extra:  # only train and evaluate pass options on to fairseq
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    try:
        if args.command == "prepare":
            return run_prepare(args)
        data = args.data or os.path.join("data", "wmt17", args.pair)
        gpus = default_gpus() if args.gpus is None else args.gpus
        if args.command == "train":
            command = train_command(args.pair, args.config, data,
                                    args.save_dir or os.path.join("checkpoints", "wmt17", args.pair, args.config),
                                    gpus, extra)
            if not args.dry_run:
                print(shlex.join(command), flush=True)
                raise SystemExit(subprocess.run(command).returncode)
            try:  # what fairseq-train would refuse at once is refused here too, not printed as runnable
                fairseq_train_options(command[1:])
            except ValueError as error:
                parser.error(f"fairseq-train would refuse this command: {error}")
            print(shlex.join(command), flush=True)
            return
        result = evaluate(args.pair, args.checkpoint, data, args.subset,
                          args.out or os.path.dirname(os.path.abspath(args.checkpoint)), gpus,
                          args.runs, extra)
    except DataError as error:
        parser.error(str(error))
    print(result["score"])
    print(f"sacreBLEU signature: {result['signature']}")
    if result["missing"]:
        print(f"warning: {result['missing']} of {result['sentences']} sentences were longer than the "
              "model's limit and scored as empty hypotheses")
    print(f"decoding time: {result['decoding_seconds']} s for {result['sentences']} sentences "
          f"(fairseq-generate's timer, without model setup and data loading; mean of {result['runs']} runs)")
    print(json.dumps({k: result[k] for k in ("bleu", "sentences", "missing", "decoding_seconds", "output_tokens")}))


if __name__ == "__main__":
    main()
