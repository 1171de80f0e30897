"""The `intel.com/l3_cache_ways` device plugin (docs/deviceplugin.md)."""

from rmd_agent.deviceplugin.devices import WayDevice, WayPool
from rmd_agent.deviceplugin.plugin import CacheWaysPlugin, PoolProvider
from rmd_agent.deviceplugin.pools import engine_pools

__all__ = ["CacheWaysPlugin", "PoolProvider", "WayDevice", "WayPool", "engine_pools"]
