"""Measure what the tests that assert a trained result reach, over seeds and thread counts.

    python tests/measure_trained.py cli transformer distributed distributed_transformer reliability \\
        wmt17 wmt17_transformer quickstart export export_variants hub \\
        --seeds 1 2 3 4 5 --threads 1 2 --out /tmp/measure

Each test fixes its seed, but another machine (CPU, thread count, BLAS build) ends a short
training like another seed would; a threshold belongs below the worst of such runs, with a margin.
For every (test, seed, threads) this runs the test's own training command (read from the test
module, so it cannot drift) with that seed under OMP_NUM_THREADS, prints one JSON line (also
appended to OUT/results.jsonl; runs already there are skipped) and ends with min / median / max
per test and metric. One run at a time: use two processes with disjoint --seeds for two cores.
"""

import argparse
import json
import os
import re
import socket
import statistics
import subprocess
import sys
from pathlib import Path

import torch

TESTS_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(TESTS_DIR))

import test_cli  # noqa: E402
import test_distributed  # noqa: E402
import test_export  # noqa: E402
import test_hub  # noqa: E402
import test_reliability  # noqa: E402
import test_transformer_memattn  # noqa: E402
import test_wmt17  # noqa: E402
import wmt17_toy  # noqa: E402
from conftest import BIN, PLUGIN_DIR, REPO, clean_env  # noqa: E402

from fairseq_memattn.score import read_generate_output, score  # noqa: E402


def with_seed(args, seed):
    args = list(args)
    args[args.index("--seed") + 1] = str(seed)
    return args


def run(tool, *args, env, stdin=None):
    result = subprocess.run([os.path.join(BIN, tool), *map(str, args)], env=env, input=stdin,
                            capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"{tool} failed:\n{result.stderr[-3000:]}")
    return result


def train_and_copy(test, run_dir, seed, env):
    """A copy-task test module's training, then its beam-5 decoding with --min-len 0, scored."""
    run("fairseq-train", "--user-dir", PLUGIN_DIR, *test.TASK, *test.MODEL,
        *with_seed(test.TRAIN, seed), "--save-dir", run_dir, env=env)
    checkpoint = run_dir / "checkpoint_best.pt"
    out = run("fairseq-generate", "--user-dir", PLUGIN_DIR, *test.TASK, "--path", checkpoint,
              "--gen-subset", "test", "--beam", "5", "--batch-size", "32",
              "--required-batch-size-multiple", "1", "--cpu", "--min-len", "0", env=env).stdout
    return checkpoint, out, score(*read_generate_output(out.splitlines()))


def interactive_copies(test, checkpoint, env, lines, *options):
    """Whether fairseq-interactive, beam 5, copies each of ``lines``."""
    out = run("fairseq-interactive", "--user-dir", PLUGIN_DIR, *test.TASK, "--path", checkpoint,
              "--beam", "5", "--cpu", *options, stdin="".join(f"{line}\n" for line in lines), env=env).stdout
    return re.findall(r"^H-\d+\t\S+\t(.*)$", out, re.M) == lines


def measure_transformer(run_dir, seed, env):
    """test_transformer_memattn.py: BLEU / accuracy of beam 5 with --min-len 0."""
    checkpoint, _, result = train_and_copy(test_transformer_memattn, run_dir, seed, env)
    return {"bleu": result["bleu"], "accuracy": result["accuracy"],
            "interactive_copies": interactive_copies(test_transformer_memattn, checkpoint, env, ["3 1 4 1 5"])}


def measure_cli(run_dir, seed, env):
    """test_cli.py: BLEU / accuracy of beam 5 with --min-len 0, empty sources decoded empty, best valid
    loss, interactive."""
    checkpoint, out, result = train_and_copy(test_cli, run_dir, seed, env)
    # fairseq-validate recomputes exactly this: the best checkpoint's validation loss
    valid_loss = torch.load(checkpoint, weights_only=True)["extra_state"]["best"]
    sources, hypotheses = test_cli.sources_and_hypotheses(out)
    empty = [i for i, source in sources.items() if source == ""]
    return {"bleu": result["bleu"], "accuracy": result["accuracy"], "valid_loss": valid_loss,
            "empty_sources_decoded_empty": all(hypotheses[i] == "" for i in empty),
            "interactive_copies": interactive_copies(test_cli, checkpoint, env, ["3 1 4 1 5", ""], "--min-len", "0")}


