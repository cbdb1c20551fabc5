"""Do the tests catch a wrong formula? Each mutation below plants one plausible bug in the library;
the tests run against it, and the mutation is killed when one fails. The list and the last results
are in docs/testing.md.

    python tests/mutate.py                                  # the fast tier against each mutation
    python tests/mutate.py --only tanh scaling               # some of them
    python tests/mutate.py --pytest-args "tests/test_formulas.py -x -q"

The source file is restored after each run, also when the run is interrupted.
"""

import argparse
import os
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ATTENTION = "fairseq_memattn/modules/attention.py"
MEMORY = "fairseq_memattn/modules/memory.py"
READS = "fairseq_memattn/modules/memory_reads.py"
DEPLOY = "fairseq_memattn/deploy/translator.py"
SEARCH = "fairseq_memattn/deploy/search.py"
DECODER = "fairseq_memattn/deploy/decoder.py"
GRAPH = "fairseq_memattn/export/graph.py"
LSTM = "fairseq_memattn/models/lstm_memattn.py"
SHARING = "fairseq_memattn/modules/beam_sharing.py"
FAST_TIER = '-x -q -p no:cacheprovider -n auto --dist loadscope -m "not slow" tests'
# The exported models' tests train models, so they are in the full suite only: run just them.
EXPORT_TESTS = "-x -q -p no:cacheprovider tests/test_export.py -k "

# name: (file, what the library says, the bug, what the bug is[, what pytest runs: default the fast tier])
MUTATIONS = {
    "tanh": (ATTENTION, "hidden = torch.add(2 * projected_query.unsqueeze(2), keys.unsqueeze(1), alpha=2).sigmoid_()",
             "hidden = torch.add(2 * projected_query.unsqueeze(2), keys.unsqueeze(1), alpha=2)",
             "additive attention without its tanh"),
    "scaling": (ATTENTION, "self.scale = 1.0 / math.sqrt(encoder_dim) if scaled else 1.0",
                "self.scale = 1.0", "scaled dot product without the 1/sqrt(D)"),
    "window-centre": (MEMORY, "c = (torch.arange(K, device=r.device, dtype=r.dtype) + 0.5) / K",
                      "c = (torch.arange(K, device=r.device, dtype=r.dtype) + 1.0) / K",
                      "the position window's centres moved by half a stretch"),
    "alignment-heads": (READS, "align.mean(dim=0))", "align.sum(dim=0))",
                        "the Transformer's alignment summed over heads, not averaged"),
    "memory-index": (READS, "cache = self.project_memory(memories[:, self.memory_index].to(dtype))",
                     "cache = self.project_memory(memories[:, self.memory_index - 1].to(dtype))",
                     "each decoder layer reads the previous layer's memory (--memory-per-layer)"),
    "write-axis": (MEMORY, 'dim = -1 if self.encoder_normalize == "contexts" else 1',
                   'dim = 1 if self.encoder_normalize == "contexts" else -1',
                   "the write's softmax (Eq. 5) over the wrong axis"),
    "eq10": (MEMORY, "L = (1 - k) * (1 - s / max_len) + k * (s / max_len)",
             "L = (1 - k) * (s / max_len) + k * (1 - s / max_len)",
             "Eq. 10's position encodings with k and s/S crossed"),
    "eq9": (MEMORY, "scores = scores * pe  # Eq. 9: W_alpha h_s o l_s",
            "scores = scores + pe  # Eq. 9: W_alpha h_s o l_s",
            "Eq. 9's position encodings added, not multiplied"),
    "position-mean": (MEMORY, "total = total / lengths.view(-1, 1, 1).clamp_min(1)",
                      "total = total * lengths.view(-1, 1, 1).clamp_min(1)",
                      "--memory-position-normalize mean: each context's total multiplied by the length, "
                      "not divided"),
    "position-mean-onnx": (MEMORY, 'total = g.op("Div", total, words)', 'total = g.op("Mul", total, words)',
                           "the same in the export's graph",
                           EXPORT_TESTS + "lstm-feeding-pe"),
    "gate": (ATTENTION, "torch.sigmoid(self.gate(states)) * states", "torch.sigmoid(self.gate(states))",
             "gated linear attention's gate without the states (u_t = sigmoid(W s_t + b))"),
    "alignment-transpose": (MEMORY, "alpha_t = alpha.transpose(1, 2)", "alpha_t = alpha.flip(1).transpose(1, 2)",
                            "the alignment beta alpha^T (Sec. 5) with the source reversed"),
    "unkpen-sign": (SEARCH, "lprob_edits[:2, unk] = -unk_penalty", "lprob_edits[:2, unk] = unk_penalty",
                    "the translator's unknown-word penalty with its sign flipped",
                    EXPORT_TESTS + "test_unknown_word_penalty"),
    "encoder-runs-rows": (DEPLOY, "into = [rows[start: start + step]] +", "into = [rows[start: start + step][::-1]] +",
                          "the translator's encoder runs written to their sources in reverse",
                          EXPORT_TESTS + "test_encoder_runs_on_slices_of_a_batch"),
    "max-len-batch": (DEPLOY, 'self.max_len((src_tokens != self.config["source_pad"]).sum(axis=1),',
                      "self.max_len(np.full(len(src_tokens), src_tokens.shape[1]),",
                      "each source's maximum length from its batch's padded width, not its own tokens",
                      EXPORT_TESTS + "test_a_source_does_not_depend_on_its_batch"),
    "short-value-bias": (READS, "        if self.v_proj.bias is not None:\n            out = g.op(\"Add\", out, g.weight(self.v_proj.bias",
                         "        if False:\n            out = g.op(\"Add\", out, g.weight(self.v_proj.bias",
                         "a short source's memory read through alpha without the value bias",
                         EXPORT_TESTS + '"translator_equals_fairseq_generate and attention"'),
    "short-first-attention": (READS, 'out = g.op("Concat", out_short, out_other, axis=0)',
                              'out = g.op("Concat", out_other, out_short, axis=0)',
                              "a batch's short and long sources' attention reads joined in the wrong order",
                              EXPORT_TESTS + "short_and_long"),
    "short-first-mix": (MEMORY, 'g.op("MatMul", beta_other, contexts), axis=0)',
                        'g.op("MatMul", beta_other, contexts), axis=0) if False else g.op("Concat", '
                        'g.op("MatMul", beta_other, contexts), g.op("MatMul", g.op("MatMul", beta_short, '
                        'short.alpha_rows(g)[1]), short_contexts), axis=0)',
                        "the same for the mix read",
                        EXPORT_TESTS + "short_and_long"),
    "short-keep": (DECODER, "kept_short = sources < short_count", "kept_short = sources <= short_count",
                   "the sources left in a batch split between the two memory layouts one row off",
                   EXPORT_TESTS + "short_and_long"),
    "kept-memory": (DECODER, "value[sources[~kept_short] - short_count]",
                    "value[:len(sources[~kept_short])]",
                    "the memory of the first sources kept, not of those still decoded, when sentences leave the batch",
                    EXPORT_TESTS + "own_maximum_length"),
    "int8-weight-bits": (GRAPH, "WEIGHT_LEVELS = 63", "WEIGHT_LEVELS = 127",
                         "int8 weights in 8 bits, which overflow the 16-bit pair sums of CPUs without VNNI",
                         "-x -q -p no:cacheprovider tests/test_export_int8.py -k quantizes_each_row"),
    "lstm-reorder": (LSTM, "        if state is None:\n            return\n", "        if True:\n            return\n",
                     "the LSTM decoder's state left in place when the beam search reorders its hypotheses"),
    "shared-rows": (SHARING, "        return runs, int(lengths[0])",
                    "        return torch.arange(runs.numel(), device=runs.device), int(lengths[0])",
                    "a source's shared rows left where they were when finished sources leave the batch"),
    "read-reorder": (READS, "        saved = self.get_incremental_state(incremental_state, \"memory\")\n        if saved is None:",
                     "        saved = self.get_incremental_state(incremental_state, \"memory\")\n        if True:",
                     "the Transformer read's projected memory left in place when the beam search reorders"),
    "untied-output": (LSTM, "            self.output_projection.weight = self.embed_tokens.weight",
                      "            pass", "--share-decoder-input-output-embed leaves the output layer its own table"),
}


