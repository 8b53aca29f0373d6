"""Training utilities: gradient accumulation, Dropout's gradient, the training forms of Concat and
Split, Scale."""

from onnx import TensorProto, helper


def in_place_accumulator_v2(e):
    """buffer += value (buffer = value when overwrite_flag): the new buffer is graph output
    `<buffer>.out` (or the node's own accumulation_buffer_out), declared in place over the buffer;
    updated_flag is true, as ONNX Runtime's kernel sets it."""
    buffer, value, overwrite = e.input(0), e.input(1), e.input(2)
    new = e.output(1) or e.ctx.claim(f"{buffer}.out")
    if overwrite:
        e.op("Where", overwrite, value, e.op("Add", buffer, value), out=new)
    else:
        e.op("Add", buffer, value, out=new)
    e.ctx.add_inplace_output(new, buffer)
    if e.output(0):
        e.op("Constant", out=e.output(0), value=helper.make_tensor("true", TensorProto.BOOL, [1], [True]))


def dropout_grad(e):
    """dX = dY * mask / (1 - ratio), ratio 0.5 when absent; as ONNX Runtime's kernel, the mask is
    not read when the ratio is 0, and training_mode is not read. A constant ratio folds into one
    scale constant."""
    dy, mask, ratio = e.input(0), e.input(1), e.input(2)
    r = 0.5 if ratio is None else e.ctx.constant_value(ratio)
    if r is None:  # computed at run time
        scale = e.op("Div", e.const(1.0, dy), e.op("Sub", e.const(1.0, dy), e.cast_like(ratio, dy)))
        dy = e.op("Mul", dy, scale)
    elif float(r) == 0.0:
        e.op("Identity", dy, out=e.output(0))
        return
    else:
        dy = e.op("Mul", dy, e.const(1.0 / (1.0 - float(r)), dy))
    e.op("Where", mask, dy, e.const(0.0, dy), out=e.output(0))


def concat_training(e):
    """Concat; the optional per_input_length is each input's extent along the axis."""
    axis = e.attr("axis")
    inputs = [x for x in e.node.input if x]
    e.op("Concat", *inputs, out=e.output(0), axis=axis)
    if e.output(1):
        end = axis + 1 if axis != -1 else None
        lengths = [e.op("Shape", x, start=axis, end=end) for x in inputs]
        e.op("Concat", *lengths, out=e.output(1), axis=0)


def split_training(e):
    """Split with sizes from input 1 (equal parts when absent)."""
    outs = list(e.node.output)
    e.op("Split", e.input(0), e.input(1), out=outs, axis=e.attr("axis", 0),
         num_outputs=None if e.input(1) else len(outs))


def scale(e):
    """input * scale, or input / scale with scale_down."""
    x = e.input(0)
    factor = e.cast_like(e.input(1), x)
    e.op("Div" if e.attr("scale_down", 0) else "Mul", x, factor, out=e.output(0))
