"""Test infrastructure: simulated nodes (host trees, resctrl rules, a simulated kubelet), the test
control plane, the simulated cluster and the demo. Never imported by the agent or the operator."""

import os

# rmd_sim starts processes (fork + exec) while gRPC threads are busy. gRPC's fork handlers exist for children
# that go on using gRPC; ours exec at once, and the handlers have aborted such children ("Other threads are
# currently calling into gRPC, skipping fork() handlers"). Only effective when set before grpc is imported.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")
