"""The simulated node: host trees, resctrl rules and a simulated kubelet for tests, benchmarks and the demo."""
