"""The typed API clients the e2e tests' environments hand out, over their `api` (a kubernetes ApiClient)."""

from __future__ import annotations

from typing import Any

from kubernetes import client


class KubeClients:
    """Mixed into an e2e test's Env dataclass, which declares the field `api`."""

    api: Any

    @property
    def core(self) -> Any:
        return client.CoreV1Api(self.api)

    @property
    def objects(self) -> Any:
        return client.CustomObjectsApi(self.api)
