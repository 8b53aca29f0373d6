#!/usr/bin/env python3
"""Write `gpt2_tiny/model.onnx`: the sample's GPT-2 (the configuration and seeded initialisation of
`make_gpt2_tiny.py`'s training graph) exported for inference — `input_ids -> logits`, eval mode, a
symbolic batch — by `roam_cli.frontend.torch_export` (the dynamo exporter with every parameter
kept as PyTorch has it, the graph otherwise cleaned as `optimize=True` cleans it). The input of the
README's `make-training-graph`, `--precision`, `max-batch` and `--dim` lines.

Needs torch (CPU build) and transformers 5, as `make_gpt2_tiny.py`:
`python sample_models/make_gpt2_tiny_export.py` from the repository root."""

import sys
from pathlib import Path

import onnx

from roam_cli.frontend import torch_export

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import make_gpt2_tiny as sample  # noqa: E402  (the sample's configuration and weights)


def main() -> None:
    import torch

    args = sample.parse_args([])
    sample.seed_everything()
    _, model = sample.build_model(args)
    model.eval()

    class Logits(torch.nn.Module):
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, input_ids):
            return self.m(input_ids=input_ids, use_cache=False).logits

    ids = torch.zeros((args.batch, args.seq), dtype=torch.int64)
    batch = torch.export.Dim("batch", min=1, max=1024)
    out = HERE / "gpt2_tiny" / "model.onnx"
    m = torch_export.export(Logits(model), (ids,), ["input_ids"], ["logits"], prefix="m.",
                            dynamic_shapes={"input_ids": {0: batch}}).model
    onnx.save(m, str(out))
    print(f"wrote {out}: {len(m.graph.node)} nodes, {len(m.graph.initializer)} initializers, input "
          f"{[d.dim_param or d.dim_value for d in m.graph.input[0].type.tensor_type.shape.dim]}")


if __name__ == "__main__":
    main()
