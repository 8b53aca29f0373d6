"""roam's own backward: reverse-mode differentiation over ONNX graphs in standard ONNX ops
(issue 19). `engine.differentiate` walks the forward from the loss; `rules.RULES` holds one
gradient rule per forward op, in family modules; `loss` adds a loss to an inference export;
`step` assembles the training graph with ONNX Runtime's artifacts names."""
