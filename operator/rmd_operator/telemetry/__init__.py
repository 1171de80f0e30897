"""Node telemetry for nodes without RAPL, as WAO collects it: a library the operator's handlers drive.

One `TelemetryManager` (manager.py) holds a runner per NodeConfig source (inletTemp, deltaP,
powerConsumption). It knows nothing of kopf: the handlers call `apply(key, spec)` on create/update,
`remove(key)` on delete, and read `snapshot()` for status and metrics.

    spec.py        NodeConfig spec -> typed sources; durations; problems a source cannot run with (pure)
    errors.py      CollectError and its reasons (Unreachable, Unauthorized, TLSError, BadResponse, ...)
    parse.py       Redfish, pressure API and V2 documents -> values (pure)
    backoff.py     retry delays inside one fetch, and between failing fetches (pure)
    state.py       a source's value, age, errors and conditions; what changed (pure)
    tls.py         trust settings (CA bundle, explicit skip) for aiohttp and sushy
    redfish.py     inlet temperature and the predictor's endpoint over Redfish (sushy, in worker threads)
    rest.py        the pressure API and V2 inference calls (aiohttp)
    fetchers.py    one fetch per source type (Fake included) with deadline and retries
    runner.py      the loop of one source: fetch every interval, report
    manager.py     runners per NodeConfig: apply, remove, snapshot
    catalog.py     the metrics the operator exports for them; metrics.py renders a snapshot
"""