def apply(path, old, new):
    with open(path, encoding="utf-8") as f:
        text = f.read()
    if text.count(old) != 1:
        sys.exit(f"mutate: {old!r} occurs {text.count(old)} times in {path}, expected once")
    with open(path, "w", encoding="utf-8") as f:
        f.write(text.replace(old, new))
    return text


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", nargs="+", choices=sorted(MUTATIONS), help="these mutations (default all)")
    p.add_argument("--pytest-args", help="what pytest runs against each mutation (default: the mutation's own "
                                          "tests if it names them, else the fast tier, stopping at the first "
                                          "failure)")
    p.add_argument("--repo", default=REPO, help="the tree to mutate and test (default this one)")
    args = p.parse_args()
    rows = []
    for name in args.only or MUTATIONS:
        relative, old, new, what, *tests = MUTATIONS[name]
        pytest_args = args.pytest_args or (tests[0] if tests else FAST_TIER)
        path = os.path.join(args.repo, relative)
        original = apply(path, old, new)
        start = time.monotonic()
        try:
            result = subprocess.run(f"{sys.executable} -m pytest {pytest_args}", shell=True, cwd=args.repo,
                                    capture_output=True, text=True)
        finally:
            with open(path, "w", encoding="utf-8") as f:
                f.write(original)
        failed = [line.split(" ")[1] for line in result.stdout.splitlines()
                  if line.startswith(("FAILED ", "ERROR "))]
        verdict = "killed" if result.returncode != 0 and failed else (
            "survived" if result.returncode == 0 else f"pytest exit {result.returncode}")
        rows.append((name, what, verdict, failed[0] if failed else "", time.monotonic() - start))
        print(f"{name}: {verdict} in {rows[-1][4]:.0f} s {failed[:1]}", flush=True)
    print("\n| mutation | the bug | result | first failing test | seconds |\n|---|---|---|---|---:|")
    for name, what, verdict, test, seconds in rows:
        print(f"| {name} | {what} | {verdict} | {test} | {seconds:.0f} |")
    return 0 if all(r[2] == "killed" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
