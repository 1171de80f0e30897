"""What the agent reads from the kubelet: its config file, its checkpoint files and its PodResources API."""
