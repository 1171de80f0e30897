"""Pure planning: desired state from observed state and requests, with no I/O.

`rmd_agent.plan.inventory` describes a node for the planners; `rmd_agent.plan.resctrl_layout` turns
workloads into resctrl groups (`plan_layout`) and the operations that get there (`diff`). Import those
modules directly: this package imports nothing, so `rmd_agent.workload` can use the inventory without an
import cycle.
"""
