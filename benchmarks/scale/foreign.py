"""Foreign steps: 70B- and 405B-class LLaMA training steps made the ways other tools make them,
planned as scale/scale plans its own.

    python -m benchmarks.scale.foreign --build [--only 70b]     # make the steps (torch, onnxruntime-training; ~35 min)
    python -m benchmarks run scale/foreign [--only 70b-suffix] [--runs off:0,free:0.01]

scale/scale's steps are roam's own (roam's exporter, `make-training-graph`). These are
not: nothing of roam runs to make them. Each step is
1. the forward exported by torch's exporter, called directly (`torch.onnx.export(dynamo=True,
   optimize=False)`), opset 18, the
   logits flattened to [B·S, V] inside the exported module, the weights on the meta device (their
   initializers point into an external-data file that is never written);
2. the training graph made by ONNX Runtime's `onnxruntime.training.artifacts.generate_artifacts`
   as it comes (cross-entropy loss, no optimizer); only its checkpoint is not written (there are no
   weights to write: the gradient builder reads sparse stand-ins of the absent file);
3. the optimizer written by a script as another tool would: each gradient-accumulation node
   (`InPlaceAccumulatorV2`) dropped, AdamW appended after the whole backward, the order
   `loss.backward(); optimizer.step()` gives, as 14 plain ONNX elementwise nodes per parameter
   (moments, the update without bias correction, decoupled weight decay), the parameters and
   moments graph inputs and their new values graph outputs (a functional step: the caller donates
   the old state), the gradients transient.

The variants differ in the key/value heads, the batch, the vocabulary and how the step says which
output replaces which input: a name suffix roam knows (`.new`), the pairs in the
model's metadata (`roam.inplace`, as roam documents for tools that name outputs their own way), or
ONNX Runtime's artifacts left as they come (`InPlaceAccumulatorV2` into the accumulation buffers,
no optimizer). Not in the family, because the tools do not make them: the TorchScript exporter
(torch 2.13, transformers 4.57: "unordered_map::at" in the vmap of the attention mask, eager and
sdpa); the dynamo exporter's default optimisation (it reads every weight it might fold: on the
70B-class stand-ins it took 24 GB and was killed); sdpa attention without it (CastLike nodes, for
which ORT's gradient builder has no gradient). The variants: `suffix` (the base: LLaMA-2-70B's
shape, one key/value head per head, 1 × 512, outputs `<state>.new`), `metadata`, `artifacts`,
`gqa` (8 key/value heads), `4x2048` (batch 4 × 2,048), `llama3` (8 key/value heads and LLaMA-3's
128,256-token vocabulary). Planned as scale/scale plans: `roam optimize STEP --jobs 2 --recompute MODE --gap G` under
`/usr/bin/time -v`, then `roam verify`; by default `--recompute off --gap 0` (the order proven
optimal) and `--recompute free --gap 0.01` (the targets' settings). The steps are made into
benchmarks/.cache/foreign; planning them needs only roam, about 10 minutes for the twelve."""

from __future__ import annotations

import json
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from benchmarks import harness
from benchmarks.scale.scale import (Llama, build_steps, chosen, plan_options, plan_steps,  # noqa: F401 (table)
                                    quiet_meta_export, table)

TAKES = "about 10 min for 70b,405b; needs the steps (python -m benchmarks.scale.foreign --build: torch, ~35 min)"
CACHE = harness.CACHE / "foreign"
WEIGHTS = "absent_weights"  # the folder of external-data files the meta initializers point into, never written
MODELS = {
    "70b": Llama(80, 8192, 28672, 64),
    "405b": Llama(126, 16384, 53248, 128),
    "tiny": Llama(4, 64, 128, 16),
}


@dataclass(frozen=True)
class Foreign:
    attention: str = "eager"
    kv_heads: int | None = None
    form: str = "suffix"  # suffix: outputs <state>.new; metadata: outputs named apart, pairs in roam.inplace; artifacts
    batch: int = 1
    seq: int = 512
    vocab: int | None = None  # None: the size's

    def export_name(self, size: str) -> str:
        vocab = f"-v{self.vocab}" if self.vocab else ""
        return f"{size}-{self.attention}-{'gqa' if self.kv_heads else 'mha'}{vocab}-{self.batch}x{self.seq}"


VARIANTS = {
    "suffix": Foreign(),
    "gqa": Foreign(kv_heads=8),
    "metadata": Foreign(form="metadata"),
    "artifacts": Foreign(form="artifacts"),
    "4x2048": Foreign(batch=4, seq=2048),
    "llama3": Foreign(kv_heads=8, vocab=128256),  # LLaMA-3's vocabulary and key/value heads
}


