"""One op of the graph engine against ONNX Runtime: `test_onnx_ops.py OP` (an ONNX op name, e.g. Gemm).

For the op, small one-node (or few-node) models are built with the `onnx` package's helper API (opset 17
of the default domain, IR version 8), fed seeded random inputs, and run twice: by ONNX Runtime (its CPU
provider, graph optimizations off, so that each op is its own kernel) and by psfleet's graph engine
through tests/integration/onnx_run (the ONNX loader, then graph_forward). Each output must agree in shape,
and in value to max |ours - ort| <= 1e-5 * max(1, max |ort|); one line per case gives that figure
(max |ours - ort| / max(1, max |ort|)). Float initializers are parameters in the engine, which changes
nothing forward. Several cases declare dim 0 of an input symbolic ('N') and run it at batch 3.

onnx and onnxruntime come from PyPI, in <build>/pyenv (pyenv.py). Exit 0 when every case agrees, 1 when
one does not (all cases still run and print), 77 when PyPI cannot be reached or onnx_run is not built.
`test_onnx_ops.py --list` prints the ops covered.
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zlib

import harness as h
import pyenv

ONNX_RUN = os.path.join(h.BUILD_DIR, "tests", "integration", "onnx_run")
TOL = 1e-5
OPSET = 17
IR_VERSION = 8
N = 3   # the batch a symbolic dim 0 is run at

np = oh = TP = nh = onnx = ort = None   # imported inside the environment (main)
rng = None


# ---- cases --------------------------------------------------------------------------------------

class Case:
    """One model: its nodes, graph inputs (name, array, symbolic dim 0?), initializers (name: array),
    the outputs compared, and whether the engine runs it in training mode (--training)."""

    def __init__(self, title, nodes, inputs, outputs, inits=None, training=False):
        self.title, self.nodes, self.outputs, self.training = title, nodes, outputs, training
        self.inputs = [(i[0], i[1], i[2] if len(i) > 2 else False) for i in inputs]
        self.inits = inits or {}


def f32(*shape, lo=None, hi=None):
    """Standard normal float32 values (uniform in [lo, hi) when given)."""
    if lo is not None:
        return np.asarray(rng.uniform(lo, hi, size=shape), dtype=np.float32)
    return np.asarray(rng.standard_normal(size=shape), dtype=np.float32)


def i64(*a):
    return np.array(a, dtype=np.int64)


def node(op, ins, outs, **attrs):
    return oh.make_node(op, ins, outs, name=op.lower(), **attrs)


def nonzero(*shape):
    """Values away from 0 (in +-[0.5, 2)), as divisors."""
    v = f32(*shape, lo=0.5, hi=2.0)
    return np.asarray(v * np.where(rng.random(shape) < 0.5, -1, 1), dtype=np.float32)


def one(op, x, title, inits=None, extra_ins=(), outs=("Y",), training=False, **attrs):
    """A one-node case over input X (an array; symbolic dim 0 when sym)."""
    return Case(title, [node(op, ["X"] + list(extra_ins), list(outs), **attrs)], [x], list(outs), inits,
                training)


def cases_Gemm():
    c = []
    for ta in (0, 1):
        for tb in (0, 1):
            a = f32(7, 5) if ta else f32(5, 7)
            b = f32(6, 7) if tb else f32(7, 6)
            c.append(Case("transA=%d transB=%d, C (6,)" % (ta, tb), [node("Gemm", ["A", "B", "C"], ["Y"],
                                                                      transA=ta, transB=tb)],
                          [("A", a)], ["Y"], {"B": b, "C": f32(6)}))
    c.append(Case("alpha=0.7 beta=-1.3, C (5, 1)", [node("Gemm", ["A", "B", "C"], ["Y"], alpha=0.7, beta=-1.3)],
                  [("A", f32(5, 7))], ["Y"], {"B": f32(7, 6), "C": f32(5, 1)}))
    c.append(Case("alpha=2 beta=0.5, C (5, 6)", [node("Gemm", ["A", "B", "C"], ["Y"], alpha=2.0, beta=0.5)],
                  [("A", f32(5, 7))], ["Y"], {"B": f32(7, 6), "C": f32(5, 6)}))
    c.append(Case("C (1, 6), transB=1", [node("Gemm", ["A", "B", "C"], ["Y"], transB=1)],
                  [("A", f32(5, 7))], ["Y"], {"B": f32(6, 7), "C": f32(1, 6)}))
    c.append(Case("C scalar ()", [node("Gemm", ["A", "B", "C"], ["Y"], beta=2.0)],
                  [("A", f32(5, 7))], ["Y"], {"B": f32(7, 6), "C": f32()}))
    c.append(Case("no C, alpha=0.25", [node("Gemm", ["A", "B"], ["Y"], alpha=0.25)],
                  [("A", f32(5, 7))], ["Y"], {"B": f32(7, 6)}))
    c.append(Case("A (N, 20) at batch %d, B (16, 20) transB=1, C (16,)" % N,
                  [node("Gemm", ["A", "B", "C"], ["Y"], transB=1)],
                  [("A", f32(N, 20), True)], ["Y"], {"B": f32(16, 20), "C": f32(16)}))
    c.append(Case("both from inputs: A (4, 9) x B (9, 3)", [node("Gemm", ["A", "B"], ["Y"])],
                  [("A", f32(4, 9)), ("B", f32(9, 3))], ["Y"]))
    # a few-node model: an MLP, its first layer's input batched
    c.append(Case("MLP Gemm-Relu-Gemm-Softmax, X (N, 12) at batch %d" % N,
                  [node("Gemm", ["X", "W1", "B1"], ["H"], transB=1), oh.make_node("Relu", ["H"], ["R"]),
                   oh.make_node("Gemm", ["R", "W2", "B2"], ["L"], transB=1),
                   oh.make_node("Softmax", ["L"], ["Y"], axis=1)],
                  [("X", f32(N, 12), True)], ["Y", "L"],
                  {"W1": f32(10, 12), "B1": f32(10), "W2": f32(4, 10), "B2": f32(4)}))
    return c


def cases_MatMul():
    return [
        Case("2-D (5, 7) x (7, 6) initializer", [node("MatMul", ["A", "B"], ["Y"])], [("A", f32(5, 7))], ["Y"],
             {"B": f32(7, 6)}),
        Case("2-D, both inputs", [node("MatMul", ["A", "B"], ["Y"])], [("A", f32(4, 8)), ("B", f32(8, 3))], ["Y"]),
        Case("batched 3-D (2, 5, 7) x (2, 7, 4)", [node("MatMul", ["A", "B"], ["Y"])],
             [("A", f32(2, 5, 7)), ("B", f32(2, 7, 4))], ["Y"]),
        Case("3-D (2, 5, 7) x 2-D (7, 4) initializer", [node("MatMul", ["A", "B"], ["Y"])],
             [("A", f32(2, 5, 7))], ["Y"], {"B": f32(7, 4)}),
        Case("(N, 6, 7) at batch %d x (7, 5)" % N, [node("MatMul", ["A", "B"], ["Y"])],
             [("A", f32(N, 6, 7), True)], ["Y"], {"B": f32(7, 5)}),
        Case("(N, 16) at batch %d x (16, 8)" % N, [node("MatMul", ["A", "B"], ["Y"])],
             [("A", f32(N, 16), True)], ["Y"], {"B": f32(16, 8)}),
    ]


def binary_cases(op):
    b = nonzero if op == "Div" else f32
    shapes = [((2, 3, 4), (2, 3, 4)), ((2, 3, 4), (4,)), ((2, 3, 4), (3, 1)), ((2, 1, 4), (3, 1)),
              ((3, 4), ()), ((1, 4), (3, 1)), ((4,), (2, 3, 4))]
    c = []
    for sa, sb in shapes:
        c.append(Case("%s x %s" % (sa, sb), [node(op, ["A", "B"], ["Y"])], [("A", f32(*sa)), ("B", b(*sb))],
                      ["Y"]))
    c.append(Case("(N, 3, 4) at batch %d x initializer (3, 1)" % N, [node(op, ["A", "B"], ["Y"])],
                  [("A", f32(N, 3, 4), True)], ["Y"], {"B": b(3, 1)}))
    c.append(Case("initializer (4,) x (N, 4) at batch %d" % N, [node(op, ["B", "A"], ["Y"])],
                  [("A", b(N, 4) if op == "Div" else f32(N, 4), True)], ["Y"], {"B": f32(4)}))
    c.append(Case("(N, 2, 3) x (N, 1, 3), both at batch %d" % N, [node(op, ["A", "B"], ["Y"])],
                  [("A", f32(N, 2, 3), True), ("B", b(N, 1, 3), True)], ["Y"]))
    return c


def cases_Add():
    return binary_cases("Add")


def cases_Sub():
    return binary_cases("Sub")


def cases_Mul():
    return binary_cases("Mul")


def cases_Div():
    return binary_cases("Div")


def unary_cases(op, **attrs_list):
    c = [one(op, ("X", f32(4, 5) * 3), "(4, 5)"),
         one(op, ("X", f32(N, 2, 3, 4) * 3, True), "(N, 2, 3, 4) at batch %d" % N)]
    for title, attrs in attrs_list.items():
        c.append(one(op, ("X", f32(3, 7) * 3), title, **attrs))
    return c


def cases_Relu():
    return unary_cases("Relu")


def cases_LeakyRelu():
    return unary_cases("LeakyRelu", **{"alpha=0.2": {"alpha": 0.2}, "alpha=1.5": {"alpha": 1.5}})


def cases_Sigmoid():
    return unary_cases("Sigmoid") + [one("Sigmoid", ("X", f32(64) * 12), "(64,) wide range")]


def cases_Tanh():
    return unary_cases("Tanh") + [one("Tanh", ("X", f32(64) * 6), "(64,) wide range")]


def softmax_cases(op):
    c = [one(op, ("X", f32(4, 10) * 3), "(4, 10), default axis (-1)")]
    for ax in (0, 1, 2, -1, -2):
        c.append(one(op, ("X", f32(2, 3, 5) * 3), "(2, 3, 5) axis=%d" % ax, axis=ax))
    c.append(one(op, ("X", f32(N, 10) * 3, True), "(N, 10) at batch %d, axis=1" % N, axis=1))
    c.append(one(op, ("X", f32(N, 4, 6) * 3, True), "(N, 4, 6) at batch %d, axis=1" % N, axis=1))
    return c


def cases_Softmax():
    return softmax_cases("Softmax")


def cases_LogSoftmax():
    return softmax_cases("LogSoftmax")


def conv_case(title, x, w, bias=True, sym=False, **attrs):
    inits = {"W": w}
    ins = ["X", "W"]
    if bias:
        inits["B"] = f32(w.shape[0])
        ins.append("B")
    return Case(title, [node("Conv", ins, ["Y"], **attrs)], [("X", x, sym)], ["Y"], inits)


def cases_Conv():
    return [
        conv_case("3x3, no pads, bias", f32(1, 2, 7, 7), f32(4, 2, 3, 3)),
        conv_case("3x3, no bias", f32(2, 2, 6, 5), f32(3, 2, 3, 3), bias=False),
        conv_case("3x3 pads 1, kernel_shape", f32(2, 3, 6, 6), f32(4, 3, 3, 3), pads=[1, 1, 1, 1],
                  kernel_shape=[3, 3]),
        conv_case("3x3 strides 2, pads 1", f32(1, 3, 9, 8), f32(5, 3, 3, 3), strides=[2, 2], pads=[1, 1, 1, 1]),
        conv_case("2x3 strides (1, 2), asymmetric pads (0, 1, 2, 0)", f32(1, 2, 7, 9), f32(3, 2, 2, 3),
                  strides=[1, 2], pads=[0, 1, 2, 0]),
        conv_case("3x3 dilations 2", f32(1, 2, 9, 9), f32(3, 2, 3, 3), dilations=[2, 2]),
        conv_case("3x3 dilations (2, 1), strides 2, pads 2", f32(1, 2, 8, 7), f32(3, 2, 3, 3),
                  dilations=[2, 1], strides=[2, 2], pads=[2, 2, 2, 2]),
        conv_case("1x1", f32(2, 6, 4, 4), f32(5, 6, 1, 1)),
        conv_case("5x5 pads 2, X (N, 1, 12, 12) at batch %d" % N, f32(N, 1, 12, 12), f32(8, 1, 5, 5),
                  sym=True, pads=[2, 2, 2, 2]),
    ]


def pool_case(op, title, x, sym=False, **attrs):
    return one(op, ("X", x, sym), title, **attrs)


def cases_MaxPool():
    op = "MaxPool"
    return [
        pool_case(op, "2x2 strides 2", f32(1, 2, 6, 6), kernel_shape=[2, 2], strides=[2, 2]),
        pool_case(op, "3x3 default strides 1", f32(2, 3, 5, 6), kernel_shape=[3, 3]),
        pool_case(op, "3x3 strides 2 pads 1", f32(1, 2, 7, 7), kernel_shape=[3, 3], strides=[2, 2],
                  pads=[1, 1, 1, 1]),
        pool_case(op, "2x3 strides (1, 2) asymmetric pads (1, 0, 0, 2)", f32(1, 2, 5, 7), kernel_shape=[2, 3],
                  strides=[1, 2], pads=[1, 0, 0, 2]),
        pool_case(op, "2x2 strides 2, (N, 4, 8, 8) at batch %d" % N, f32(N, 4, 8, 8), sym=True,
                  kernel_shape=[2, 2], strides=[2, 2]),
    ]


def cases_AveragePool():
    op = "AveragePool"
    c = [pool_case(op, "2x2 strides 2", f32(1, 2, 6, 6), kernel_shape=[2, 2], strides=[2, 2]),
         pool_case(op, "3x3 strides 1", f32(2, 3, 5, 6), kernel_shape=[3, 3])]
    for cip in (0, 1):
        c.append(pool_case(op, "3x3 strides 2 pads 1, count_include_pad=%d" % cip, f32(1, 2, 7, 7),
                           kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1], count_include_pad=cip))
        c.append(pool_case(op, "2x3 strides (1, 2) pads (1, 0, 0, 2), count_include_pad=%d" % cip,
                           f32(1, 2, 5, 7), kernel_shape=[2, 3], strides=[1, 2], pads=[1, 0, 0, 2],
                           count_include_pad=cip))
    c.append(pool_case(op, "2x2 strides 2, (N, 4, 8, 8) at batch %d" % N, f32(N, 4, 8, 8), sym=True,
                       kernel_shape=[2, 2], strides=[2, 2]))
    return c


def cases_GlobalAveragePool():
    op = "GlobalAveragePool"
    return [one(op, ("X", f32(2, 3, 5, 4)), "(2, 3, 5, 4)"),
            one(op, ("X", f32(1, 4, 1, 1)), "(1, 4, 1, 1)"),
            one(op, ("X", f32(2, 3, 7)), "(2, 3, 7) 1-D spatial"),
            one(op, ("X", f32(N, 8, 6, 6), True), "(N, 8, 6, 6) at batch %d" % N)]


def bn_params(c):
    return {"scale": f32(c), "bias": f32(c), "mean": f32(c) * 0.5, "var": f32(c, lo=0.5, hi=2.0)}


def bn(x, title, sym=False, outs=("Y",), training=False, **attrs):
    c = x.shape[1]
    return Case(title, [node("BatchNormalization", ["X", "scale", "bias", "mean", "var"], list(outs), **attrs)],
                [("X", x, sym)], list(outs), bn_params(c), training)


def cases_BatchNormalization():
    c = [bn(f32(2, 3, 4, 5) * 2 + 1, "inference, (2, 3, 4, 5)"),
         bn(f32(4, 6) * 2 + 1, "inference, (4, 6), epsilon=1e-3", epsilon=1e-3),
         bn(f32(N, 5, 3, 3) * 2 + 1, "inference, (N, 5, 3, 3) at batch %d" % N, sym=True),
         # training_mode=1 (batch statistics) with its running outputs (ONNX requires all three outputs in
         # training mode; ONNX Runtime's CPU kernel computes them); the engine's training comes from
         # graph_forward (onnx_run --training), the attribute is only read by ONNX Runtime.
         bn(f32(4, 3, 5, 5) * 2 + 1, "training_mode=1, (4, 3, 5, 5), momentum=0.8, with running outputs",
            outs=("Y", "running_mean", "running_var"), training=True, training_mode=1, momentum=0.8),
         bn(f32(N, 6) * 2 + 1, "training_mode=1, (N, 6) at batch %d" % N, sym=True,
            outs=("Y", "running_mean", "running_var"), training=True, training_mode=1)]
    return c


def cases_Dropout():
    # Masks differ between runtimes, so training is checked with ratio 0 only (the identity).
    return [one("Dropout", ("X", f32(3, 8)), "eval, no ratio"),
            one("Dropout", ("X", f32(3, 8)), "eval, ratio 0.3 initializer", inits={"ratio": np.float32(0.3)},
                extra_ins=["ratio"]),
            one("Dropout", ("X", f32(N, 4, 5), True), "eval, ratio 0.5 and training_mode false, (N, 4, 5) at "
                "batch %d" % N, inits={"ratio": np.float32(0.5), "tm": np.array(False)}, extra_ins=["ratio", "tm"]),
            one("Dropout", ("X", f32(N, 8), True), "training_mode true, ratio 0, (N, 8) at batch %d" % N,
                inits={"ratio": np.float32(0.0), "tm": np.array(True)}, extra_ins=["ratio", "tm"], training=True)]


def cases_LayerNormalization():
    op = "LayerNormalization"
    c = [Case("(4, 10), default axis (-1), Scale and B", [node(op, ["X", "S", "B"], ["Y"])],
              [("X", f32(4, 10) * 2 + 1)], ["Y"], {"S": f32(10), "B": f32(10)}),
         Case("(2, 3, 8) axis=-1, no B", [node(op, ["X", "S"], ["Y"], axis=-1)],
              [("X", f32(2, 3, 8) * 2 + 1)], ["Y"], {"S": f32(8)}),
         Case("(2, 3, 8) axis=1, epsilon=1e-3", [node(op, ["X", "S", "B"], ["Y"], axis=1, epsilon=1e-3)],
              [("X", f32(2, 3, 8) * 2 + 1)], ["Y"], {"S": f32(3, 8), "B": f32(3, 8)}),
         Case("(2, 3, 4, 5) axis=-2", [node(op, ["X", "S", "B"], ["Y"], axis=-2)],
              [("X", f32(2, 3, 4, 5) * 2 + 1)], ["Y"], {"S": f32(4, 5), "B": f32(4, 5)}),
         Case("(N, 6, 16) at batch %d, axis=-1" % N, [node(op, ["X", "S", "B"], ["Y"])],
              [("X", f32(N, 6, 16) * 2 + 1, True)], ["Y"], {"S": f32(16), "B": f32(16)})]
    return c


def cases_Pad():
    c = [Case("(3, 4) pads (1, 2, 0, 1), default value 0", [node("Pad", ["X", "pads"], ["Y"])],
              [("X", f32(3, 4))], ["Y"], {"pads": i64(1, 2, 0, 1)}),
         Case("(2, 3, 4) pads (0, 1, 2, 1, 0, 3) value -1.5", [node("Pad", ["X", "pads", "v"], ["Y"],
                                                                      mode="constant")],
              [("X", f32(2, 3, 4))], ["Y"], {"pads": i64(0, 1, 2, 1, 0, 3), "v": np.float32(-1.5)}),
         Case("(1, 2, 4, 4) spatial pads 1 (as before a conv)", [node("Pad", ["X", "pads"], ["Y"])],
              [("X", f32(1, 2, 4, 4))], ["Y"], {"pads": i64(0, 0, 1, 1, 0, 0, 1, 1)}),
         Case("(N, 3, 5) at batch %d, pads (0, 1, 2, 0, 2, 1) value 0.25" % N,
              [node("Pad", ["X", "pads", "v"], ["Y"])], [("X", f32(N, 3, 5), True)], ["Y"],
              {"pads": i64(0, 1, 2, 0, 2, 1), "v": np.float32(0.25)})]
    return c


def cases_Flatten():
    c = []
    for ax in (0, 1, 2, 3, -1):
        c.append(one("Flatten", ("X", f32(2, 3, 4, 5)), "(2, 3, 4, 5) axis=%d" % ax, axis=ax))
    c.append(one("Flatten", ("X", f32(2, 3, 4)), "(2, 3, 4) default axis (1)"))
    c.append(one("Flatten", ("X", f32(N, 4, 3, 3), True), "(N, 4, 3, 3) at batch %d, axis=1" % N, axis=1))
    # few nodes: Conv -> Flatten -> Gemm, as a CNN's head
    c.append(Case("Conv-Relu-Flatten-Gemm, X (N, 1, 6, 6) at batch %d" % N,
                  [node("Conv", ["X", "W", "CB"], ["C"], pads=[1, 1, 1, 1]), oh.make_node("Relu", ["C"], ["R"]),
                   oh.make_node("Flatten", ["R"], ["F"]), oh.make_node("Gemm", ["F", "W2", "B2"], ["Y"], transB=1)],
                  [("X", f32(N, 1, 6, 6), True)], ["Y", "F"],
                  {"W": f32(2, 1, 3, 3), "CB": f32(2), "W2": f32(5, 72) * 0.2, "B2": f32(5)}))
    return c


def cases_Reshape():
    def rs(title, x, shape, sym=False):
        return one("Reshape", ("X", x, sym), title, inits={"shape": i64(*shape)}, extra_ins=["shape"])
    return [rs("(2, 3, 4) to (6, 4)", f32(2, 3, 4), (6, 4)),
            rs("(2, 3, 4) to (4, -1)", f32(2, 3, 4), (4, -1)),
            rs("(2, 3, 4) to (0, -1): 0 copies dim 0", f32(2, 3, 4), (0, -1)),
            rs("(2, 3, 4) to (0, 0, 2, 2)", f32(2, 3, 4), (0, 0, 2, 2)),
            rs("(2, 3, 4) to (-1,)", f32(2, 3, 4), (-1,)),
            rs("(2, 12) to (-1, 3, 4)", f32(2, 12), (-1, 3, 4)),
            rs("(N, 3, 4) at batch %d to (0, -1)" % N, f32(N, 3, 4), (0, -1), sym=True),
            rs("(N, 12) at batch %d to (-1, 3, 4)" % N, f32(N, 12), (-1, 3, 4), sym=True),
            rs("(N, 2, 6) at batch %d to (0, 3, -1)" % N, f32(N, 2, 6), (0, 3, -1), sym=True)]


def cases_Transpose():
    c = [one("Transpose", ("X", f32(3, 5)), "(3, 5) default perm (reversed)"),
         one("Transpose", ("X", f32(2, 3, 4)), "(2, 3, 4) default perm (reversed)")]
    for perm in ((1, 0, 2), (2, 0, 1), (0, 2, 1)):
        c.append(one("Transpose", ("X", f32(2, 3, 4)), "(2, 3, 4) perm %s" % (perm,), perm=list(perm)))
    c.append(one("Transpose", ("X", f32(2, 3, 4, 5)), "(2, 3, 4, 5) perm (0, 2, 3, 1)", perm=[0, 2, 3, 1]))
    c.append(one("Transpose", ("X", f32(N, 3, 4, 5), True), "(N, 3, 4, 5) at batch %d perm (0, 3, 1, 2)" % N,
                 perm=[0, 3, 1, 2]))
    return c


def cases_Concat():
    return [
        Case("3 inputs axis=0", [node("Concat", ["A", "B", "C"], ["Y"], axis=0)],
             [("A", f32(2, 3)), ("B", f32(1, 3)), ("C", f32(4, 3))], ["Y"]),
        Case("axis=1 with an initializer", [node("Concat", ["A", "P"], ["Y"], axis=1)],
             [("A", f32(2, 3, 4))], ["Y"], {"P": f32(2, 5, 4)}),
        Case("axis=-1", [node("Concat", ["A", "B"], ["Y"], axis=-1)],
             [("A", f32(2, 3, 4)), ("B", f32(2, 3, 2))], ["Y"]),
        Case("(N, 2, 5) and (N, 3, 5) at batch %d axis=1" % N, [node("Concat", ["A", "B"], ["Y"], axis=1)],
             [("A", f32(N, 2, 5), True), ("B", f32(N, 3, 5), True)], ["Y"]),
        Case("(N, 4) at batch %d, 3 inputs, axis=-1" % N, [node("Concat", ["A", "B", "C"], ["Y"], axis=-1)],
             [("A", f32(N, 4), True), ("B", f32(N, 1), True), ("C", f32(N, 2), True)], ["Y"]),
    ]


def cases_Squeeze():
    def sq(title, x, axes=None, sym=False):
        if axes is None:
            return one("Squeeze", ("X", x, sym), title)
        return one("Squeeze", ("X", x, sym), title, inits={"axes": i64(*axes)}, extra_ins=["axes"])
    return [sq("(1, 3, 1, 4) axes (0, 2)", f32(1, 3, 1, 4), (0, 2)),
            sq("(1, 3, 1, 4) axes (-2,)", f32(1, 3, 1, 4), (-2,)),
            sq("(1, 3, 1, 4) no axes: every 1", f32(1, 3, 1, 4)),
            sq("(N, 1, 5) at batch %d axes (1,)" % N, f32(N, 1, 5), (1,), sym=True),
            sq("(N, 4, 1, 1) at batch %d axes (2, 3)" % N, f32(N, 4, 1, 1), (2, 3), sym=True)]


def cases_Unsqueeze():
    def us(title, x, axes, sym=False):
        return one("Unsqueeze", ("X", x, sym), title, inits={"axes": i64(*axes)}, extra_ins=["axes"])
    return [us("(3, 4) axes (0,)", f32(3, 4), (0,)),
            us("(3, 4) axes (1, 3)", f32(3, 4), (1, 3)),
            us("(3, 4) axes (-1,)", f32(3, 4), (-1,)),
            us("(3, 4) axes (0, -1)", f32(3, 4), (0, -1)),
            us("(N, 4) at batch %d axes (1,)" % N, f32(N, 4), (1,), sym=True),
            us("(N, 4) at batch %d axes (2, 3)" % N, f32(N, 4), (2, 3), sym=True)]


def cases_Gather():
    return [
        Case("axis 0 on an initializer (10, 4), indices input (5,)", [node("Gather", ["E", "I"], ["Y"], axis=0)],
             [("I", i64(3, 0, 9, 3, 7))], ["Y"], {"E": f32(10, 4)}),
        Case("axis 0 on an initializer (10, 4), indices input (N, 3) at batch %d, one negative" % N,
             [node("Gather", ["E", "I"], ["Y"])],
             [("I", rng.integers(-10, 10, size=(N, 3)).astype(np.int64), True)], ["Y"], {"E": f32(10, 4)}),
        Case("axis 0 on an initializer (8, 2, 3), indices input (2, 2)", [node("Gather", ["E", "I"], ["Y"])],
             [("I", i64(1, 7, 0, 1).reshape(2, 2))], ["Y"], {"E": f32(8, 2, 3)}),
        Case("axis 1 of an input (2, 5, 3), constant indices (4,)", [node("Gather", ["X", "I"], ["Y"], axis=1)],
             [("X", f32(2, 5, 3))], ["Y"], {"I": i64(4, 0, 2, -1)}),
        Case("axis 1 of an input (N, 6) at batch %d, constant indices (2, 2)" % N,
             [node("Gather", ["X", "I"], ["Y"], axis=1)],
             [("X", f32(N, 6), True)], ["Y"], {"I": i64(5, 0, 3, 3).reshape(2, 2)}),
        Case("axis 1 of an input (N, 6) at batch %d, scalar index from a Constant node" % N,
             [oh.make_node("Constant", [], ["I"], value=nh.from_array(np.array(4, dtype=np.int64))),
              node("Gather", ["X", "I"], ["Y"], axis=1)],
             [("X", f32(N, 6), True)], ["Y"]),
        Case("axis -1 of an input (2, 3, 4), constant indices (3,)", [node("Gather", ["X", "I"], ["Y"], axis=-1)],
             [("X", f32(2, 3, 4))], ["Y"], {"I": i64(3, 3, 1)}),
    ]


def cases_ReduceSum():
    def rs(title, x, axes=None, sym=False, **attrs):
        if axes is None:
            return one("ReduceSum", ("X", x, sym), title, **attrs)
        return one("ReduceSum", ("X", x, sym), title, inits={"axes": i64(*axes)}, extra_ins=["axes"], **attrs)
    return [rs("(2, 3, 4) axes (1,) keepdims=1", f32(2, 3, 4), (1,)),
            rs("(2, 3, 4) axes (1,) keepdims=0", f32(2, 3, 4), (1,), keepdims=0),
            rs("(2, 3, 4) axes (0, 2) keepdims=0", f32(2, 3, 4), (0, 2), keepdims=0),
            rs("(2, 3, 4) axes (-1,) keepdims=1", f32(2, 3, 4), (-1,)),
            rs("(2, 3, 4) no axes: all, keepdims=1", f32(2, 3, 4)),
            rs("(N, 5, 6) at batch %d axes (2,) keepdims=0" % N, f32(N, 5, 6), (2,), sym=True, keepdims=0),
            rs("(N, 5, 6) at batch %d axes (1, 2) keepdims=1" % N, f32(N, 5, 6), (1, 2), sym=True)]


def cases_ReduceMean():
    def rm(title, x, axes=None, sym=False, **attrs):
        if axes is not None:
            attrs["axes"] = list(axes)
        return one("ReduceMean", ("X", x, sym), title, **attrs)
    return [rm("(2, 3, 4) axes [1] keepdims=1", f32(2, 3, 4), (1,)),
            rm("(2, 3, 4) axes [1] keepdims=0", f32(2, 3, 4), (1,), keepdims=0),
            rm("(2, 3, 4) axes [0, 2] keepdims=0", f32(2, 3, 4), (0, 2), keepdims=0),
            rm("(2, 3, 4) axes [-1]", f32(2, 3, 4), (-1,)),
            rm("(2, 3, 4) no axes: all, keepdims=1", f32(2, 3, 4)),
            rm("(N, 5, 6) at batch %d axes [2] keepdims=0" % N, f32(N, 5, 6), (2,), sym=True, keepdims=0),
            rm("(N, 4, 3, 3) at batch %d axes [2, 3] (a global pool)" % N, f32(N, 4, 3, 3), (2, 3), sym=True)]


def cases_Identity():
    return [one("Identity", ("X", f32(3, 4)), "(3, 4)"),
            one("Identity", ("X", f32(N, 2, 5), True), "(N, 2, 5) at batch %d" % N),
            Case("of an initializer, added to the input", [oh.make_node("Identity", ["P"], ["Q"]),
                                                            oh.make_node("Add", ["X", "Q"], ["Y"])],
                 [("X", f32(3, 4))], ["Y", "Q"], {"P": f32(3, 4)})]


OPS = ["Gemm", "MatMul", "Add", "Sub", "Mul", "Div", "Relu", "LeakyRelu", "Sigmoid", "Tanh", "Softmax",
       "LogSoftmax", "Conv", "MaxPool", "AveragePool", "GlobalAveragePool", "BatchNormalization", "Dropout",
       "LayerNormalization", "Pad", "Flatten", "Reshape", "Transpose", "Concat", "Squeeze", "Unsqueeze", "Gather",
       "ReduceSum", "ReduceMean", "Identity"]


# ---- running a case -----------------------------------------------------------------------------

ONNX_TYPE = {}


def build_model(case):
    """The case as a checked ModelProto (outputs' shapes by ONNX's shape inference)."""
    inputs = []
    for name, arr, sym in case.inputs:
        shape = list(arr.shape)
        if sym:
            shape[0] = "N"
        inputs.append(oh.make_tensor_value_info(name, ONNX_TYPE[arr.dtype.type], shape))
    outputs = [oh.make_tensor_value_info(o, TP.FLOAT, None) for o in case.outputs]
    inits = [nh.from_array(np.asarray(v), k) for k, v in case.inits.items()]
    g = oh.make_graph(case.nodes, "psfleet_op_test", inputs, outputs, initializer=inits)
    m = oh.make_model(g, opset_imports=[oh.make_opsetid("", OPSET)], ir_version=IR_VERSION,
                      producer_name="psfleet test_onnx_ops")
    m = onnx.shape_inference.infer_shapes(m, strict_mode=True)
    onnx.checker.check_model(m, full_check=True)
    return m


def run_ort(model_bytes, case):
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.intra_op_num_threads = 1
    so.inter_op_num_threads = 1
    s = ort.InferenceSession(model_bytes, so, providers=["CPUExecutionProvider"])
    return s.run(case.outputs, {name: arr for name, arr, _ in case.inputs})


def run_ours(path, case, scratch):
    args = [ONNX_RUN, path]
    batches = {arr.shape[0] for _, arr, sym in case.inputs if sym}
    assert len(batches) <= 1, "the symbolic inputs disagree on the batch"
    if batches:
        args += ["--batch", str(batches.pop())]
    for name, arr, _ in case.inputs:
        f = os.path.join(scratch, "in_%s.bin" % name)
        arr.astype(arr.dtype.newbyteorder("<")).tofile(f)
        args += ["--in", "%s=%s" % (name, f)]
    outs = {}
    for o in case.outputs:
        outs[o] = os.path.join(scratch, "out_%s.bin" % o)
        if os.path.exists(outs[o]):
            os.unlink(outs[o])   # never an earlier case's
        args += ["--out", "%s=%s" % (o, outs[o])]
    if case.training:
        args += ["--training", "--seed", "7"]
    try:
        r = subprocess.run(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=60)
    except subprocess.TimeoutExpired:
        return None, "onnx_run still running after 60 s"
    if r.returncode != 0:
        return None, "onnx_run exited %d: %s" % (r.returncode, (r.stderr.strip() or r.stdout.strip())[-2000:])
    meta = json.loads(r.stdout.strip().splitlines()[-1])
    res = []
    for o in case.outputs:
        v = np.fromfile(outs[o], dtype="<f4")
        res.append((meta["outputs"][o]["shape"], v))
    return res, None


def compare(case, scratch, index):
    """Runs the case both ways; prints its line per output; returns True when it agrees."""
    label = "%s[%d] %s" % (OP, index, case.title)
    try:
        m = build_model(case)
    except Exception as e:   # a bad test case, not the engine's fault
        print("%s: the model does not check: %s" % (label, e), flush=True)
        return False
    b = m.SerializeToString()
    path = os.path.join(scratch, "model.onnx")
    with open(path, "wb") as f:
        f.write(b)
    try:
        want = run_ort(b, case)
    except Exception as e:   # ONNX Runtime refusing the model: the case is wrong, or ORT lacks it
        print("%s: FAIL: ONNX Runtime: %s" % (label, str(e).strip()[-2000:]), flush=True)
        return False
    got, err = run_ours(path, case, scratch)
    if err:
        print("%s: FAIL: %s" % (label, err), flush=True)
        return False
    ok = True
    for o, w, (shape, v) in zip(case.outputs, want, got):
        w = np.asarray(w, dtype=np.float32)
        tag = label + (" [%s]" % o if len(case.outputs) > 1 else "")
        if list(shape) != list(w.shape) or v.size != w.size:
            print("%s: FAIL: shape %s (%d values), ONNX Runtime %s" % (tag, shape, v.size, list(w.shape)),
                  flush=True)
            ok = False
            continue
        v = v.reshape(w.shape)
        d = np.abs(v.astype(np.float64) - w.astype(np.float64))
        md = float(d.max()) if d.size else 0.0
        scale = max(1.0, float(np.abs(w).max()) if w.size else 0.0)
        fig = md / scale if np.isfinite(md) and np.all(np.isfinite(v) == np.isfinite(w)) else float("inf")
        good = fig <= TOL
        ok = ok and good
        worst[0] = max(worst[0], fig)
        print("%s: shape %s, max|ours-ort| %.3g, scale %.3g, figure %.3g %s"
              % (tag, list(w.shape), md, scale, fig, "ok" if good else "FAIL (> %g)" % TOL), flush=True)
        if not good:
            i = np.unravel_index(int(np.nanargmax(np.where(np.isfinite(d), d, np.inf))), w.shape)
            print("    worst at %s: ours %r, ort %r" % (tuple(int(j) for j in i), float(v[i]), float(w[i])),
                  flush=True)
    return ok


OP = None
worst = [0.0]


def test():
    global OP, np, oh, TP, nh, onnx, ort, rng
    if len(sys.argv) != 2:
        sys.exit("usage: test_onnx_ops.py OP | --list   (OP one of: %s)" % " ".join(OPS))
    if sys.argv[1] == "--list":
        print("\n".join(OPS))
        return
    OP = sys.argv[1]
    if OP not in OPS:
        sys.exit("unknown op %r; the set: %s" % (OP, " ".join(OPS)))
    if not os.access(ONNX_RUN, os.X_OK):
        h.skip("onnx_run not built (%s)" % ONNX_RUN)
    pyenv.ensure()
    import numpy
    import onnx as onnx_mod
    import onnxruntime
    from onnx import TensorProto, helper, numpy_helper
    np, oh, TP, nh, onnx, ort = numpy, helper, TensorProto, numpy_helper, onnx_mod, onnxruntime
    ONNX_TYPE.update({np.float32: TP.FLOAT, np.int64: TP.INT64})
    h.log("%s: onnx %s, onnxruntime %s, numpy %s" % (OP, onnx.__version__, ort.__version__, np.__version__))
    rng = np.random.default_rng(zlib.crc32(OP.encode()))
    cases = globals()["cases_" + OP]()
    scratch = tempfile.mkdtemp(prefix="psfleet-onnx-%s-" % OP)
    failed = []
    try:
        for i, c in enumerate(cases):
            if not compare(c, scratch, i):
                failed.append("%d (%s)" % (i, c.title))
    finally:
        if not os.environ.get("PSFLEET_KEEP_TEST_DIR"):
            shutil.rmtree(scratch, True)
    print("%s: %d cases, worst figure %.3g (limit %g)" % (OP, len(cases), worst[0], TOL), flush=True)
    assert not failed, "%s: %d of %d cases disagree with ONNX Runtime: %s" % (OP, len(failed), len(cases),
                                                                           "; ".join(failed))


if __name__ == "__main__":
    h.main(test)
