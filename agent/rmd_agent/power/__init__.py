"""Power telemetry: RAPL energy per zone, attributed to pods and containers by their cgroup CPU time.

* `rapl_sampler`  powercap counters per socket and zone, wraparound-corrected deltas, which zones overlap
* `cgroup_paths`  pure parser: pod uid, QoS class and container id from any kubelet cgroup path shape
* `cpu_time`      reads node busy time (/proc/stat) and pod/container CPU time (cgroup v1 and v2)
* `pod_meta`      pod uid -> namespace/name and container id -> name, from the kubelet's log directories
* `attribution`   pure: a zone's energy split into idle, system and per-pod/-container active energy
* `sampler`       the periodic task tying these together into immutable, consistent snapshots

docs/power.md explains the model; rmd_agent.metrics exports the snapshots.
"""
