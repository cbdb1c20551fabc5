"""A small builder of ONNX graphs from a model's weights: named initializers,
one method per operator pattern the exported models use (linear layers,
layer norms, multi-head attention pieces), float32, or with ``quantize="int8"``
int8 products with constant weights (``Graph.product``) and int8 embedding tables."""

import hashlib

import numpy as np
import onnx
import torch
from onnx import TensorProto, helper, numpy_helper

OPSET = 17  # LayerNormalization
FLOAT, INT64 = TensorProto.FLOAT, TensorProto.INT64
TINY = np.float32(1e-30)  # the least scale of a weight: an all-zero column quantizes to zeros, not NaN
WEIGHT_LEVELS = 63  # int8 weights in 7 bits (Graph.product)


def as_array(tensor) -> np.ndarray:
    return tensor.detach().to(torch.float32).cpu().numpy() if isinstance(tensor, torch.Tensor) else tensor


def all_nodes(nodes):
    """The nodes and those of their branches (If), depth first."""
    for node in nodes:
        yield node
        for attribute in node.attribute:
            if attribute.type == onnx.AttributeProto.GRAPH:
                yield from all_nodes(attribute.g.node)


class Graph:
    def __init__(self, name: str, quantize: str = None, parent: "Graph" = None):
        """``parent``: the graph that a branch of its ``If`` (``Graph.branch``) is built for; the
        branch reads the parent's values, and its weights and constants go to the outermost graph."""
        self.name = name
        self.quantize = quantize
        self.root = parent.root if parent is not None else self
        self.nodes, self.initializers, self.inputs, self.outputs = [], [], [], []
        self.count = 0
        self.stored = {}  # (dtype, shape, digest) -> initializer name
        self.renamed = {}  # node outputs renamed to graph outputs
        # x -> (x in uint8, its rows' max |x|): one quantization for every product of x
        self.int8_rows = dict(parent.int8_rows) if parent is not None else {}

    def fresh(self, hint: str) -> str:
        self.root.count += 1  # names are unique across a graph and its branches, as ONNX wants
        return f"{hint}_{self.root.count}"

    def weight(self, array, hint: str) -> str:
        """An initializer, one per distinct value: both branches of an If project with the same
        weights, and the file holds them once."""
        array = np.array(as_array(array), order="C")
        key = (array.dtype.str, array.shape, hashlib.sha256(array.tobytes()).digest())
        stored = self.root.stored
        if key not in stored:
            stored[key] = self.fresh(hint)
            self.root.initializers.append(numpy_helper.from_array(array, stored[key]))
        return stored[key]

    def const(self, value, dtype=np.float32) -> str:
        """A small constant."""
        return self.weight(np.asarray(value, dtype=dtype), "const")

    def cast(self, x: str, dtype) -> str:
        """x as numpy's ``dtype`` (np.float32, np.int64, np.int32)."""
        return self.op("Cast", x, to=helper.np_dtype_to_tensor_dtype(np.dtype(dtype)))

    def branch(self, condition: str, then_body, else_body) -> list:
        """ONNX's If: the float tensors ``then_body(g)`` returns where ``condition`` (a bool of one
        element) holds, else those of ``else_body(g)``, each body building its nodes in a graph ``g``
        of its own that reads this graph's values. Only the branch taken runs."""
        branches = []
        for part, body in (("then", then_body), ("else", else_body)):
            child = Graph(f"{self.name}_{part}_{self.root.count}", self.quantize, parent=self)
            values = list(body(child))
            produced = {name for node in child.nodes for name in node.output}
            values = [value if value in produced else child.op("Identity", value) for value in values]
            branches.append(helper.make_graph(child.nodes, child.name, [],
                                              [helper.make_tensor_value_info(v, FLOAT, None) for v in values]))
        if len(branches[0].output) != len(branches[1].output):
            raise ValueError(f"If branches of {self.name} return {len(branches[0].output)} and "
                             f"{len(branches[1].output)} values")
        outputs = self.op("If", condition, outputs=len(branches[0].output), then_branch=branches[0],
                          else_branch=branches[1])
        return outputs if isinstance(outputs, list) else [outputs]

    def op(self, op_type: str, *inputs: str, outputs: int = 1, **attributes):
        names = [self.fresh(op_type.lower()) for _ in range(outputs)]
        inputs = [self.renamed.get(name, name) for name in inputs]
        self.nodes.append(helper.make_node(op_type, inputs, names, **attributes))
        return names[0] if outputs == 1 else names

    def input(self, name: str, elem_type, shape) -> str:
        self.inputs.append(helper.make_tensor_value_info(name, elem_type, shape))
        return name

    def output(self, value: str, name: str, elem_type, shape) -> None:
        """The node that computes ``value`` writes it as output ``name``: no Identity copy (the
        decoder's growing caches would be copied once more every step)."""
        value = self.renamed.get(value, value)
        producer = next((node for node in self.nodes if value in node.output), None)
        if producer is None or value in {o.name for o in self.outputs}:  # an input, or already an output
            self.nodes.append(helper.make_node("Identity", [value], [name]))
        else:
            for node in self.nodes:
                for field in (node.input, node.output):
                    for i, used in enumerate(field):
                        if used == value:
                            field[i] = name
            self.renamed[value] = name
        self.outputs.append(helper.make_tensor_value_info(name, elem_type, shape))

    def model(self) -> onnx.ModelProto:
        graph = helper.make_graph(self.nodes, self.name, self.inputs, self.outputs, self.initializers)
        opsets = [helper.make_opsetid("", OPSET)]
        if any(node.domain == "com.microsoft" for node in all_nodes(self.nodes)):  # ONNX Runtime's fused kernels
            opsets.append(helper.make_opsetid("com.microsoft", 1))
        if self.quantize:
            constant = {tensor.name for tensor in self.initializers}
            left = [node.name or node.output[0] for node in all_nodes(self.nodes)
                    if node.op_type in ("MatMul", "Gemm") and constant.intersection(node.input)]
            assert not left, f"float products with constant weights left in the int8 graph: {left}"
        model = helper.make_model(graph, opset_imports=opsets, producer_name="fairseq_memattn")
        model.ir_version = 8
        onnx.checker.check_model(model, full_check=not any(node.domain for node in all_nodes(self.nodes)))
        return model

    # --- layers -------------------------------------------------------------------

    def product(self, x: str, weight, hint: str = "weight") -> str:
        """x W for a constant W (in x out). int8: W symmetric per output column, x symmetric per row
        (its own max |x|), so that no row's result depends on the other rows of its batch. W takes
        7 bits (|w| <= 63): x is uint8 around 128, and CPUs without VNNI (AVX2) add pairs of
        uint8 x int8 products in int16, which 255 x 127 x 2 overflows and 255 x 63 x 2 does not."""
        weight = as_array(weight)
        if self.quantize != "int8":
            return self.op("MatMul", x, self.weight(weight, hint))
        column_max = np.maximum(np.abs(weight).max(axis=0), TINY)
        w_int8 = np.rint(weight * (WEIGHT_LEVELS / column_max)).astype(np.int8)
        if x not in self.int8_rows:
            # An all-zero row (padding) has row max 0: its uint8 values, 0 / 0, are undefined, but its
            # product is scaled by that 0 and is 0, as it should be.
            row_max = self.op("ReduceMax", self.op("Abs", x), axes=[-1], keepdims=1)
            # uint8 around 128 for the u8 x s8 kernels: round(127 x / row max) + 128
            self.int8_rows[x] = (self.op("QuantizeLinear", self.op("Div", x, row_max), self.const(1 / 127),
                                         self.const(128, np.uint8)), row_max)
        x_uint8, row_max = self.int8_rows[x]
        # product * row max * column max / (127 x 63); a 1-D b_scale is per column, a_scale [..., 1] per row
        return self.op("MatMulIntegerToFloat", x_uint8, self.weight(w_int8, hint), row_max,
                       self.weight((column_max / (127 * WEIGHT_LEVELS)).astype(np.float32), hint + "_scale"),
                       self.const(128, np.uint8), domain="com.microsoft")

    def embedding(self, table, ids: str, hint: str = "embed") -> str:
        """Rows ``ids`` of a constant table; int8: the table in int8 with one scale (a row's values
        do not depend on the batch)."""
        table = as_array(table)
        if self.quantize != "int8":
            return self.op("Gather", self.weight(table, hint), ids)
        scale = np.float32(max(np.abs(table).max(), TINY) / 127)
        rows = self.op("Gather", self.weight(np.rint(table / scale).astype(np.int8), hint), ids)
        return self.op("DequantizeLinear", rows, self.const(scale), self.const(0, np.int8))

    def linear(self, x: str, module, bias: bool = True) -> str:
        """x W^T + b of an nn.Linear (W stored transposed, as MatMul wants it)."""
        y = self.product(x, as_array(module.weight).T)
        # A separate Add: MatMulIntegerToFloat's own bias input gives wrong sums with a per-row
        # a_scale (onnxruntime 1.32).
        if bias and module.bias is not None:
            y = self.op("Add", y, self.weight(module.bias, "bias"))
        return y

    def linears(self, x: str, modules) -> list:
        """Several nn.Linear of the same input as one product, split back (fewer, larger products)."""
        weight = np.concatenate([as_array(m.weight) for m in modules]).T
        bias = np.concatenate([as_array(m.bias) if m.bias is not None else np.zeros(m.weight.shape[0], np.float32)
                               for m in modules])
        y = self.op("Add", self.product(x, weight), self.weight(bias, "bias"))
        sizes = self.const([m.weight.shape[0] for m in modules], np.int64)
        return self.op("Split", y, sizes, axis=-1, outputs=len(modules))

    def layer_norm(self, x: str, module) -> str:
        return self.op("LayerNormalization", x, self.weight(module.weight, "ln_weight"),
                       self.weight(module.bias, "ln_bias"), axis=-1, epsilon=float(module.eps))

    def activation(self, x: str, name: str) -> str:
        """fairseq's utils.get_activation_fn for the functions it has."""
        if name == "relu":
            return self.op("Relu", x)
        if name == "gelu":  # x * Phi(x), exact
            phi = self.op("Mul", self.op("Add", self.op("Erf", self.op("Mul", x, self.const(2 ** -0.5))),
                                         self.const(1.0)), self.const(0.5))
            return self.op("Mul", x, phi)
        if name == "tanh":
            return self.op("Tanh", x)
        if name == "linear":
            return x
        raise ValueError(f"unsupported --activation-fn: {name!r} (the export has relu, gelu, tanh, linear)")

    def dims(self, x: str, start: int, end: int) -> str:
        """x's sizes along axes start..end-1 (int64, 1-D)."""
        return self.op("Slice", self.op("Shape", x), self.const([start], np.int64), self.const([end], np.int64))

    def split_heads(self, x: str, heads: int, head_dim: int) -> str:
        """B x L x D -> B x H x L x D/H"""
        x = self.op("Reshape", x, self.const([0, 0, heads, head_dim], np.int64))
        return self.op("Transpose", x, perm=[0, 2, 1, 3])

    def attend(self, q: str, k: str, v: str):
        """softmax(q k^T) v over the last axis: (output, weights)."""
        scores = self.op("MatMul", q, self.op("Transpose", k, perm=[0, 1, 3, 2]))
        weights = self.op("Softmax", scores, axis=-1)
        return self.op("MatMul", weights, v), weights

    def masked_fill(self, x: str, mask: str, value: float) -> str:
        return self.op("Where", mask, self.const(value), x)
