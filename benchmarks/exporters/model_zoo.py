"""MODeL's benchmark list through roam's backward: planned peak beside PyTorch eager's, batch 1 and 32.

The models and inputs of facebookresearch/OLLA's benchmarks.py (the "train" rows of its
benchmarks.sh): torchvision's alexnet, efficientnet_b0, googlenet and inception_v3 (their auxiliary
outputs concatenated to the logits, as OLLA's wrappers do), mnasnet0_5, mobilenet_v2, resnet18,
resnet50, video.r3d_18 (3x1x112x112), squeezenet1_0, vgg16, vgg19, vit_b_16; `torch.nn.Transformer`
(nhead 1, one encoder and one decoder layer, source 10 and target 20 positions of 512); and for
torchtext's ROBERTA_BASE_ENCODER and XLMR_BASE_ENCODER (torchtext is not installable beside torch
2.13) transformers' RobertaModel / XLMRobertaModel at the same sizes (12 layers, 768 wide, vocabularies
50265 / 250002, no pooler) on OLLA's input "Hello world": 4 tokens. All built on the "meta" device
(no weights; BatchNorm statistics exported as zeros and ones), in train mode.

Per model and batch: the module is exported by `roam_cli.frontend.torch_export` (weights never
written), `roam make-training-graph --loss L --in-graph-optimizer` builds the full AdamW step with
roam's backward (L: cross-entropy for the classifiers, mse for the encoders' hidden states and the
Transformer's output), `roam optimize --recompute off` plans it: the planned peak is persistent +
arena bytes. PyTorch eager's peak is `pytorch_memory.step_memory` (MemTracker around the second
AdamW step under FakeTensorMode, the same loss; recompute/pytorch_memory). A step that fails
gives its one-line reason.

torchvision 0.28.0 (the release for torch 2.13) is on the package index only as a CUDA build, whose
C extension does not load beside the CPU torch: `import torchvision` then fails registering its
meta kernels (`operator torchvision::nms does not exist`). The model definitions are plain Python:
here they are imported with the package's `__init__` skipped (install the wheel with `pip install
--no-deps --target DIR` and put DIR on PYTHONPATH).

    PYTHONPATH=DIR python -m benchmarks run exporters/model_zoo                 # 16 models x 2 batches, about 30 min
    PYTHONPATH=DIR python -m benchmarks run exporters/model_zoo.smoke --only alexnet --batch 1

Needs the bench extra (torch, transformers) and torchvision's model definitions (above)."""

from __future__ import annotations

import importlib.util
import json
import statistics
import subprocess
import sys
import tempfile
import time
import types
import warnings
from pathlib import Path

try:
    import torch
except ImportError:  # the records' tables need no torch; measuring does
    torch = None

from benchmarks import harness
from benchmarks.recompute.pytorch_memory import step_memory
from roam_cli.core.fileio import write_atomic
from roam_cli.frontend import torch_export

TAKES = "about 30 min; needs the bench extra (torch, transformers) and torchvision's model definitions"
MODELS = ("alexnet", "bert", "efficientnet", "googlenet", "inception", "mnasnet", "mobilenet", "resnet", "resnet50",
          "resnet3d", "squeezenet", "transformer", "vgg16", "vgg19", "vit", "xlmr")
TOKENS = 4  # "Hello world" through the RoBERTa / XLM-R transforms: <s> Hello world </s>


def torchvision_models():
    """torchvision.models without torchvision/__init__ (which fails on a CUDA build beside CPU torch)."""
    if "torchvision" not in sys.modules:
        spec = importlib.util.find_spec("torchvision")
        if spec is None:
            raise RuntimeError("torchvision is not installed")
        package = types.ModuleType("torchvision")
        package.__path__, package.__spec__ = list(spec.submodule_search_locations), spec
        sys.modules["torchvision"] = package
    import torchvision.models
    import torchvision.models.video  # noqa: F401
    return torchvision.models