def export_forward(spec: Llama, v: Foreign, path: Path) -> None:
    """The model's logits [B·S, V] for input ids [B, S], exported by torch's exporter itself."""
    import onnx
    import onnx_ir as ir
    import torch
    import transformers as hf

    quiet_meta_export()  # scale/scale's: the same two meta-device gaps closed

    class FlatLogits(torch.nn.Module):
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, input_ids):
            return self.m(input_ids=input_ids).logits.flatten(0, 1)

    config = hf.LlamaConfig(vocab_size=v.vocab or spec.vocab, hidden_size=spec.hidden, intermediate_size=spec.intermediate,
                            num_hidden_layers=spec.layers, num_attention_heads=spec.heads,
                            num_key_value_heads=v.kv_heads or spec.heads, attn_implementation=v.attention,
                            use_cache=False)
    rotary = hf.models.llama.modeling_llama.LlamaRotaryEmbedding(config, device="cpu")  # its buffer's value
    with torch.device("meta"):
        model = FlatLogits(hf.LlamaForCausalLM(config))
    model.train()
    ids = torch.zeros((v.batch, v.seq), dtype=torch.int64, device="meta")
    program = torch.onnx.export(model, (ids,), dynamo=True, optimize=False, opset_version=18,
                                input_names=["input_ids"], output_names=["logits"])
    for k, value in enumerate(program.model.graph.initializers.values()):
        t = value.const_value
        if getattr(getattr(t, "raw", None), "is_meta", False):
            if value.name.endswith("inv_freq"):
                value.const_value = ir.tensor(rotary.inv_freq.numpy(), name=value.name)
                continue
            value.const_value = ir.ExternalTensor(f"{WEIGHTS}/{k}", 0, int(t.dtype.itemsize * t.size), t.dtype,
                                                  shape=t.shape, name=value.name, base_dir=str(path.parent))
    onnx.save(ir.serde.serialize_model(program.model), str(path))


def sparse_stand_ins(folder: Path, model) -> None:
    """Each absent weights file as a sparse file of its size (ORT's gradient builder opens them),
    one per tensor: mmap refused a single file of a 70B-class model's 280 GB."""
    from onnx import TensorProto

    for t in model.graph.initializer:
        if t.data_location == TensorProto.EXTERNAL:
            kv = {e.key: e.value for e in t.external_data}
            (folder / kv["location"]).parent.mkdir(parents=True, exist_ok=True)
            with open(folder / kv["location"], "wb") as f:
                f.truncate(int(kv.get("offset", 0)) + int(kv["length"]))


def artifacts(forward: Path, out: Path) -> Path:
    """ONNX Runtime's training graph of the forward, made by generate_artifacts as it comes."""
    import onnx
    from onnx import TensorProto
    from onnxruntime.training import artifacts as ort_artifacts
    from onnxruntime.training import onnxblock

    model = onnx.load(str(forward), load_external_data=False)
    trainable = [t.name for t in model.graph.initializer if t.data_location == TensorProto.EXTERNAL]
    with tempfile.TemporaryDirectory() as tmp:
        sparse_stand_ins(Path(tmp), model)
        cwd = os.getcwd()
        os.chdir(tmp)
        save = onnxblock.save_checkpoint
        onnxblock.save_checkpoint = lambda *a, **k: None  # no weights to save (the only change to the route)
        try:
            ort_artifacts.generate_artifacts(model, requires_grad=trainable, loss=ort_artifacts.LossType.CrossEntropyLoss,
                                             artifact_directory=tmp)
        finally:
            onnxblock.save_checkpoint = save
            os.chdir(cwd)
        training = onnx.load(f"{tmp}/training_model.onnx", load_external_data=False)
    path = out / "training_model.onnx"
    onnx.save(training, str(path))
    return path


