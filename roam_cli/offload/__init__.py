"""Memory tiers: which bytes leave the device for a slower tier (host memory, or storage paged to),
and what the host runs (`roam optimize --offload host|storage`).

A `Placement` (rewrite) says it in plain values: the forward values offloaded until the backward,
the persistent tensors kept in the slow tier, the nodes the host runs. `policies` makes the ones
users know (save_on_cpu, ZeRO-Offload, every persistent byte on the host); `rewrite` adds the
transfers to the graph, which roam then orders and lays out like any other; `timing` turns a
planned order into the steps a device profile's cost model estimates; `planner` weighs the
candidates, growing them until one fits the budget."""
