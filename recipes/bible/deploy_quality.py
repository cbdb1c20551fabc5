#!/usr/bin/env python
"""What the export costs in quality on real data: a trained transformer_memattn checkpoint decoded
on the Bible test split (Romans) by fairseq-generate, and exported (float32 and int8) by
fairseq_memattn.deploy.Translator, with the same beam and lengths.

    OMP_NUM_THREADS=1 python -m recipes.bible.deploy_quality CHECKPOINT --data data/bible/en-fr \\
        --workdir exports --out results/bible/deploy_quality.md

fairseq-generate runs through ``recipes.wmt17.run evaluate`` (sacreBLEU on detokenized text); the
translator decodes the same binarized sources, batched the same way (sorted by length,
--batch-size sources). Reported: BLEU of each, how many float32 hypotheses equal fairseq's and
the largest score difference, and decoding seconds (model loading excluded).
"""

import argparse
import math
import os
import time

from fairseq_memattn.arg_types import positive_int
from recipes.bible.options import language_pair, prepared
from recipes.cli import check, command_line, existing_file, output_dir, output_file
from recipes.wmt17.data import check_pair


def fairseq_best(generate_output: str):
    """{sentence: (detokenized best hypothesis, its score in nats)} from fairseq-generate's H- lines."""
    best = {}
    for line in generate_output.splitlines():
        fields = line.split("\t")
        if fields[0].startswith("H-") and fields[0][2:].isdigit():
            best.setdefault(int(fields[0][2:]), (fields[2] if len(fields) > 2 else "",
                                                 float(fields[1]) * math.log(2)))
    return best


def pair_files(src: str, tgt: str, subset: str):
    """What the decoders read of prepare's output for the pair and SUBSET."""
    return (f"data-bin/dict.{src}.txt", f"data-bin/dict.{tgt}.txt", f"data-bin/{subset}.{src}-{tgt}.{src}.idx",
            f"data-bin/{subset}.{src}-{tgt}.{tgt}.idx", f"ref/{subset}.{tgt}", "spm.model")


def sources(data_bin: str, src: str, tgt: str, subset: str):
    """The binarized sources fairseq-generate reads (token ids, EOS last)."""
    from fairseq.data import data_utils

    dataset = data_utils.load_indexed_dataset(os.path.join(data_bin, f"{subset}.{src}-{tgt}.{src}"), None)
    return [dataset[i].tolist() for i in range(len(dataset))]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("checkpoint", type=existing_file, help="a transformer_memattn or lstm_memattn checkpoint")
    p.add_argument("--data", required=True, type=prepared(),  # its files, per --pair and --subset: below
                   help="recipes.wmt17.run prepare's output (data-bin/, ref/, spm.model)")
    p.add_argument("--pair", default="en-fr", type=language_pair)
    p.add_argument("--subset", choices=("valid", "test"), default="test")
    p.add_argument("--workdir", required=True, type=output_dir,
                   help="the exports and fairseq-generate's output go here")
    p.add_argument("--beam", type=positive_int, default=5)
    p.add_argument("--batch-size", type=positive_int, default=64)
    p.add_argument("--threads", type=positive_int, default=1)
    p.add_argument("--out", type=output_file, help="write the markdown report here")
    args = p.parse_args(argv)
    src, tgt = check_pair(args.pair)
    check(p, "--data", prepared(*pair_files(src, tgt, args.subset)), args.data)
    data_bin = os.path.join(args.data, "data-bin")

    import sacrebleu

    from fairseq_memattn.deploy import SentencePiece, Translator
    from fairseq_memattn.export import ExportError, export, load_checkpoint
    from recipes.wmt17.run import evaluate

    try:  # a model the export refuses, refused before fairseq-generate's pass rather than after it
        load_checkpoint(args.checkpoint, data_bin)
    except ExportError as error:
        p.error(f"argument checkpoint: {error}")
    with open(os.path.join(args.data, "ref", f"{args.subset}.{tgt}"), encoding="utf-8") as f:
        refs = [line.rstrip("\n") for line in f]
    reference = evaluate(args.pair, args.checkpoint, args.data, args.subset, os.path.join(args.workdir, "fairseq"),
                         gpus=0, runs=1, extra=["--beam", str(args.beam), "--batch-size", str(args.batch_size)])
    with open(os.path.join(args.workdir, "fairseq", f"generate.{args.subset}.txt"), encoding="utf-8") as f:
        fairseq_hyps = fairseq_best(f.read())

    spm = SentencePiece(os.path.join(args.data, "spm.model"))
    rows = [("fairseq-generate (PyTorch)", reference["bleu"], "", "", reference["decoding_seconds"])]
    for quantize in (None, "int8"):
        folder = os.path.join(args.workdir, quantize or "float32")
        if not os.path.exists(os.path.join(folder, "config.json")):
            export(args.checkpoint, folder, data=data_bin, quantize=quantize, force=True)  # an interrupted export
        translator = Translator(folder, threads=args.threads)
        ids = sources(data_bin, src, tgt, args.subset)
        start = time.perf_counter()
        results = translator.translate_ids(ids, batch_size=args.batch_size, beam=args.beam)
        seconds = time.perf_counter() - start
        hyps = [spm.decode(translator.tgt_dict.string(r[0]["tokens"])) for r in results]
        same = [i for i, h in enumerate(hyps) if fairseq_hyps.get(i, (None,))[0] == h]
        score_gap = max((abs(results[i][0]["score"] - fairseq_hyps[i][1]) for i in same), default=float("nan"))
        bleu = sacrebleu.metrics.BLEU().corpus_score(hyps, [refs]).score
        rows.append((f"exported, {quantize or 'float32'} (ONNX Runtime)", round(bleu, 2),
                     f"{len(same)} / {len(hyps)}", f"{score_gap:.1e}", round(seconds, 2)))
        with open(os.path.join(args.workdir, f"hyp.{args.subset}.{quantize or 'float32'}.{tgt}"), "w",
                  encoding="utf-8") as f:
            f.writelines(h + "\n" for h in hyps)

    command = command_line("recipes.bible.deploy_quality", argv)
    lines = [f"# The exported model on the Bible test split\n",
             f"Command: `{command}`\n",
             f"Checkpoint: `{args.checkpoint}`; {len(refs)} sentences ({args.subset}), beam {args.beam}, batches of "
             f"{args.batch_size} sources, {args.threads} thread(s); {reference['signature']}.\n",
             "| decoder | BLEU | best hypothesis equal to fairseq's | max \\|score difference\\| (nats) | seconds |",
             "|---|---:|---:|---:|---:|"]
    lines += [f"| {name} | {bleu} | {same} | {gap} | {seconds} |" for name, bleu, same, gap, seconds in rows]
    lines.append(f"\nint8 against float32: {rows[2][1] - rows[1][1]:+.2f} BLEU.")
    report = "\n".join(lines) + "\n"
    print(report)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            f.write(report)


if __name__ == "__main__":
    main()
