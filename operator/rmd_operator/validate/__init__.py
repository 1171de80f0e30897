"""`rmdctl validate`: a client-side report of what stops RMD from working on a cluster (docs/validate.md).

collect.py reads the API objects (and each agent's serving certificate) into a Snapshot (snapshot.py); the
checks (node_checks.py, cluster_checks.py, scheduler.py, crd_schema.py, certs.py) turn a Snapshot into
Findings (findings.py) and do no I/O, so they are tested on plain dicts; report.py prints them.
"""
