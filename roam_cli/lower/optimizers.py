"""ONNX Runtime's optimizer ops, which update sequences of tensors in place: a Loop over the
sequences' tensors whose body is the update in elementwise ops. The new sequences are the node's
optional outputs when it names them, else graph outputs `<sequence>.out` declared in place."""

from onnx import TensorProto, helper

from roam_cli.core.errors import RoamError

FLOAT_SEQ = helper.make_sequence_type_proto(helper.make_tensor_type_proto(TensorProto.FLOAT, None))


def adamw(e):
    """ORT's AdamWOptimizer kernel (step used as given): adam_mode 0 is PyTorch's AdamW (decay
    first, bias correction on m and v), 1 is Hugging Face's (correction folded into the learning
    rate, decay after the update)."""
    lr, step = e.input(0), e.input(1)
    alpha, beta = e.attr("alpha", 0.9), e.attr("beta", 0.999)
    eps, decay = e.attr("epsilon", 1e-8), e.attr("weight_decay", 1e-2)
    mode, correct = e.attr("adam_mode", 0), e.attr("correct_bias", 1)
    if mode not in (0, 1):
        raise RoamError(f"cannot lower AdamWOptimizer node {e.node.name!r}: adam_mode {mode}")
    f = TensorProto.FLOAT
    one = e.const(1.0, dtype=f)
    t = e.op("Cast", step, to=f)
    alpha_c = e.op("Sub", one, e.op("Pow", e.const(alpha, dtype=f), t)) if correct else one
    beta_c = e.op("Sub", one, e.op("Pow", e.const(beta, dtype=f), t)) if correct else one
    lr_decay = e.op("Mul", lr, e.const(decay, dtype=f))
    lr_corrected = e.op("Div", e.op("Mul", lr, e.op("Sqrt", beta_c)), alpha_c)

    def update(w, g, m, v):
        if mode == 0:
            w = e.op("Sub", w, e.op("Mul", w, lr_decay))
        m = e.op("Add", e.op("Mul", m, e.const(alpha, dtype=f)), e.op("Mul", g, e.const(1 - alpha, dtype=f)))
        v = e.op("Add", e.op("Mul", v, e.const(beta, dtype=f)),
                 e.op("Mul", e.op("Mul", g, g), e.const(1 - beta, dtype=f)))
        if mode == 0:
            denom = e.op("Add", e.op("Sqrt", e.op("Div", v, beta_c)), e.const(eps, dtype=f))
            w = e.op("Sub", w, e.op("Div", e.op("Mul", m, lr), e.op("Mul", denom, alpha_c)))
        else:
            denom = e.op("Add", e.op("Sqrt", v), e.const(eps, dtype=f))
            w = e.op("Sub", w, e.op("Div", e.op("Mul", m, lr_corrected), denom))
            w = e.op("Sub", w, e.op("Mul", w, lr_decay))
        return w, m, v

    over_sequences(e, [2, 3, 4, 5], [(2, 1), (4, 2), (5, 3)], 6, update)


def sgd_v2(e):
    """SGDOptimizerV2: w -= lr * g."""
    lr = e.input(0)
    over_sequences(e, [1, 2], [(1, 1)], 3, lambda w, g: (e.op("Sub", w, e.op("Mul", g, lr)),))


def over_sequences(e, seq_inputs: list[int], updated: list[tuple[int, int]], signal: int, update) -> None:
    """Loop k over the tensors of the sequence inputs `seq_inputs`; `update` maps their k-th tensors
    to the new values of the states `updated`: (input index, node output index) in that order."""
    if e.input(signal):
        raise RoamError(f"cannot lower {e.node.op_type} node {e.node.name!r}: update_signal is not supported")
    outer, e.nodes = e.nodes, []
    k, cond, carried_in = e.fresh("k"), e.fresh("cond"), [e.fresh("seq_in") for _ in updated]
    cond_out = e.op("Identity", cond)
    new = update(*[e.op("SequenceAt", e.input(i), k) for i in seq_inputs])
    carried_out = [e.op("SequenceInsert", s, x) for s, x in zip(carried_in, new)]
    body, e.nodes = e.nodes, outer
    graph = helper.make_graph(
        body, f"{e.node.name}/body",
        [helper.make_tensor_value_info(k, TensorProto.INT64, []), helper.make_tensor_value_info(cond, TensorProto.BOOL, [])]
        + [helper.make_value_info(s, FLOAT_SEQ) for s in carried_in],
        [helper.make_tensor_value_info(cond_out, TensorProto.BOOL, [])]
        + [helper.make_value_info(s, FLOAT_SEQ) for s in carried_out])
    count = e.op("SequenceLength", e.input(seq_inputs[0]))
    empty = [e.op("SequenceEmpty", dtype=TensorProto.FLOAT) for _ in updated]
    results = [e.output(o) or e.ctx.claim(f"{e.input(i)}.out") for i, o in updated]
    e.op("Loop", count, "", *empty, out=results, body=graph)
    for (i, o), name in zip(updated, results):
        if not e.output(o):
            e.ctx.add_inplace_output(name, e.input(i))
    if e.output(0):
        dtype = e.ctx.dtype(e.output(0)) or TensorProto.BOOL
        e.op("Constant", out=e.output(0), value=helper.make_tensor("updated", dtype, [1], [1]))
