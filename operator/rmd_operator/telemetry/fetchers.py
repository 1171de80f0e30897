"""One fetch of one source, per type: Fake, Redfish inlet temperature, pressure API, V2 power prediction.

A fetcher is built from a source's spec and lives as long as its runner; it keeps what is worth keeping
between fetches (the Redfish path found, the predictor's endpoint from its provider, the sushy connection).
Secrets are read at every fetch, so rotated credentials are used without a restart (the reader may cache).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Final, Protocol, TypeVar
from urllib.parse import quote

import aiohttp

from rmd_operator.telemetry import credentials, parse
from rmd_operator.telemetry.credentials import BasicAuth, SecretReader
from rmd_operator.telemetry.errors import BAD_RESPONSE, INVALID_CONFIG, CollectError
from rmd_operator.telemetry.parse import InletPath, ProvidedEndpoint
from rmd_operator.telemetry.redfish import Bmc
from rmd_operator.telemetry.rest import request_json
from rmd_operator.telemetry.spec import (
    DELTA_P,
    FAKE,
    INLET_TEMP,
    POWER,
    REDFISH,
    V2_INFERENCE,
    EndpointTerm,
    Source,
)
from rmd_operator.telemetry.tls import Trust

log = logging.getLogger(__name__)

# wao-core's fake values (pkg/controller/nodeconfig_controller.go, pkg/predictor/fake): deterministic, so the
# demo and the tests can tell them apart and recognise them.
FAKE_VALUES: Final = {INLET_TEMP: 15.5, DELTA_P: 7.5, POWER: 3.14}
FAKE_DELAY: Final = 0.05
FAKE_PROVIDED: Final = ProvidedEndpoint(FAKE, "https://fake-endpoint")
_T = TypeVar("_T")


@dataclass(frozen=True)
class Reading:
    value: float
    detail: str = ""  # where it came from, for the Available condition's message


@dataclass(frozen=True)
class PredictorInputs:
    cpu_usage: float  # percent of the node's CPU capacity (WAO's cpuUsageFormat: Percent)
    inlet_temp: float
    delta_p: float


class Fetcher(Protocol):
    async def fetch(self, deadline: float) -> Reading: ...

    async def close(self) -> None: ...


# The predictor's inputs at fetch time; raises CollectError(InputsUnavailable) when one is missing.
InputsSource = Callable[[], Awaitable[PredictorInputs]]


class FakeFetcher:
    def __init__(self, value: float, delay: float = FAKE_DELAY) -> None:
        self.value, self.delay = value, delay

    async def fetch(self, deadline: float) -> Reading:
        await asyncio.sleep(self.delay)
        return Reading(self.value, "Fake")

    async def close(self) -> None:
        pass


class _BmcHolder:
    """A sushy Bmc, rebuilt when its credentials or trust change; one call at a time, in worker threads."""

    def __init__(self, term: EndpointTerm) -> None:
        self.term = term
        self._bmc: Bmc | None = None
        self._key: tuple[BasicAuth | None, Trust] | None = None
        self._busy: asyncio.Future[object] | None = None

    async def call(self, auth: BasicAuth | None, trust: Trust, fn: Callable[[Bmc], _T]) -> _T:
        if self._busy is not None and not self._busy.done():
            await asyncio.wait([self._busy])  # a cancelled fetch's thread is still finishing its request
        if self._bmc is None or self._key != (auth, trust):
            await self._close_bmc()
            self._bmc = Bmc(self.term.endpoint, auth, trust, request_timeout=self.term.fetch_interval)
            self._key = (auth, trust)
        bmc = self._bmc
        future = asyncio.ensure_future(asyncio.to_thread(fn, bmc))
        self._busy = future  # type: ignore[assignment]
        return await asyncio.shield(future)

    async def _close_bmc(self) -> None:
        if self._bmc is not None:
            bmc, self._bmc = self._bmc, None
            await asyncio.to_thread(bmc.close)

    async def close(self) -> None:
        if self._busy is not None and not self._busy.done():
            await asyncio.wait([self._busy])
        await self._close_bmc()


class RedfishInletFetcher:
    def __init__(self, term: EndpointTerm, namespace: str, secrets: SecretReader) -> None:
        self.term, self.namespace, self.secrets = term, namespace, secrets
        self._bmc = _BmcHolder(term)
        self.path: InletPath | None = None  # remembered after the first success

    async def fetch(self, deadline: float) -> Reading:
        auth = await credentials.basic_auth(self.secrets, self.namespace, self.term)
        trust = await credentials.trust(self.secrets, self.namespace, self.term)
        remembered = self.path
        value, path = await self._bmc.call(
            auth, trust, lambda bmc: bmc.inlet_temperature(remembered, deadline)
        )
        if path != self.path:
            log.info("inlet temperature of %s found at %s (%s)", self.term.endpoint, path.path, path.label)
            self.path = path
        return Reading(value, f"{path.label or path.path}: {path.path}")

    async def close(self) -> None:
        await self._bmc.close()


class PressureFetcher:
    def __init__(
        self,
        term: EndpointTerm,
        namespace: str,
        node: str,
        secrets: SecretReader,
        session: aiohttp.ClientSession,
    ) -> None:
        self.term, self.namespace, self.secrets, self.session = term, namespace, secrets, session
        self.url = f"{term.endpoint}/api/sensor/by_nodename/{quote(node, safe='')}"

    async def fetch(self, deadline: float) -> Reading:
        auth = await credentials.basic_auth(self.secrets, self.namespace, self.term)
        trust = await credentials.trust(self.secrets, self.namespace, self.term)
        doc = await request_json(
            self.session, "GET", self.url, budget=deadline - time.monotonic(), trust=trust, auth=auth
        )
        return Reading(parse.differential_pressure(doc), self.url)

    async def close(self) -> None:
        pass


class PowerFetcher:
    """POST the node's inputs to a V2 inference endpoint: the spec's, or the one its provider names."""

    def __init__(
        self,
        source: Source,
        namespace: str,
        secrets: SecretReader,
        session: aiohttp.ClientSession,
        inputs: InputsSource,
    ) -> None:
        self.term, self.provider = source.term, source.provider
        self.namespace, self.secrets, self.session, self.inputs = namespace, secrets, session, inputs
        self._provider_bmc = (
            _BmcHolder(self.provider) if self.provider and self.provider.type == REDFISH else None
        )
        self.provided: ProvidedEndpoint | None = None  # asked again after any failure

    async def _endpoint(self, deadline: float) -> ProvidedEndpoint:
        if self.provider is None:
            return ProvidedEndpoint(self.term.type, self.term.endpoint)
        if self.provided is None:
            if self._provider_bmc is None:
                self.provided = FAKE_PROVIDED
            else:
                auth = await credentials.basic_auth(self.secrets, self.namespace, self.provider)
                trust = await credentials.trust(self.secrets, self.namespace, self.provider)
                self.provided = await self._provider_bmc.call(
                    auth, trust, lambda bmc: bmc.power_model(deadline)
                )
                log.info("power model of %s served at %s", self.provider.endpoint, self.provided.endpoint)
        return self.provided

    async def fetch(self, deadline: float) -> Reading:
        try:
            return await self._fetch(deadline)
        except CollectError:
            self.provided = None
            raise

    async def _fetch(self, deadline: float) -> Reading:
        provided = await self._endpoint(deadline)
        if provided.type == FAKE:
            await asyncio.sleep(FAKE_DELAY)
            return Reading(FAKE_VALUES[POWER], "Fake")
        if provided.type != V2_INFERENCE:
            raise CollectError(
                INVALID_CONFIG, f"predictor type {provided.type!r} is not {V2_INFERENCE} or {FAKE}"
            )
        target = parse.inference_endpoint(provided.endpoint)
        inputs = await self.inputs()
        auth = await credentials.basic_auth(self.secrets, self.namespace, self.term)
        trust = await credentials.trust(self.secrets, self.namespace, self.term)
        doc = await request_json(
            self.session,
            "POST",
            target.infer_url,
            budget=deadline - time.monotonic(),
            trust=trust,
            auth=auth,
            body=parse.inference_request(inputs.cpu_usage, inputs.inlet_temp, inputs.delta_p),
        )
        return Reading(parse.inference_watts(doc), f"model {target.model} at {target.infer_url}")

    async def close(self) -> None:
        if self._provider_bmc is not None:
            await self._provider_bmc.close()


def build(
    source: Source,
    *,
    namespace: str,
    node: str,
    secrets: SecretReader,
    session: aiohttp.ClientSession,
    inputs: InputsSource,
) -> Fetcher:
    """The fetcher for a source whose spec has no problem (spec.Source.problem is None)."""
    term = source.term
    if source.kind == POWER:
        if term.type == FAKE and source.provider is None:
            return FakeFetcher(FAKE_VALUES[POWER])
        return PowerFetcher(source, namespace, secrets, session, inputs)
    if term.type == FAKE:
        return FakeFetcher(FAKE_VALUES[source.kind])
    if source.kind == INLET_TEMP:
        return RedfishInletFetcher(term, namespace, secrets)
    if source.kind == DELTA_P:
        return PressureFetcher(term, namespace, node, secrets, session)
    raise CollectError(BAD_RESPONSE, f"no collector for {source.kind} type {term.type}")
