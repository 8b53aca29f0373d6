"""What a planned step costs on a device: a device `profile` (compute rates, memory, the link to
a slower tier, energy figures; shipped ones in `profiles/`) and `estimate`, which simulates a
planned order of compute and transfer steps on it for the step's time and energy
(docs/cost.md)."""
