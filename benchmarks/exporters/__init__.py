"""roam's backward (`make-training-graph`) on what users export, against PyTorch autograd. The
exporter corpus takes 27 Hugging Face architectures in tiny configurations (random weights moved by
N(0, 0.02²), dropout 0, eval mode as users export them), exports each with torch.onnx's dynamo
exporter (its default, and `optimize=False`) and TorchScript, makes each export a training graph,
runs it on ONNX Runtime on PyTorch's weights and one batch, and compares every parameter's gradient
with autograd's on the same module (norm-relative error; tolerance max(1e-4, 10 × PyTorch's own
float32-vs-float64 error)). An export the exporter cannot make is not counted against roam. The
autograd check does the same at published widths (GPT-2 small at full depth) through roam's own
export route and adds 20 in-graph AdamW steps against torch.optim.AdamW."""

TITLE = "Training what users export: roam's backward against PyTorch autograd"
# The records whose tables open the area's section (and what `python -m benchmarks run exporters` runs).
HEADLINES = [("exporters/exporters_corpus", []), ("exporters/autograd_check", []),
             ("exporters/gradcheck_corpus.transformers",
              ["--only", "gpt2,gpt-neo,gpt-neox,opt,bloom,llama-gqa,mistral,qwen2,qwen3,phi3,gemma,falcon,bert,roberta,"
                         "distilbert,albert,electra,deberta-v2,vit,deit,swin,segformer"]),
             ("exporters/gradcheck_corpus.convnets", ["--only", "convnext,resnet,mobilenet-v2,mobilenet-v2-default,efficientnet"])]
DETAILS = "docs/benchmarks/exporters.md"


def readme_rows(load) -> list[dict]:
    """The corpus: exports trained within tolerance, refused, wrong; the autograd check's GPT-2 small."""
    rows = []
    try:
        corpus = load("exporters/exporters_corpus")
    except OSError:
        corpus = None
    if corpus:
        made = [r for r in corpus if "export_error" not in r and "crash" not in r]
        good = [r for r in made if "errors" in r and not r["over"]]
        refused = [r for r in made if r.get("exit") == 2 and len(r["stderr"]) == 1]
        other = len(made) - len(good) - len(refused)
        models = len({r["model"] for r in corpus})
        exporters = len({r["exporter"] for r in corpus})
        rows.append({"against": "PyTorch autograd", "workload": f"{models} architectures × {exporters} exporter settings "
                     "(tiny configurations)", "figure": f"{len(good)} of {len(made)} exports trained with every gradient "
                     f"within tolerance, {len(refused)} refused in one line, {other} failing otherwise",
                     "record": "exporters/exporters_corpus"})
    try:
        check = {r["model"]: r for r in load("exporters/autograd_check")}
    except OSError:
        check = {}
    gpt2 = check.get("gpt2")
    if gpt2 and "error" not in gpt2:
        rows.append({"against": "PyTorch autograd + torch.optim.AdamW", "workload": "GPT-2 small (12 layers): "
                     "gradients, 20 AdamW steps", "figure": f"worst gradient {gpt2['worst']:.1e}, losses "
                     f"{gpt2['loss_error']:.1e} apart (relative)", "record": "exporters/autograd_check"})
    return rows
