"""What one decoder step costs against the hypotheses it decodes, for an export and for CTranslate2
running fairseq's ``transformer`` of the same size, on the same sentences: --sources sentences of
the test split of 20-30 pieces, beam --beam, every output forced to --length tokens, one thread, the
two engines interleaved in one process (each cell the best of --repeats), and how much of the export's
step is inside ONNX Runtime's decoder runs (the rest is the Python beam search, the bindings and the
encoder's one run, which is under 1 % of the steps here). Then ONNX Runtime's own
cost per node: chains of --nodes Reshapes (no arithmetic) and of broadcast Adds (a bias added to
rows of 128), run on 4 and 64 rows, as a decoder step of 1 or 16 sources at beam 4 has them.

    python -m experiments.step_cost.run EXPORT CT2_MODEL --data DATA [--sources 1 4 16 64] [--length 40]

EXPORT is a folder written by fairseq-memattn-export, CT2_MODEL one written by
ct2-fairseq-converter (recipes/speed/deploy.py --trained leaves both in its --workdir), DATA the
data folder of recipes.wmt17.run prepare (bpe/test.SRC). Needs the optional extra deploy and
ctranslate2.
"""

import argparse
import os
import time

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from fairseq_memattn.deploy import Translator


def test_sentences(data: str, source_lang: str):
    with open(os.path.join(data, "bpe", f"test.{source_lang}"), encoding="utf-8") as f:
        return [pieces for pieces in (line.split() for line in f) if 20 <= len(pieces) <= 30]


def best_seconds(run, repeats: int, inside=None) -> float:
    """The fastest of ``repeats`` runs; with ``inside`` (a list), the seconds it holds after that run."""
    run()  # warm-up
    best = (float("inf"), 0.0)
    for _ in range(repeats):
        if inside is not None:
            inside[0] = 0.0
        start = time.perf_counter()
        run()
        best = min(best, (time.perf_counter() - start, inside[0] if inside is not None else 0.0))
    if inside is not None:
        inside[0] = best[1]
    return best[0]


def time_decoder_runs(translator):
    """A one-item list that sums the seconds spent in the translator's decoder runs from then on."""
    inside, run = [0.0], translator.decoder.run_with_iobinding

    def timed(binding):
        start = time.perf_counter()
        run(binding)
        inside[0] += time.perf_counter() - start

    translator.decoder.run_with_iobinding = timed  # DecoderRun calls the session's attribute
    return inside


def step_costs(args):
    import ctranslate2

    translator = Translator(args.export, threads=1)
    ct2 = ctranslate2.Translator(args.ct2_model, device="cpu", intra_threads=1, inter_threads=1)
    dictionary = translator.src_dict
    sentences = test_sentences(args.data, args.source_lang)
    inside = time_decoder_runs(translator)
    print(f"| sources | hypotheses | export, ms per step | of which in ONNX Runtime's decoder run | "
          f"CTranslate2, ms per step | export / CTranslate2 | the decoder run alone / CTranslate2 |\n"
          f"|---:|---:|---:|---:|---:|---:|---:|")
    for count in args.sources:
        batch = sentences[:count]
        ids = [dictionary.encode(" ".join(sentence)) for sentence in batch]
        pieces = [[p if p in dictionary.index else "<unk>" for p in sentence] for sentence in batch]
        export = best_seconds(lambda: translator.translate_ids(ids, beam=args.beam, min_len=args.length,
                                                               max_len_b=args.length), args.repeats, inside)
        reference = best_seconds(lambda: ct2.translate_batch(pieces, beam_size=args.beam, max_input_length=0,
                                                             min_decoding_length=args.length,
                                                             max_decoding_length=args.length), args.repeats)
        steps = args.length + 1
        print(f"| {count} | {count * args.beam} | {export / steps * 1e3:.2f} | {inside[0] / steps * 1e3:.2f} "
              f"| {reference / steps * 1e3:.2f} | {export / reference:.2f} | {inside[0] / reference:.2f} |", flush=True)


def chain(op: str, nodes: int):
    """``nodes`` nodes of ``op`` one after the other on an N x 128 float input."""
    values, layers = "x", []
    for i in range(nodes):
        layers.append(helper.make_node(op, [values, "bias" if op == "Add" else "shape"], [f"v{i}"]))
        values = f"v{i}"
    constants = {"Add": numpy_helper.from_array(np.ones(128, np.float32), "bias"),
                 "Reshape": numpy_helper.from_array(np.array([-1, 128], np.int64), "shape")}
    graph = helper.make_graph(layers, op, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["rows", 128])],
                              [helper.make_tensor_value_info(values, TensorProto.FLOAT, ["rows", 128])],
                              [constants[op]])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL  # keep every node
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def node_costs(args):
    print(f"\n| node ({args.nodes} in a chain) | 4 rows, us per node | 64 rows, us per node |\n|---|---:|---:|")
    for op, label in (("Reshape", "Reshape"), ("Add", "Add of a bias (broadcast)")):
        session = chain(op, args.nodes)
        costs = []
        for rows in (4, 64):
            binding = session.io_binding()
            binding.bind_cpu_input("x", np.ones((rows, 128), np.float32))
            binding.bind_output(session.get_outputs()[0].name)
            calls = 200
            seconds = best_seconds(lambda: [session.run_with_iobinding(binding) for _ in range(calls)], args.repeats)
            costs.append(seconds / calls / args.nodes * 1e6)
        print(f"| {label} | {costs[0]:.2f} | {costs[1]:.2f} |")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("export", help="a folder written by fairseq-memattn-export")
    p.add_argument("ct2_model", help="fairseq's transformer of the same size, converted by ct2-fairseq-converter")
    p.add_argument("--data", required=True, help="the data folder (bpe/test.SRC)")
    p.add_argument("--source-lang", default="en")
    p.add_argument("--sources", type=int, nargs="+", default=[1, 4, 16, 64])
    p.add_argument("--beam", type=int, default=4)
    p.add_argument("--length", type=int, default=40, help="every output forced to this many tokens")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--nodes", type=int, default=400)
    args = p.parse_args(argv)
    print(f"{args.export} against {args.ct2_model}: beam {args.beam}, outputs of {args.length} tokens, 1 thread, "
          f"best of {args.repeats}, onnxruntime {ort.__version__}\n")
    step_costs(args)
    node_costs(args)


if __name__ == "__main__":
    main()