def measure_distributed(run_dir, seed, env, train=test_distributed.TRAIN):
    """test_distributed.py: two gloo ranks started by hand; the loss curve's statistics."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = [subprocess.Popen(
        [os.path.join(BIN, "fairseq-train"), *with_seed(train, seed),
         *test_distributed.CPU_FLAGS, "--save-dir", str(run_dir), "--distributed-rank", str(rank),
         "--distributed-init-method", f"tcp://127.0.0.1:{port}"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for rank in (0, 1)]
    logs = [proc.communicate()[0] for proc in procs]
    if any(proc.returncode for proc in procs):
        raise RuntimeError(f"distributed training failed:\n{logs[0][-3000:]}")
    curve = test_distributed.losses(logs[0])
    return {"first": curve[0], "last_mean": test_distributed.final_loss(curve),
            "drop": round(curve[0] - test_distributed.final_loss(curve), 3), "curve": curve}


def measure_distributed_transformer(run_dir, seed, env):
    """test_distributed.py's transformer_memattn (TRANSFORMER_TRAIN): the same statistics."""
    return measure_distributed(run_dir, seed, env, train=test_distributed.TRANSFORMER_TRAIN)


def measure_reliability(run_dir, seed, env):
    """test_reliability.py's bad-data training: the loss of each epoch."""
    data = run_dir.parent / "reliability-data-bin"
    if not data.exists():
        raw = run_dir.parent / "reliability-raw"
        raw.mkdir(parents=True, exist_ok=True)
        test_reliability.write_parallel(raw / "train", test_reliability.TRAIN_PAIRS)
        test_reliability.write_parallel(raw / "valid", test_reliability.TRAIN_PAIRS[:16])
        run("fairseq-preprocess", "-s", "src", "-t", "tgt", "--joined-dictionary", "--workers", "1",
            "--trainpref", raw / "train", "--validpref", raw / "valid", "--destdir", data, env=env)
    log = run("fairseq-train", data, *with_seed(test_reliability.BAD_DATA_TRAIN, seed),
              "--save-dir", run_dir, env=env).stdout
    losses = [float(x) for x in re.findall(r"\| train \| epoch \d+ \| loss ([\d.]+)", log)]
    return {"final_loss": losses[-1], "losses": losses}


def measure_wmt17(run_dir, seed, env):
    """test_wmt17.py: prepare (once), train.sh, evaluate.sh and fairseq-interactive."""
    env = {**env, "PYTHON": os.path.join(BIN, "python")}
    recipe = [os.path.join(REPO, "recipes", "wmt17")]
    out = run_dir.parent / "wmt17-en-de"
    if not (out / "data-bin").exists():
        raw = test_wmt17.write_corpus(run_dir.parent / "wmt17-raw")
        subprocess.run(["bash", f"{recipe[0]}/prepare.sh", "en-de", "--raw-dir", str(raw), "--out", str(out),
                        "--vocab-size", "200"], env=env, check=True, capture_output=True)
    subprocess.run(["bash", f"{recipe[0]}/train.sh", "en-de", "k32_pe_sigmoid-softmax", "--data", str(out),
                    "--gpus", "0", "--save-dir", str(run_dir), *with_seed(test_wmt17.TINY_MODEL, seed)],
                   env=env, check=True, capture_output=True)
    checkpoint = run_dir / "checkpoint_best.pt"
    evaluated = subprocess.run(["bash", f"{recipe[0]}/evaluate.sh", "en-de", str(checkpoint), "--data",
                                str(out), "--gpus", "0"], env=env, check=True, capture_output=True, text=True)
    result = json.loads(evaluated.stdout.strip().splitlines()[-1])
    hyps = (run_dir / "hyp.test.de").read_text(encoding="utf-8").splitlines()
    out_text = run("fairseq-interactive", out / "data-bin", "--user-dir", PLUGIN_DIR, "--path", checkpoint,
                   "--source-lang", "en", "--target-lang", "de", "--bpe", "sentencepiece",
                   "--sentencepiece-model", out / "spm.model", "--beam", "10", "--cpu",
                   stdin="The dog sees the house.\nRed bird.\n", env=env).stdout
    translations = re.findall(r"^D-\d+\t\S+\t(.*)$", out_text, re.M)
    return {"bleu": result["bleu"], "plain_sentences": sum(h.endswith(".") and h[:1].isupper() for h in hyps),
            "hund": bool(translations) and "Hund" in translations[0]}


def measure_wmt17_transformer(run_dir, seed, env):
    """test_wmt17.py's transformer_k64 at toy sizes (conftest.own_pair_transformer): test BLEU."""
    run_dir.mkdir(parents=True, exist_ok=True)
    done = wmt17_toy.prepare_train_evaluate(
        run_dir, "en-fr", with_seed(wmt17_toy.TINY_TRANSFORMER, seed), threads=env["OMP_NUM_THREADS"],
        config=wmt17_toy.TRANSFORMER_CONFIG)
    return {"bleu": json.loads(done["evaluated"].stdout.strip().splitlines()[-1])["bleu"]}