class Concatenated(torch.nn.Module if torch else object):
    """OLLA's GoogLeNet / Inception wrapper: in train mode the logits and auxiliary logits, concatenated."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, x):
        out = self.model(x)
        parts = [out.logits, out.aux_logits] if hasattr(out, "aux_logits") else [out[0], out[1], out[2]]
        return torch.cat(parts, dim=-1)


class Encoder(torch.nn.Module if torch else object):
    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, ids):
        # the mask given (all tokens real, as OLLA's "Hello world"): without one, transformers checks the
        # ids for padding with a data-dependent test, which PyTorch's FakeTensorMode cannot run
        return self.model(input_ids=ids, attention_mask=torch.ones_like(ids)).last_hidden_state


def build(name: str, batch: int):
    """(module in train mode on "meta", its example inputs on "meta", --loss)."""
    image = torch.empty(batch, 3, 224, 224, device="meta")
    with torch.device("meta"):
        if name in ("bert", "xlmr"):
            if importlib.util.find_spec("torchvision") is not None:
                torchvision_models()  # transformers imports torchvision where it is: without its __init__
            import transformers as hf

            cls = hf.RobertaModel if name == "bert" else hf.XLMRobertaModel
            config = (hf.RobertaConfig if name == "bert" else hf.XLMRobertaConfig)(
                **({} if name == "bert" else {"vocab_size": 250002}), attn_implementation="eager")  # SDPA's mask test is data-dependent
            module = Encoder(cls(config, add_pooling_layer=False))
            return module.train(), (torch.zeros(batch, TOKENS, dtype=torch.int64, device="meta"),), "mse"
        if name == "transformer":
            module = torch.nn.Transformer(nhead=1, num_encoder_layers=1, num_decoder_layers=1)
            return module.train(), (torch.empty(10, batch, 512, device="meta"),
                                    torch.empty(20, batch, 512, device="meta")), "mse"
        tv = torchvision_models()
        module = {"alexnet": tv.alexnet, "efficientnet": tv.efficientnet_b0, "mnasnet": tv.mnasnet0_5,
                  "mobilenet": tv.mobilenet_v2, "resnet": tv.resnet18, "resnet50": tv.resnet50,
                  "squeezenet": tv.squeezenet1_0, "vgg16": tv.vgg16, "vgg19": tv.vgg19, "vit": tv.vit_b_16,
                  "resnet3d": tv.video.r3d_18, "googlenet": lambda: Concatenated(tv.googlenet(init_weights=False)),
                  "inception": lambda: Concatenated(tv.inception_v3(init_weights=False))}[name]()
    if name == "resnet3d":
        image = torch.empty(batch, 3, 1, 112, 112, device="meta")
    elif name == "inception":
        image = torch.empty(max(batch, 2), 3, 299, 299, device="meta")  # OLLA: batch >= 2 when training
    return module.train(), (image,), "cross-entropy"


def fill_buffers(module: torch.nn.Module) -> None:
    """The initialiser `torch_export` calls for buffers on "meta" (it looks for transformers'
    `_init_weights`): running variances 1, every other buffer 0 (means, counters)."""
    for key, b in module._buffers.items():
        if b is not None:
            b.fill_(1 if key == "running_var" else 0)


def roam(*args: str, timeout: float) -> str:
    run = subprocess.run([sys.executable, "-m", "roam_cli", "-q", *args], capture_output=True, text=True, cwd=harness.ROOT,
                         timeout=timeout, check=False)
    if run.returncode != 0:
        raise RuntimeError(f"roam {args[0]}: {(run.stderr or run.stdout).strip().splitlines()[-1]}")
    return run.stdout


def planned(name: str, batch: int, folder: Path, timeout: float) -> tuple[dict, float]:
    module, args, loss = build(name, batch)
    if not hasattr(module, "_init_weights"):
        module._init_weights = fill_buffers
    inputs = [f"input_{k}" for k in range(len(args))]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        exported = torch_export.export(module, args, inputs, ["output"])
    forward, step, plan = folder / "forward.onnx", folder / "step.onnx", folder / "plan.json"
    write_atomic(forward, exported.model.SerializeToString())
    t = time.time()
    roam("make-training-graph", str(forward), "-o", str(step), "--loss", loss, "--in-graph-optimizer", timeout=timeout)
    build_s = time.time() - t
    roam("optimize", str(step), "-o", str(plan), "--recompute", "off", timeout=timeout)
    return json.loads(plan.read_text()), build_s


def row(name: str, batch: int, timeout: float) -> dict:
    r = {"model": name, "batch": batch}
    try:
        with tempfile.TemporaryDirectory() as scratch:
            plan, build_s = planned(name, batch, Path(scratch), timeout)
        r |= {"roam": plan["persistent_bytes"] + plan["arena_bytes"], "build_s": round(build_s, 1)}
    except Exception as e:  # noqa: BLE001  (the row says why)
        reason = str(e).strip().splitlines()[-1] if str(e).strip() else type(e).__name__
        return r | {"error": f"{type(e).__name__}: {reason[:200]}"}
    try:
        module, args, loss = build(name, batch)
        eager = step_memory(module, args, loss, args[0].shape[0])["peak"]["Total"]  # inception: 2 images at batch 1
        r |= {"eager": eager, "ratio": r["roam"] / eager}
    except Exception as e:  # noqa: BLE001
        r["eager_error"] = f"{type(e).__name__}: {str(e).strip().splitlines()[0][:120]}"
    return r


def main(argv: list[str]) -> list[dict]:
    harness.needs_torch(torch, __name__)
    ap = harness.options(__name__, __doc__)
    ap.add_argument("--only", default=",".join(MODELS))
    ap.add_argument("--batch", default="1,32")
    ap.add_argument("--timeout", type=float, default=300, help="seconds for each roam command")
    args = ap.parse_args(argv)
    harness.quiet_torch(torch)
    rows = []
    for name in args.only.split(","):
        for batch in map(int, args.batch.split(",")):
            rows.append(row(name, batch, args.timeout))
            print(f"{name} batch {batch}: {rows[-1].get('error') or rows[-1].get('ratio')}", file=sys.stderr,
                  flush=True)
    return rows


DESCRIBED = {"bert": "RobertaModel, 4 tokens", "efficientnet": "efficientnet_b0", "googlenet": "+ aux logits",
             "inception": "inception_v3, + aux logits; batch 1 trains on 2 images", "mnasnet": "mnasnet0_5",
             "mobilenet": "mobilenet_v2", "resnet": "resnet18", "resnet3d": "r3d_18, 3x1x112x112",
             "squeezenet": "squeezenet1_0", "transformer": "nn.Transformer, 1+1 layers, 1 head", "vit": "vit_b_16",
             "xlmr": "XLMRobertaModel, 4 tokens"}


def table(rows: list[dict]) -> str:
    """MiB; a row per model, its batches side by side."""
    batches = list(dict.fromkeys(r["batch"] for r in rows))
    by: dict[str, dict[int, dict]] = {}
    for r in rows:
        by.setdefault(r["model"], {})[r["batch"]] = r

    def cells(r: dict | None) -> list[str]:
        if r is None:
            return ["–"] * 4
        if "error" in r:
            return [f"fails: {r['error']}", "–", "–", "–"]
        if "eager_error" in r:
            return [harness.mib(r["roam"], 1), f"eager fails: {r['eager_error']}", "–", f"{r['build_s']:.0f}"]
        return [harness.mib(r["roam"], 1), harness.mib(r["eager"], 1), f"{r['ratio']:.3f}", f"{r['build_s']:.0f}"]

    out = []
    for model, runs in by.items():
        columns = list(zip(*(cells(runs.get(b)) for b in batches)))
        label = f"{model} ({DESCRIBED[model]})" if model in DESCRIBED else model
        out.append([label, *(" / ".join(c) for c in columns)])
    each = " / ".join(map(str, batches))
    text = harness.markdown_table(
        ["model", f"roam planned peak MiB, batch {each}", f"PyTorch eager peak MiB, batch {each}",
         f"roam / eager, batch {each}", f"roam step build s, batch {each}"], out, "lrrrr")
    ok = [r["ratio"] for r in rows if "ratio" in r]
    if ok:
        text += f"\nroam's plan (`--recompute off`) is below PyTorch eager's on {sum(x < 1 for x in ok)} of {len(ok)} " \
                f"rows (median roam / eager {statistics.median(ok):.2f}).\n"
    return text
