"""What talks to ONNX Runtime at run time: executing and checking a plan, the plan-consuming
allocator, and training with it."""
