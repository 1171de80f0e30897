"""The capabilities in the node summary (and so in the RmdNodeState): the probe's findings, probed again at
most every PROBE_TTL_S (almost none change while the agent runs), except what pod lookups use, which is read
from the running lookup each time."""

from __future__ import annotations

import time

from rmd_agent.kubelet.pod_lookup import PodLookup
from rmd_agent.probe import pod_lookup_finding, probe_async
from rmd_agent.settings import AgentSettings

PROBE_TTL_S = 30.0


class NodeCapabilities:
    def __init__(self, settings: AgentSettings, lookup: PodLookup, ttl: float = PROBE_TTL_S) -> None:
        self.settings = settings
        self.lookup = lookup
        self.ttl = ttl
        self._probed_at = float("-inf")
        self._findings: dict[str, tuple[bool, str]] = {}

    def expire(self) -> None:
        """Probe again at the next current(): something the findings describe changed (resctrl mounted or
        unmounted)."""
        self._probed_at = float("-inf")

    async def refresh(self) -> None:
        """Probe now."""
        report = await probe_async(self.settings, lookup=self.lookup)
        self._findings = {f.feature: (f.supported, f.detail) for f in report.findings}
        self._probed_at = time.monotonic()

    async def current(self) -> dict[str, tuple[bool, str]]:
        """Feature -> (supported, detail)."""
        if time.monotonic() - self._probed_at >= self.ttl:
            await self.refresh()
        capabilities = dict(self._findings)
        if self.lookup.api.get is not None:
            # What pod lookups use now, not as of the last probe (up to `ttl` ago).
            lookup = pod_lookup_finding(self.lookup.api)
            capabilities[lookup.feature] = (lookup.supported, lookup.detail)
        return capabilities
