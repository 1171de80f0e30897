"""Read-only views of the host (sysfs, procfs, cgroupfs). Every reader takes a HostFS and returns plain data,
or Unsupported with a reason when the host lacks the feature; none of them writes anything."""