def measure_hub(run_dir, seed, env):
    """test_hub.py's LSTM (conftest.own_pair_recipe: the toy en-fr recipe): non-empty translations,
    and the source positions the hard alignment of SENTENCES[2] uses."""
    run_dir.mkdir(parents=True, exist_ok=True)
    wmt17_toy.prepare_train_evaluate(run_dir, "en-fr", with_seed(wmt17_toy.TINY_MODEL, seed),
                                     threads=env["OMP_NUM_THREADS"])
    model = test_hub.from_pretrained(test_hub.MemAttnLSTMModel, run_dir, wmt17_toy.CONFIG)
    best = model.generate(model.encode(test_hub.SENTENCES[2]), beam=10, print_alignment="hard")[0]
    return {"translations_non_empty": test_hub.plain_text(model.translate(test_hub.SENTENCES, beam=10)),
            "aligned_source_positions": test_hub.aligned_source_positions(best["alignment"])}


def measure_quickstart(run_dir, seed, env):
    """recipes/copy/quickstart.sh without its setup step: test BLEU / accuracy."""
    subprocess.run(["bash", os.path.join(REPO, "recipes", "copy", "quickstart.sh"), "--seed", str(seed)],
                   env={**env, "SKIP_SETUP": "1", "OUT": str(run_dir),
                        "PATH": BIN + os.pathsep + env["PATH"]},
                   check=True, capture_output=True)
    return json.loads((run_dir / "score.json").read_text())


def in_environment(run_dir, env):
    """``run_dir`` made, and ``env``'s thread count in os.environ, where test_export's commands run."""
    os.environ["OMP_NUM_THREADS"] = env["OMP_NUM_THREADS"]
    run_dir.mkdir(parents=True, exist_ok=True)
    return run_dir


def measure_export(run_dir, seed, env):
    """test_export.py's "attention" model: the int8 export against the float32 one, <unk> under
    --unkpen."""
    checkpoint, float32 = test_export.train_and_export(in_environment(run_dir, env), "attention", "--seed", str(seed))
    test_export.export(str(checkpoint), str(run_dir / "int8"), quantize="int8")
    same, score_difference = test_export.int8_agreement(float32, run_dir / "int8")
    _, out = test_export.generate(checkpoint, *test_export.UNK_SEARCH)
    return {"int8_same": same, "int8_score_difference": round(score_difference, 4),
            "unk_hypotheses": len(test_export.UNK_HYPOTHESIS.findall(out))}


def measure_export_variants(run_dir, seed, env):
    """test_translator_equals_fairseq_generate: the distinct hypothesis lengths of each variant."""
    lengths = {}
    for variant in test_export.VARIANTS:
        checkpoint = test_export.train(in_environment(run_dir / variant, env),
                                       [*test_export.VARIANTS[variant], "--seed", str(seed)])  # flags win
        expected, _ = test_export.generate(checkpoint, *test_export.SEARCH, "--batch-size", "8")
        lengths[variant] = len(test_export.hypothesis_lengths(expected))
    return lengths


MEASURES = {"cli": measure_cli, "distributed": measure_distributed,
            "distributed_transformer": measure_distributed_transformer, "reliability": measure_reliability,
            "wmt17": measure_wmt17, "wmt17_transformer": measure_wmt17_transformer,
            "quickstart": measure_quickstart, "transformer": measure_transformer,
            "export": measure_export, "hub": measure_hub, "export_variants": measure_export_variants}


def summary(rows):
    """min / median / max of every numeric metric, per test."""
    lines = []
    for test in MEASURES:
        runs = [r for r in rows if r["test"] == test]
        for metric, value in (runs[0].items() if runs else ()):
            if isinstance(value, (int, float)) and not isinstance(value, bool) and metric not in (
                    "seed", "threads"):
                values = [r[metric] for r in runs]
                lines.append(f"{test:12s} {metric:16s} n={len(values):2d}  min {min(values):8.3f}  "
                             f"median {statistics.median(values):8.3f}  max {max(values):8.3f}")
            elif isinstance(value, bool):
                lines.append(f"{test:12s} {metric:16s} true in {sum(r[metric] for r in runs)} of {len(runs)}")
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("tests", nargs="+", choices=sorted(MEASURES))
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3, 4, 5])
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--out", type=Path, required=True, help="directory for the runs and results.jsonl")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    results = args.out / "results.jsonl"
    rows = [json.loads(line) for line in results.read_text().splitlines()] if results.exists() else []
    for test in args.tests:
        for seed in args.seeds:
            for threads in args.threads:
                if any((r["test"], r["seed"], r["threads"]) == (test, seed, threads) for r in rows):
                    continue
                env = clean_env(OMP_NUM_THREADS=str(threads))
                row = {"test": test, "seed": seed, "threads": threads,
                       **MEASURES[test](args.out / f"{test}_s{seed}_t{threads}", seed, env)}
                print(json.dumps(row), flush=True)
                with open(results, "a") as f:
                    f.write(json.dumps(row) + "\n")
                rows.append(row)
    print(summary([r for r in rows if r["test"] in args.tests]))


if __name__ == "__main__":
    main()
