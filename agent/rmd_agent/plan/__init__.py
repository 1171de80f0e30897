"""Pure planning: desired state from observed state and requests, with no I/O (import-linter enforces it).

`workload` is what a workload asks for and whether a node can give it; `policy` the gold/silver/bronze
bundles; `inventory` describes a node for the planners; `resctrl_layout` turns workloads into resctrl groups
(`plan_layout`) and the operations that get there (`diff`). Import those modules directly: this package
imports nothing.
"""
