"""The RMD node agent: observes the host, plans and applies RDT/P-state state, serves the operator."""
