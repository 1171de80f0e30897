"""The RMD operator (kopf): RmdWorkload and pod reconciliation through the node agents."""
