#!/usr/bin/env python
"""Where lstm_memattn loses to lstm_att on the Bible en-fr data: from their outputs, how often a
hypothesis repeats itself and BLEU by source length; from a checkpoint, how its memory is written
and read (``read_statistics``, which recipes/bible/converge.py's GPU run computes).

    python -m recipes.bible.lstm_gap --data DATA --subset test \\
        --hyp lstm_att=results/bible/converged/gpu/lstm_att/average/hyp.test.fr \\
        --hyp lstm_memattn=results/bible/converged/gpu/lstm_memattn/average/hyp.test.fr

prints a markdown table: per model, the share of repeated trigrams (a trigram that already occurred
earlier in the same hypothesis), the share of hypotheses with one, and sacreBLEU for each band of
source length (BPE tokens of DATA/bpe/SUBSET.en), the reference's repetition beside them.
"""

import argparse
import math
import sys

import sacrebleu

from recipes.bible.options import prepared
from recipes.cli import duplicates, existing_file

BANDS = ((1, 20), (21, 40), (41, 60), (61, 10_000))  # source length in BPE tokens, both ends included
# What the Bible recipes read of recipes.wmt17.run prepare's output besides data-bin: the references
# (detokenised) and the BPE sources (``source_lengths``).
REFERENCES = ("ref/valid.fr", "ref/test.fr")
SOURCES = ("bpe/valid.en", "bpe/test.en")


def repeated_trigrams(line):
    """(repeated, all) trigrams of a whitespace-tokenised line: a repeat occurred earlier in it."""
    words = line.split()
    seen, repeated = set(), 0
    for trigram in zip(words, words[1:], words[2:]):
        repeated += trigram in seen
        seen.add(trigram)
    return repeated, max(0, len(words) - 2)


def repetition(lines):
    """(share of trigrams that are repeats, share of lines with one), in %."""
    counts = [repeated_trigrams(line) for line in lines]
    repeats, total = sum(r for r, _ in counts), sum(n for _, n in counts)
    return 100 * repeats / max(1, total), 100 * sum(r > 0 for r, _ in counts) / max(1, len(lines))


def bleu_by_band(hypotheses, references, source_lengths):
    """{band: (sentences, BLEU)} for each band of BANDS that holds a sentence."""
    result = {}
    for low, high in BANDS:
        picked = [i for i, n in enumerate(source_lengths) if low <= n <= high]
        if picked:
            score = sacrebleu.corpus_bleu([hypotheses[i] for i in picked], [[references[i] for i in picked]])
            result[(low, high)] = (len(picked), score.score)
    return result


def read_statistics(checkpoint, data_bin, subset="valid", sentences=200):
    """How a memory LSTM writes and reads its memory on the first SENTENCES of SUBSET, each
    teacher-forced on its reference, as means over sentences:

    * ``beta_entropy``: the entropy of the read weights beta at a step (Eq. 7, or the attention
      read's Eq. 2; normalised to sum to 1), over log K: 1 reads all K contexts alike, 0 reads one;
    * ``beta_max``: the largest normalised beta at a step;
    * ``alpha_entropy``: the entropy of each context's write weights alpha_k over the source
      (Eq. 5, normalised over time), over log |S|: 1 is an average of the whole sentence, 0 one token;
    * ``alpha_similarity``: the mean cosine between two contexts' write weights: 1 when all K
      contexts are the same mixture of the source, whatever beta reads."""
    import torch

    import fairseq_memattn

    fairseq_memattn.register()
    from fairseq import checkpoint_utils

    from fairseq_memattn.plot import ReadChoice, memory_weights

    [model], _, task = checkpoint_utils.load_model_ensemble_and_task([checkpoint], arg_overrides={"data": data_bin})
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = model.float().to(device).eval()
    task.load_dataset(subset)
    dataset = task.dataset(subset)
    count = min(sentences, len(dataset))
    totals = {}
    with torch.no_grad():
        for index in range(count):
            item = dataset[index]
            source = item["source"].unsqueeze(0).to(device)
            net_input = {"src_tokens": source, "src_lengths": torch.tensor([source.size(1)], device=device)}
            alphas, beta, _, _ = memory_weights(model, net_input, item["target"].to(device), ReadChoice())
            for name, value in memory_statistics(alphas[0], beta).items():
                totals[name] = totals.get(name, 0.0) + value
    return {name: round(total / count, 4) for name, total in totals.items()} | {"sentences": count}


