#!/usr/bin/env python
"""Peak memory of additive attention's forward + backward pass, whole target at once vs in chunks.

    OMP_NUM_THREADS=1 python -m experiments.additive_memory.run --out experiments/additive_memory/additive_memory.md

Without input feeding the decoder looks up all T target steps in one call, and Bahdanau's
f_att = v^T tanh(W_q h_i + W_s s_j) then needs a B x T x S x A tensor (modules/attention.py,
AdditiveAttention). At the paper's copy setting (B = 128, T = S = 200, 2 x 256 bi-LSTM
encoder, 256-unit decoder, A = 256) that is 5.2 GB in float32. Each configuration runs in its
own process: encoder states and decoder states (random, requiring gradients) -> build_memory ->
lookup -> backward of a sum of the contexts; the peak is the process's peak resident set
(getrusage) minus its resident set just before the forward pass (with glibc returning every
freed tensor to the system). On CUDA (--device cuda) it is
torch.cuda.max_memory_allocated minus the allocation before the forward pass.

--budgets lists score budgets in MiB ("none": the whole target at once, as before chunking);
a configuration whose whole-target tensor would exceed --max-whole-gb is not run (the machine
may not hold it): pass a larger value where it does.
"""

import argparse
import json
import os
import resource
import subprocess
import sys
import time



def resident_bytes():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def measure(batch, length, attention_dim, budget_mib, device):
    """One forward + backward pass in this process; returns peak bytes above the start and seconds."""
    import torch

    from fairseq_memattn.modules.attention import AdditiveAttention

    torch.manual_seed(0)
    encoder_dim, decoder_dim = 512, 256
    budget = None if budget_mib is None else int(budget_mib * 2**20)
    attention = AdditiveAttention(encoder_dim, decoder_dim, attention_dim, score_budget_bytes=budget)
    attention.to(device).train()
    states = torch.rand(batch, length, encoder_dim, device=device).mul_(2).sub_(1).requires_grad_()
    query = torch.rand(batch, length, decoder_dim, device=device).mul_(2).sub_(1).requires_grad_()
    mask = torch.zeros(batch, length, dtype=torch.bool, device=device)
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        start = torch.cuda.memory_allocated()
    else:
        start = resident_bytes()
    began = time.perf_counter()
    context, _ = attention.lookup(attention.build_memory(states, mask), query)
    context.sum().backward()
    if device == "cuda":
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() - start
    else:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - start
    return peak, time.perf_counter() - began


def run_child(batch, length, attention_dim, budget, device):
    command = [sys.executable, "-m", __spec__.name, "--child", json.dumps([batch, length, attention_dim, budget, device])]
    # glibc keeps freed blocks below its (growing) mmap threshold in the heap, so the resident
    # set would not fall when a tensor is freed; a fixed 128 KiB threshold unmaps every tensor.
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="131072")
    out = subprocess.run(command, capture_output=True, text=True, check=True, env=env).stdout
    return json.loads(out.strip().splitlines()[-1])


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batches", default="16,32,128", help="comma-separated batch sizes B")
    p.add_argument("--length", type=int, default=200, help="T = S")
    p.add_argument("--attention-dim", type=int, default=256, help="A")
    p.add_argument("--budgets", default="none,128", help="comma-separated MiB, or none")
    p.add_argument("--max-whole-gb", type=float, default=4.5,
                   help="skip runs whose B x T x S x A float32 tensor exceeds this many GB")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--out", help="write the table as markdown to this file")
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        print(json.dumps(measure(*json.loads(args.child))))
        return

    rows = []
    header = "| B | T = S | A | budget | B x T x S x A (float32) | peak memory, forward + backward | time |"
    print(header)
    print("|---|---|---|---|---|---|---|")
    for batch in map(int, args.batches.split(",")):
        whole = batch * args.length**2 * args.attention_dim * 4
        for budget in args.budgets.split(","):
            budget_mib = None if budget == "none" else float(budget)
            label = "none (whole target)" if budget_mib is None else f"{budget} MiB"
            if budget_mib is None and whole > args.max_whole_gb * 1e9:
                row = f"| {batch} | {args.length} | {args.attention_dim} | {label} | {whole / 1e9:.2f} GB | not run (> --max-whole-gb) | |"
            else:
                peak, seconds = run_child(batch, args.length, args.attention_dim, budget_mib, args.device)
                row = (f"| {batch} | {args.length} | {args.attention_dim} | {label} | {whole / 1e9:.2f} GB "
                       f"| {peak / 1e9:.2f} GB | {seconds:.1f} s |")
            print(row, flush=True)
            rows.append(row)
    if args.out:
        with open(args.out, "w") as f:
            f.write("# Additive attention: peak memory of forward + backward\n\n")
            f.write(f"Device {args.device}, OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}. "
                    "Command:\n\n    " + " ".join(["python", "-m", "experiments.additive_memory.run", *sys.argv[1:]])
                    + "\n\n" + header + "\n|---|---|---|---|---|---|---|\n" + "\n".join(rows) + "\n")


if __name__ == "__main__":
    main()
