"""NodeResourceTopology export: this node's NUMA zones and what is free in them, published as a
`topology.node.k8s.io/v1alpha2` object for the scheduler-plugins NodeResourceTopologyMatch plugin.

zones.py and fingerprint.py are pure (state in, object out); triggers.py, publisher.py and exporter.py do
the I/O. docs/topology.md describes what is published and why.
"""
