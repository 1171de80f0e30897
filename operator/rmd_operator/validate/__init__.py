"""`rmdctl validate`: a client-side report of what stops RMD from working on a cluster (docs/validate.md).

collect.py reads the API objects (and, with tls_peer.py, each agent's serving certificate) into a Snapshot
(snapshot.py); the checks turn a Snapshot into Findings (findings.py) and do no I/O, so they are tested on
plain dicts: per node (node_checks.py: agent_check.py, capability_checks.py, resource_checks.py,
certificate_check.py with certs.py) and for the cluster (cluster_checks.py, with scheduler.py and
crd_schema.py), over what context.py works out once; checks.py runs them all and report.py prints them.
"""
