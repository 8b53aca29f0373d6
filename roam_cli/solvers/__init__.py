"""The general solvers the stages call: MILPs through PuLP (CBC) or HiGHS, and max-flow/min-cut."""
