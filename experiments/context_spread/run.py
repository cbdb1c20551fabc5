#!/usr/bin/env python
"""How distinct a transformer_memattn memory's contexts are, on the first sources of a split:
tokens per context, exp(entropy of alpha_k over the sentence) (1: C_k is one token's state; |x|: the
mean of all of them), and the mean cosine similarity between the K rows of C.

    python -m experiments.context_spread.run --data data/bible/en-fr \\
        checkpoints/bible/transformer_memattn/checkpoint_best.pt [--untrained]

--untrained adds the same architecture freshly initialised, with and without
--memory-position-window: where training starts from. The first checkpoint's options and task are
used for those. Needs a write normalised over time (each alpha_k sums to 1 over the sentence).
"""

import argparse
import os

import torch
import torch.nn.functional as F

from fairseq import checkpoint_utils

import fairseq_memattn
from fairseq_memattn.models.transformer_memattn import MemAttnTransformerModel

fairseq_memattn.register()  # the models, and torch.load's allowlist for their checkpoints


@torch.no_grad()
def spread(model, sources, lengths):
    """(tokens per context, mean cosine between rows), averaged over the sources."""
    model.eval()
    model.encoder.keep_alignment = True
    out = model.encoder(sources, lengths)
    alpha = out["alpha"][0][:, 0]  # B x S x K; padding has alpha = 0
    entropy = -(alpha * alpha.clamp_min(1e-12).log()).sum(dim=1)  # B x K
    rows = F.normalize(out["memory"][0][:, 0], dim=-1)
    K = rows.size(1)
    cosine = ((rows @ rows.transpose(1, 2)).sum(dim=(1, 2)) - K) / (K * (K - 1))
    return entropy.exp().mean().item(), cosine.mean().item()


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("checkpoints", nargs="+")
    p.add_argument("--data", required=True, help="recipes.wmt17.run prepare's output directory")
    p.add_argument("--split", default="valid")
    p.add_argument("--sources", type=int, default=64, help="how many sources of the split")
    p.add_argument("--untrained", action="store_true")
    args = p.parse_args(argv)
    rows, task, model_args = [], None, None
    for path in args.checkpoints:
        models, cfg, task = checkpoint_utils.load_model_ensemble_and_task(
            [path], arg_overrides={"data": os.path.join(args.data, "data-bin")})
        if not isinstance(models[0], MemAttnTransformerModel) or cfg.model.memory_encoder_normalize != "time":
            p.error(f"{path}: not a transformer_memattn with --memory-encoder-normalize time")
        rows.append((path, models[0]))
        model_args = model_args or cfg.model
    task.load_dataset(args.split)
    data = task.dataset(args.split)
    batch = data.collater([data[i] for i in range(min(args.sources, len(data)))])
    sources, lengths = batch["net_input"]["src_tokens"], batch["net_input"]["src_lengths"]
    if args.untrained:
        for window in (False, True):
            model_args.memory_position_window = window
            torch.manual_seed(1)
            rows.append((f"untrained, window {'on' if window else 'off'}",
                         MemAttnTransformerModel.build_model(model_args, task)))
    print(f"{len(lengths)} sources of {args.split}, {lengths.float().mean():.1f} tokens on average\n")
    print("| model | tokens per context | mean cosine between rows |\n| --- | ---: | ---: |")
    for name, model in rows:
        tokens, cosine = spread(model, sources, lengths)
        print(f"| {name} | {tokens:.2f} | {cosine:.3f} |")


if __name__ == "__main__":
    main()
