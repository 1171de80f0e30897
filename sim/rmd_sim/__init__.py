"""Test infrastructure: simulated nodes (host trees, resctrl rules, a simulated kubelet), the test
control plane and the demo. Never imported by the agent or the operator."""