def memory_statistics(alpha, beta):
    """``read_statistics``'s four figures for one sentence: alpha S x K, beta T x K."""
    import torch

    alpha, beta = alpha.double(), beta.double()
    p = beta / beta.sum(-1, keepdim=True).clamp_min(1e-12)
    q = alpha / alpha.sum(0, keepdim=True).clamp_min(1e-12)
    columns = torch.nn.functional.normalize(alpha.t(), dim=-1)  # K x S
    cosine = columns @ columns.t()
    K, S = cosine.size(0), q.size(0)
    return {"beta_entropy": (-(p * p.clamp_min(1e-12).log()).sum(-1)).mean().item() / math.log(K),
            "beta_max": p.max(-1).values.mean().item(),
            "alpha_entropy": (-(q * q.clamp_min(1e-12).log()).sum(0)).mean().item() / math.log(S) if S > 1 else 0.0,
            "alpha_similarity": ((cosine.sum() - cosine.diagonal().sum()) / (K * (K - 1))).item() if K > 1 else 1.0}


def read_lines(path):
    with open(path, encoding="utf-8") as f:
        return [line.rstrip("\n") for line in f]


def source_lengths(data, subset):
    """Each source's length in BPE tokens, EOS included, from prepare's DATA/bpe/SUBSET.en."""
    return [len(line.split()) + 1 for line in read_lines(f"{data}/bpe/{subset}.en")]


def table(outputs, references, source_lengths):
    """The markdown table of ``outputs`` ({label: hypothesis lines}) and the reference."""
    bands = [band for band in BANDS if any(band[0] <= n <= band[1] for n in source_lengths)]
    counts = {band: sum(band[0] <= n <= band[1] for n in source_lengths) for band in bands}
    names = [f"{low}-{high}" if high < 10_000 else f">{low - 1}" for low, high in bands]
    lines = ["| output | repeated trigrams % | lines with one % | BLEU | "
             + " | ".join(f"BLEU, \\|S\\| {name} ({counts[band]})" for name, band in zip(names, bands)) + " |",
             "| --- | ---: | ---: | ---: | " + " | ".join("---:" for _ in bands) + " |"]
    for label, hypotheses in outputs.items():
        if len(hypotheses) != len(references):
            sys.exit(f"--hyp {label}: {len(hypotheses)} lines, but the reference has {len(references)}")
        share, lines_with = repetition(hypotheses)
        bleu = sacrebleu.corpus_bleu(hypotheses, [references]).score
        by_band = bleu_by_band(hypotheses, references, source_lengths)
        lines.append(f"| {label} | {share:.1f} | {lines_with:.1f} | {bleu:.2f} | "
                     + " | ".join(f"{by_band[band][1]:.2f}" for band in bands) + " |")
    share, lines_with = repetition(references)
    lines.append(f"| reference | {share:.1f} | {lines_with:.1f} | | " + " | ".join("" for _ in bands) + " |")
    return "\n".join(lines)


def parse_output(text):
    label, sep, path = text.partition("=")
    if not sep or not label or not path:
        raise argparse.ArgumentTypeError(f"invalid --hyp: {text!r} (must be LABEL=PATH)")
    return label, existing_file(path)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", required=True, type=prepared(*REFERENCES, *SOURCES),
                   help="recipes.wmt17.run prepare's output folder (bpe/, ref/)")
    p.add_argument("--subset", choices=("valid", "test"), default="test")
    p.add_argument("--hyp", type=parse_output, action="append", required=True, metavar="LABEL=PATH",
                   help="a hypothesis file (detokenised, one line per source, in order); repeatable")
    args = p.parse_args(argv)
    twice = duplicates([label for label, _ in args.hyp])
    if twice:
        p.error(f"argument --hyp: {', '.join(twice)} given more than once (each LABEL names one output)")
    references = read_lines(f"{args.data}/ref/{args.subset}.fr")
    print(table({label: read_lines(path) for label, path in args.hyp}, references, source_lengths(args.data, args.subset)))


if __name__ == "__main__":
    main()