def functional_adamw(training_path: Path, out: Path, form: str, lr=1e-4, beta1=0.9, beta2=0.999, eps=1e-8,
                     weight_decay=0.01) -> Path:
    """The training graph as a functional AdamW step, written as a script outside roam would."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    m = onnx.load(str(training_path), load_external_data=False)
    g = m.graph
    accumulators = [n for n in g.node if n.op_type == "InPlaceAccumulatorV2"]
    gradient = {n.input[0].replace("_grad.accumulation.buffer", ""): n.input[1] for n in accumulators}
    for n in accumulators:
        g.node.remove(n)
    dropped = {o.name for o in g.output if o.name.endswith(".accumulation.out")}
    keep_out = [o for o in g.output if o.name not in dropped]
    del g.output[:]
    g.output.extend(keep_out)
    keep_in = [i for i in g.input if not i.name.endswith("_grad.accumulation.buffer") and i.name != "lazy_reset_grad"]
    del g.input[:]
    g.input.extend(keep_in)
    # generate_artifacts made each trainable parameter a graph input
    params = {i.name: [d.dim_value for d in i.type.tensor_type.shape.dim] for i in g.input if i.name in gradient}

    def const(name, value):
        g.initializer.append(numpy_helper.from_array(np.array(value, dtype=np.float32), f"adamw.{name}"))
        return f"adamw.{name}"

    b1, one_b1, b2, one_b2 = const("beta1", beta1), const("1-beta1", 1 - beta1), const("beta2", beta2), const("1-beta2", 1 - beta2)
    e, lr_, decay = const("eps", eps), const("lr", lr), const("lr*wd", lr * weight_decay)
    pairs = {}
    for i, (p, shape) in enumerate(params.items()):
        mom, var = f"{p}.exp_avg", f"{p}.exp_avg_sq"
        for name in (mom, var):
            g.input.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, shape))
        names = {p: f"{p}.new", mom: f"{mom}.new", var: f"{var}.new"} if form == "suffix" else \
            {p: f"state_out_{3 * i}", mom: f"state_out_{3 * i + 1}", var: f"state_out_{3 * i + 2}"}
        gr, k = gradient[p], f"adamw_{i}"
        nodes = [("Mul", [mom, b1], "m1"), ("Mul", [gr, one_b1], "g1"), ("Add", [f"{k}.m1", f"{k}.g1"], names[mom]),
                 ("Mul", [var, b2], "v1"), ("Mul", [gr, gr], "gg"), ("Mul", [f"{k}.gg", one_b2], "g2"),
                 ("Add", [f"{k}.v1", f"{k}.g2"], names[var]), ("Sqrt", [names[var]], "s"), ("Add", [f"{k}.s", e], "d"),
                 ("Div", [names[mom], f"{k}.d"], "u"), ("Mul", [f"{k}.u", lr_], "lu"), ("Mul", [p, decay], "wd"),
                 ("Sub", [p, f"{k}.wd"], "p1"), ("Sub", [f"{k}.p1", f"{k}.lu"], names[p])]
        for j, (op, ins, o) in enumerate(nodes):
            outname = o if o in names.values() else f"{k}.{o}"
            g.node.append(helper.make_node(op, ins, [outname], name=f"{k}_{j}_{op}"))
        for state, new in names.items():
            g.output.append(helper.make_tensor_value_info(new, TensorProto.FLOAT, shape))
            pairs[new] = state
    if form == "metadata":
        m.metadata_props.add(key="roam.inplace", value=json.dumps(pairs))
    path = out / f"step.{form}.onnx"
    onnx.save(m, str(path))
    return path


def step_path(cache: Path, size: str, v: Foreign) -> Path:
    folder = cache / v.export_name(size)
    return folder / ("training_model.onnx" if v.form == "artifacts" else f"step.{v.form}.onnx")


def build(size: str, v: Foreign, cache: Path) -> Path:
    step = step_path(cache, size, v)
    if step.exists():
        return step
    folder = step.parent
    folder.mkdir(parents=True, exist_ok=True)
    forward, training = folder / "forward.onnx", folder / "training_model.onnx"
    t = time.time()
    if not forward.exists():
        export_forward(MODELS[size], v, forward)
        print(f"{folder.name}: exported in {time.time() - t:.0f} s", flush=True)
    t = time.time()
    if not training.exists():
        artifacts(forward, folder)
        print(f"{folder.name}: generate_artifacts in {time.time() - t:.0f} s", flush=True)
    if v.form != "artifacts":
        functional_adamw(training, folder, v.form)
    return step


def main(argv: list[str]) -> dict:
    args = plan_options(__name__, __doc__, "comma-separated sizes (70b, 405b, tiny) or SIZE-VARIANT", CACHE).parse_args(argv)
    return plan_steps(args, [(f"{size}-{name}", step_path(args.cache, size, VARIANTS[name]), VARIANTS[name])
                             for size, name in chosen(args.only, MODELS, VARIANTS)], __name__)


if __name__ == "__main__":
    build_steps("benchmarks.scale.foreign", CACHE,
                lambda only: [(size, VARIANTS[name]) for size, name in chosen(only, MODELS, VARIANTS)])
