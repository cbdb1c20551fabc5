"""One product x W + b with a constant W, timed in ONNX Runtime three ways: float32, the export's int8
(``Graph.product``: 7-bit weights per column, inputs per row) and ONNX Runtime's MatMulNBits with
8-bit weights per block of the input dimension and int8 compute (accuracy_level 4, which quantizes
the input per row and block, so that no row depends on its batch). Prints each one's median time,
its error relative to the float64 product, and whether each row comes out the same alone:

    python -m experiments.int8_products.run [--rows 64 256] [--threads 1]
"""

import argparse
import time

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from fairseq_memattn.export.graph import FLOAT, Graph

SHAPES = [(128, 128), (128, 384), (128, 512), (512, 128), (128, 7816), (256, 1024), (1024, 256), (256, 8000)]


def session(model, threads):
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def export_product(weight, bias, quantize, threads):
    g = Graph("product", quantize)
    x = g.input("x", FLOAT, [None, weight.shape[0]])
    g.output(g.op("Add", g.product(x, weight), g.weight(bias, "bias")), "y", FLOAT, [None, weight.shape[1]])
    return session(g.model(), threads)


def matmul_nbits(weight, bias, block, threads):
    """MatMulNBits, bits 8: B is [N, K / block, block] uint8 around 128, one scale per column and block."""
    k, n = weight.shape
    blocks = weight.T.reshape(n, k // block, block)
    scale = np.maximum(np.abs(blocks).max(-1), 1e-30) / 127
    quantized = (np.rint(blocks / scale[..., None]) + 128).astype(np.uint8)
    node = helper.make_node("MatMulNBits", ["x", "B", "scales", "", "", "bias"], ["y"], domain="com.microsoft",
                            K=k, N=n, bits=8, block_size=block, accuracy_level=4)
    graph = helper.make_graph([node], "nbits", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, k])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, n])],
                              [numpy_helper.from_array(quantized, "B"),
                               numpy_helper.from_array(scale.reshape(-1).astype(np.float32), "scales"),
                               numpy_helper.from_array(bias, "bias")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    model.ir_version = 8
    return session(model, threads)


def median_us(run, x, repeats=7, calls=20):
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            run(None, {"x": x})
        times.append((time.perf_counter() - start) / calls * 1e6)
    return float(np.median(times))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", nargs="*", type=int, default=[64, 256])
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args(argv)
    rng = np.random.default_rng(0)
    kinds = ["float32", "export int8", "MatMulNBits 8-bit, block 32", "MatMulNBits 8-bit, block 128"]
    print(f"| rows x in x out | {' | '.join(f'{kind} µs (rel. error)' for kind in kinds)} | rows the same alone |")
    print("|---" * (len(kinds) + 2) + "|")
    for rows in args.rows:
        for k, n in SHAPES:
            weight = (rng.standard_normal((k, n)) * 0.05).astype(np.float32)
            bias = rng.standard_normal(n).astype(np.float32)
            x = rng.standard_normal((rows, k)).astype(np.float32)
            x[1] *= 50  # one row far larger than the others
            sessions = [export_product(weight, bias, None, args.threads), export_product(weight, bias, "int8", args.threads),
                        matmul_nbits(weight, bias, 32, args.threads), matmul_nbits(weight, bias, min(128, k), args.threads)]
            exact = x.astype(np.float64) @ weight + bias
            cells, alike = [], []
            for s in sessions:
                y = s.run(None, {"x": x})[0]
                error = np.abs(y - exact).max() / np.abs(exact).max()
                cells.append(f"{median_us(s.run, x):.0f} ({error:.4f})")
                alone = np.concatenate([s.run(None, {"x": x[i:i + 1]})[0] for i in range(rows)])
                alike.append("yes" if np.array_equal(alone, y) else "no")
            print(f"| {rows} x {k} x {n} | {' | '.join(cells)} | {', '.join(alike)} |")


if __name__ == "__main__":
    main()
