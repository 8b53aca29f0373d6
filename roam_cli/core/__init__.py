"""The graph IR every pass reads, the memory model, the plan and the small things all stages share."""
