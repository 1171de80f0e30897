"""Writes to the host: apply a plan with the fewest writes, in a safe order, undone if the kernel refuses.

`rmd_agent.act.resctrl_apply` executes `plan.resctrl_layout.diff` operations on the resctrl mount.
"""
