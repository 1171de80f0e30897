"""The agent's Prometheus metrics: the catalog of every name, and collectors rendering snapshots.

Everything goes on the one registry the agent serves at /metrics:

    registry.register(PowerCollector(sampler))       # sampler: rmd_agent.power.sampler.PowerSampler
    registry.register(RdtCollector(fs, engine.list))  # and run RdtCollector.run() as a task

docs/metrics.md is generated from `catalog` by tools/gen_metrics_doc.py.
"""
