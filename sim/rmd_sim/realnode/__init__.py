"""A real kubelet with containerd as a test node (see node.py)."""
