"""Run by tests/shard/test_ranks.py under `mpiexec -n 2`: one ONNX Runtime session of AllGather and
ReduceScatter nodes (roam's MPI collectives), fed rank-dependent values; each rank saves what it
got to OUT/rank<r>.npz."""

import sys

import numpy as np
import onnxruntime as ort
from mpi4py import MPI
from onnx import TensorProto, helper

from roam_cli.runtime import collectives

comm = MPI.COMM_WORLD
r, n = comm.rank, comm.size
collectives.use(comm)
F = TensorProto.FLOAT
nodes = [helper.make_node("AllGather", ["a"], ["gathered"], domain="com.microsoft", name="g0", group_size=n, axis=0),
         helper.make_node("AllGather", ["m"], ["gathered_columns"], domain="com.microsoft", name="g1", group_size=n,
                          axis=1),
         helper.make_node("ReduceScatter", ["b"], ["mean"], domain="ai.roam.collective", name="s0", group_size=n, axis=0,
                          reduction="mean"),
         helper.make_node("ReduceScatter", ["b"], ["sum"], domain="ai.roam.collective", name="s1", group_size=n, axis=0,
                          reduction="sum")]
graph = helper.make_graph(nodes, "collectives",
                          [helper.make_tensor_value_info(name, F, shape) for name, shape in
                           (("a", [2]), ("m", [2, 1]), ("b", [2 * n]))],
                          [helper.make_tensor_value_info(name, F, shape) for name, shape in
                           (("gathered", [2 * n]), ("gathered_columns", [2, n]), ("mean", [2]), ("sum", [2]))])
model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
model.ir_version = 8
options = ort.SessionOptions()
collectives.register(options)
session = ort.InferenceSession(collectives.runnable(model, {"a": F, "m": F, "b": F}).SerializeToString(), options,
                               providers=["CPUExecutionProvider"])
feeds = {"a": np.array([r + 1, 10 * (r + 1)], np.float32), "m": np.array([[r], [r + 100]], np.float32),
         "b": np.arange(2 * n, dtype=np.float32) * (r + 1)}
np.savez(f"{sys.argv[1]}/rank{r}.npz", **dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds))))
