#!/usr/bin/env python
"""How a converted transformer's write should start, chosen on validation loss before any
fine-tuning: W_alpha at zero (the scores are the position window alone) or as
transformer_memattn initialises it (random), each window w_k some fraction of a row's stretch
of the source (1/K). Measured on the valid split and on its sentences joined in groups of
--group (sources longer than K), beside the transformer itself.

    python -m recipes.convert.write_start --data DATA --source CHECKPOINT --out OUT   # OUT/write_start.md
"""

import argparse
import os
import tempfile

from fairseq_memattn.arg_types import integer_at_least
from recipes.cli import existing_file, folder_with, output_dir
from recipes.convert import run as convert_run

# (W_alpha, window width in rows): fairseq-memattn-convert's two starts and the widths around them
VARIANTS = [("random", 1.0), ("zero", 1.0), ("zero", 2 / 3), ("zero", 0.5), ("zero", 0.4), ("zero", 1 / 3),
            ("zero", 0.25), ("random", 0.5)]


def grouped_valid(data, folder, group):
    """FOLDER laid out as prepare's DATA, its valid split DATA's with every GROUP consecutive
    sentences joined into one (on both sides, so the pairs stay parallel)."""
    os.makedirs(folder, exist_ok=True)
    for lang in ("en", "fr"):
        with open(os.path.join(data, "bpe", f"valid.{lang}"), encoding="utf-8") as f:
            lines = [line.strip() for line in f]
        with open(os.path.join(folder, f"valid.{lang}"), "w", encoding="utf-8") as f:
            f.writelines(" ".join(lines[i:i + group]) + "\n" for i in range(0, len(lines) - group + 1, group))
    convert_run.binarize(data, folder, "valid", folder)
    with open(os.path.join(folder, "valid.en"), encoding="utf-8") as f:
        lengths = sorted(len(line.split()) + 1 for line in f)
    return lengths[len(lengths) // 2]


def write_variants(source, data, folder):
    """Each VARIANTS checkpoint in FOLDER: the conversion (compare.py's memory options) with the
    write's start replaced."""
    import torch

    import fairseq_memattn
    from fairseq_memattn import convert

    fairseq_memattn.register()
    state = convert.load_source(source, os.path.join(data, "data-bin"))
    options = {"memory_k": 64, "memory_position_window": True}
    source_model, target, args = convert.convert_model(state, options, source, start="model")
    random_alpha = [writer.W_alpha.weight.detach().clone() for writer in target.encoder.writers]
    paths = []
    for alpha, width in VARIANTS:
        convert.start_write_nearest(target, width)
        if alpha == "random":
            with torch.no_grad():
                for writer, weight in zip(target.encoder.writers, random_alpha):
                    writer.W_alpha.weight.copy_(weight)
        paths.append(os.path.join(folder, f"{alpha}_{width:.3f}.pt"))
        convert.save_checkpoint(convert.converted_checkpoint(state, source_model, target, args), paths[-1])
    return paths


def main(argv=None):
    os.environ["OMP_NUM_THREADS"] = "1"
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", required=True, type=folder_with("data-bin", "bpe/valid.en", "bpe/valid.fr"),
                   help="recipes.wmt17.run prepare's output directory")
    p.add_argument("--source", required=True, type=existing_file, help="the transformer's checkpoint")
    p.add_argument("--out", required=True, type=output_dir, help="where write_start.md goes")
    p.add_argument("--group", type=integer_at_least(2), default=4,
                   help="sentences joined into each long source (default 4)")
    args = p.parse_args(argv)
    with open(os.path.join(args.data, "bpe", "valid.en"), encoding="utf-8") as f:
        sentences = sum(1 for _ in f)
    if args.group > sentences:
        p.error(f"argument --group: {args.group} is more than the {sentences} sentences of the valid split")
    from fairseq_memattn.convert import ConvertError

    with tempfile.TemporaryDirectory() as tmp:
        try:  # first: a checkpoint that does not convert is refused before any measurement
            variants = write_variants(args.source, args.data, tmp)
        except ConvertError as error:
            p.error(str(error))
        median = grouped_valid(args.data, os.path.join(tmp, "grouped"), args.group)
        losses = [(label, convert_run.validation_loss(path, args.data)[0],
                   convert_run.validation_loss(path, os.path.join(tmp, "grouped"))[0])
                  for label, path in [("the transformer", args.source)] + list(zip(
                      [f"W_alpha {alpha}, w_k = {width:.2f} rows" for alpha, width in VARIANTS], variants))]
    lines = ["# Where the converted write starts", "",
             f"`fairseq-memattn-convert` of {args.source} (K = 64, the position window), before any "
             "fine-tuning; the write's W_alpha at zero or random (transformer_memattn's initialisation), each "
             "window's width w_k in rows (1/K of the source each). Validation loss (label-smoothed) by "
             f"fairseq-validate, on the valid split and on its sentences joined {args.group} by {args.group} "
             f"(median |S| {median} tokens, EOS included). `--write-start model` is the first row, `nearest` "
             "the row at 0.50 rows with W_alpha zero. Made by:", "", "```bash",
             f"python -m recipes.convert.write_start --data DATA --source {args.source} --out OUT --group {args.group}",
             "```", "", f"| write | valid loss | valid loss, {args.group} joined |", "| --- | ---: | ---: |"]
    lines += [f"| {label} | {loss:.3f} | {grouped:.3f} |" for label, loss, grouped in losses]
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "write_start.md"), "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
