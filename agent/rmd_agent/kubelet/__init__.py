"""What the agent reads from the kubelet: its config file, its checkpoint files and its PodResources API, and
a container's exclusive CPUs answered from the last two (container_cpus)."""
