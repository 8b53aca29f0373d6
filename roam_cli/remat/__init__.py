"""Rematerialisation on a bare compute graph (`roam remat`): the order of a node-link graph's
nodes, a node allowed to run more than once, that fits a memory budget at the least total
compute. `graph` reads the file and measures a schedule, `solve` finds one, `check` validates
one with code of its own (it imports nothing from roam)."""
