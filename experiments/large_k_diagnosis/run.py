#!/usr/bin/env python
"""Why does softmax/softmax memory attention fail at large K on the copy task?

    OMP_NUM_THREADS=1 python -m experiments.large_k_diagnosis.run --out experiments/large_k_diagnosis/large_k_diagnosis.csv

Trains the copy task briefly (by default L = 20 and the 3,000-update CPU preset's model and
optimiser: 2x128 units, 64-d embeddings, Adam 3e-3, clipping at 1, batch 64) for each K, encoder
normalisation and scoring combination (default softmax/softmax), and logs every --every updates,
averaged over those updates:
  * loss (base 2, per target token, as fairseq logs it);
  * |C_k|: the mean L2 norm of the memory's rows C_k = sum_t alpha_tk s_t (Eq. 4), and the mean
    alpha mass of a row, sum_t alpha_tk (|S|/K on average when alpha is a softmax over contexts);
  * |c|: the mean norm of the decoder's context c = sum_k beta_k C_k (Eq. 6), beside |h|, the
    decoder state it is concatenated with in the output layer (Eq. 3);
  * the entropy of beta in units of log K (1 = uniform over the K contexts);
  * the gradient norm of each parameter group before clipping, and the fraction of updates clipped.
The model and training loop are fairseq's (task, model, criterion's loss); only the optimiser step
is written out here, to read the per-group gradient norms before clipping.
"""

import argparse
import csv
import math
import os
import sys
import time

import torch
import torch.nn.functional as F
from fairseq import options, tasks, utils

GROUPS = ["encoder.embed_tokens", "encoder.lstm", "encoder.attention.W_alpha", "encoder.attention.W_beta",
          "decoder.embed_tokens", "decoder.bridge", "decoder.lstm", "decoder.output_projection"]


def build(k, normalize, scores, length, seed, lr):
    plugin = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "fairseq_memattn")
    parser = options.get_training_parser()
    args = options.parse_args_and_arch(parser, [
        "--user-dir", plugin, "--task", "copy_task", "--copy-max-len", str(length),
        "--arch", "lstm_memattn", "--memory-k", str(k), "--memory-encoder-normalize", normalize,
        "--memory-encoder-score", scores[0], "--memory-decoder-score", scores[1],
        "--encoder-hidden-size", "128", "--decoder-hidden-size", "128", "--encoder-embed-dim", "64",
        "--decoder-embed-dim", "64", "--dropout", "0", "--optimizer", "adam", "--lr", str(lr),
        "--batch-size", "64", "--seed", str(seed), "--cpu"])
    utils.import_user_module(args)
    torch.manual_seed(seed)
    task = tasks.setup_task(args)
    task.load_dataset("train")
    model = task.build_model(args)
    batches = task.get_batch_iterator(task.dataset("train"), max_sentences=64, seed=seed,
                                      required_batch_size_multiple=1).next_epoch_itr(shuffle=True)
    return model, batches


def instrument(model, stats):
    """Record |C_k|, the alpha mass per row, |c|, |h| and beta's entropy at every forward."""
    attention = model.encoder.attention
    build_memory, lookup = attention.build_memory, attention.lookup

    def recording_build_memory(states, padding_mask):
        memory = build_memory(states, padding_mask)
        with torch.no_grad():
            alpha = attention.write_weights(states, padding_mask)  # B x S x K
            stats["row_norm"].append(memory["contexts"].norm(dim=-1).mean().item())
            stats["row_mass"].append(alpha.sum(dim=1).mean().item())
            stats["state_norm"].append(states.norm(dim=-1)[~padding_mask].mean().item())
        return memory

    def recording_lookup(memory, query):
        context, weights = lookup(memory, query)
        with torch.no_grad():
            beta = attention.decoder_scores(query)
            entropy = -(beta.clamp_min(1e-12).log() * beta).sum(-1) / math.log(max(attention.num_contexts, 2))
            stats["context_norm"].append(context.norm(dim=-1).mean().item())
            stats["hidden_norm"].append(query.norm(dim=-1).mean().item())
            stats["beta_entropy"].append(entropy.mean().item())
        return context, weights

    attention.build_memory, attention.lookup = recording_build_memory, recording_lookup


def train(k, normalize, scores, args):
    model, batches = build(k, normalize, scores, args.length, args.seed, args.lr)
    stats = {}
    instrument(model, stats)
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    rows, start = [], time.time()
    for update, sample in enumerate(batches, start=1):
        if update > args.updates:
            break
        if update % args.every == 1 or args.every == 1:
            stats.clear()
            stats.update({name: [] for name in ["row_norm", "row_mass", "state_norm", "context_norm",
                                                "hidden_norm", "beta_entropy", "loss", "clipped"]})
            stats.update({group: [] for group in GROUPS})
        net_output = model(**sample["net_input"])
        lprobs = F.log_softmax(net_output[0], dim=-1)
        loss = F.nll_loss(lprobs.view(-1, lprobs.size(-1)), sample["target"].view(-1),
                          ignore_index=model.decoder.dictionary.pad())  # mean per token, as fairseq's
        optimizer.zero_grad()
        loss.backward()
        for group in GROUPS:
            grads = [p.grad for n, p in model.named_parameters() if n.startswith(group) and p.grad is not None]
            stats[group].append(torch.norm(torch.stack([g.norm() for g in grads])).item() if grads else 0.0)
        total = torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
        stats["clipped"].append(float(total > args.clip))
        stats["loss"].append(loss.item() / math.log(2))
        optimizer.step()
        if update % args.every == 0:
            row = dict(K=k, normalize=normalize, scores="/".join(scores), L=args.length, lr=args.lr, clip=args.clip, updates=update,
                       seconds=round(time.time() - start),
                       **{name: sum(v) / len(v) for name, v in stats.items()})
            rows.append(row)
            print(" ".join(f"{n}={v:.3g}" if isinstance(v, float) else f"{n}={v}" for n, v in row.items()),
                  flush=True)
    return rows


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ks", type=int, nargs="+", default=[1, 4, 16, 32, 64])
    parser.add_argument("--normalize", nargs="+", default=["contexts", "time"], choices=["contexts", "time"])
    parser.add_argument("--scores", nargs="+", default=["softmax/softmax"],
                        choices=["softmax/softmax", "softmax/sigmoid", "sigmoid/softmax", "sigmoid/sigmoid"],
                        help="encoder/decoder scoring functions")
    parser.add_argument("--length", type=int, default=20)
    parser.add_argument("--updates", type=int, default=300)
    parser.add_argument("--every", type=int, default=50)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--clip", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", default="large_k_diagnosis.csv")
    args = parser.parse_args(argv)
    if args.updates < args.every or args.every < 1:
        parser.error(f"--updates {args.updates} / --every {args.every}: need 1 <= every <= updates")
    rows = []
    for scores in args.scores:
        for normalize in args.normalize:
            for k in args.ks:
                rows += train(k, normalize, tuple(scores.split("/")), args)
                with open(args.out, "w", newline="") as f:  # after every configuration
                    writer = csv.DictWriter(f, fieldnames=list(rows[0]))
                    writer.writeheader()
                    writer.writerows(rows)


if __name__ == "__main__":
    sys.exit(main())
