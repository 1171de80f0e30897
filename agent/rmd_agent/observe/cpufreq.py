"""Per-CPU frequency limits (sys/devices/system/cpu/cpuN/cpufreq), in kHz as the kernel reports them."""

from __future__ import annotations

from dataclasses import dataclass

from rmd_agent.errors import HostReadError, Unsupported
from rmd_agent.hostfs import HostFS
from rmd_agent.observe.cpus import CPU_DIR, read_online_cpus


@dataclass(frozen=True)
class CpuFreq:
    cpu: int
    cpuinfo_min_khz: int
    cpuinfo_max_khz: int
    driver: str  # one cpufreq driver serves every CPU: read from the first


def read_cpufreq(fs: HostFS) -> list[CpuFreq] | Unsupported:
    """Hardware frequency range of every online CPU; Unsupported if any online CPU lacks cpufreq (common in
    VMs). Only what the probe reports is read: 2 files a CPU, the limits the P-state plugin sets are read
    where it sets them (rmd_agent.pstate)."""
    online = read_online_cpus(fs)
    if isinstance(online, Unsupported):
        return online
    result = []
    driver = ""
    for cpu in sorted(online):
        base = f"{CPU_DIR}/cpu{cpu}/cpufreq"
        if not fs.is_dir(base):
            return Unsupported(
                f"no cpufreq for CPU {cpu} (/{base} is absent: no frequency driver, typical in VMs)"
            )
        try:
            driver = driver or fs.read_str(f"{base}/scaling_driver")
            result.append(
                CpuFreq(
                    cpu=cpu,
                    cpuinfo_min_khz=fs.read_int(f"{base}/cpuinfo_min_freq"),
                    cpuinfo_max_khz=fs.read_int(f"{base}/cpuinfo_max_freq"),
                    driver=driver,
                )
            )
        except HostReadError as exc:
            return Unsupported(f"cpufreq is not readable: {exc}")
    return result
