"""The template controller's loop: on any change of a NodeConfigTemplate, a Node or a NodeConfig, plan every
template at once (node_config_plan.py, one node may concern several templates) and write what differs.

One task runs the passes, one at a time. A wake-up waits a moment (`settle`) so that a burst of watch events
(the operator's start, a relabelled node pool) makes one pass. The inputs are kopf's indexes, read at the
start of a pass; they lag behind our own writes until their watch events arrive, so a pass may plan a write
already done: a create answered 409 (exists) or a deletion answered 404 (gone) is therefore no problem, only a
reason to look again when the event comes. A write the API server refuses for the object's content (422 with
field errors, e.g. a rendered endpoint that is no URL) is the node's problem (`Invalid`) until something
changes; any other failure (403, 5xx, no connection) is `WriteFailed` and retried with backoff.

With peering, kopf stops calling the handlers that wake this loop in a replica that is not active; only a
retry already scheduled may still run there, and the writes are idempotent and conditional.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, Protocol

from rmd_api.kube_time import now_time as _now
from rmd_api.names import NODE_CONFIG_TEMPLATE
from rmd_api.node_config import INVALID, WRITE_FAILED
from rmd_operator.node_config_api import WriteError
from rmd_operator.node_config_plan import Node, NodeConfig, Problem, Template, TemplatePlan, plan
from rmd_operator.node_config_status import (
    ProblemKey,
    desired_status,
    problem_events,
    problem_keys,
    stored_problem_keys,
    write_events,
)
from rmd_operator.status import EventText, merge_diff

log = logging.getLogger(__name__)


class NodeConfigWriter(Protocol):
    async def create_node_config(self, namespace: str, body: Mapping[str, Any]) -> None: ...
    async def replace_spec(self, namespace: str, name: str, uid: str, spec: Mapping[str, Any]) -> None: ...
    async def delete_node_config(self, namespace: str, name: str, uid: str) -> None: ...
    async def patch_template_status(self, namespace: str, name: str, status: Mapping[str, Any]) -> None: ...


@dataclass(frozen=True)
class Inputs:
    templates: Sequence[Template]
    nodes: Sequence[Node]
    configs: Sequence[NodeConfig]


@dataclass
class _Outcome:
    """What the API server did with one template's writes."""

    failures: list[Problem]
    written: int = 0
    retry: bool = False  # something to look at again soon (a transient failure, or a stale view)


class TemplateSync:
    def __init__(
        self,
        writer: NodeConfigWriter,
        post_event: Callable[[Mapping[str, Any], EventText], None],
        *,
        retry_initial: float,
        retry_max: float,
        settle: float = 0.2,
        now: Callable[[], str] = _now,
    ) -> None:
        self._writer = writer
        self._post = post_event
        self._retry_initial = retry_initial
        self._retry_max = retry_max
        self._settle = settle
        self._now = now
        self._wake = asyncio.Event()
        self._inputs: Callable[[], Inputs] | None = None
        self._told: dict[str, frozenset[ProblemKey]] = {}  # template uid -> problems already in Events
        # (template uid, NodeConfig name) -> the spec the API server refused (422), and the problem it made
        self._refused: dict[tuple[str, str], tuple[Mapping[str, Any], Problem]] = {}
        self._backoff = 0.0
        self.passes = 0

    def changed(self, inputs: Callable[[], Inputs]) -> None:
        """Something a template may depend on changed; `inputs` reads the current state (kopf's indexes)."""
        self._inputs = inputs
        self._wake.set()

    def health(self) -> dict[str, int]:
        return {"node_config_templates": len(self._told)}

    async def run(self) -> None:
        """Passes until cancelled: after each wake-up, and again after a backoff while something failed."""
        while True:
            timeout = self._backoff or None
            with contextlib.suppress(TimeoutError):  # a retry is due
                await asyncio.wait_for(self._wake.wait(), timeout)
            self._wake.clear()
            await asyncio.sleep(self._settle)
            if self._inputs is None:
                continue
            try:
                retry = await self.sync_once(self._inputs())
            except Exception:  # a bug must not end the loop: log it and look again later
                log.exception("NodeConfigTemplate pass failed")
                retry = True
            self._backoff = min(self._backoff * 2 or self._retry_initial, self._retry_max) if retry else 0.0

    async def sync_once(self, inputs: Inputs) -> bool:
        """One pass over every template; True if something should be looked at again soon."""
        self.passes += 1
        plans = plan(inputs.templates, inputs.nodes, inputs.configs)
        live = {p.template.uid for p in plans}
        self._told = {uid: told for uid, told in self._told.items() if uid in live}
        self._refused = {key: refused for key, refused in self._refused.items() if key[0] in live}
        outcomes = await asyncio.gather(*(self._apply(p) for p in plans))
        return any(outcomes)

    async def _apply(self, plan_: TemplatePlan) -> bool:
        template = plan_.template
        namespace = template.namespace
        outcome = _Outcome(failures=[])
        planned = {(template.uid, c.body["metadata"]["name"]) for c in plan_.creates}
        planned |= {(template.uid, u.name) for u in plan_.updates}
        self._refused = {k: v for k, v in self._refused.items() if k[0] != template.uid or k in planned}
        created: list[tuple[str, str]] = []
        for create in plan_.creates:
            name = str(create.body["metadata"]["name"])
            write = partial(self._writer.create_node_config, namespace, create.body)
            if await self._write(outcome, template.uid, create.node, name, create.body["spec"], write):
                created.append((name, create.node))
        updated: list[tuple[str, str]] = []
        for update in plan_.updates:
            write = partial(self._writer.replace_spec, namespace, update.name, update.uid, update.spec)
            if await self._write(outcome, template.uid, update.node, update.name, update.spec, write):
                updated.append((update.name, update.node))
        deleted = []
        for delete in plan_.deletes:
            write = partial(self._writer.delete_node_config, namespace, delete.name, delete.uid)
            if await self._write(outcome, template.uid, "", delete.name, None, write):
                deleted.append(delete)
        outcome.written = len(created) + len(updated)
        body = {
            "apiVersion": NODE_CONFIG_TEMPLATE.api_version,
            "kind": NODE_CONFIG_TEMPLATE.kind,
            "metadata": {"namespace": template.namespace, "name": template.name, "uid": template.uid},
        }
        for event in write_events(created, updated, deleted):
            self._post(body, event)
        told = self._told.get(template.uid, stored_problem_keys(template.status))
        now_told = problem_keys(plan_, outcome.failures)
        for event in problem_events(told, now_told):
            self._post(body, event)
        self._told[template.uid] = now_told
        status = desired_status(plan_, outcome.failures, outcome.written, self._now())
        if merge_diff(dict(template.status), status) is not None:
            try:
                await self._writer.patch_template_status(template.namespace, template.name, status)
            except WriteError as exc:
                if exc.status != 404:  # 404: the template is gone, nothing to report on
                    log.warning("status of NodeConfigTemplate %s failed: %s", template.ref, exc.message)
                    outcome.retry = True
        return outcome.retry

    async def _write(  # noqa: PLR0917  # one write and what it is about
        self,
        outcome: _Outcome,
        template_uid: str,
        node: str,
        name: str,
        spec: Mapping[str, Any] | None,
        write: Callable[[], Coroutine[Any, Any, None]],
    ) -> bool:
        """Do one write; True if it was done. Refusals become the node's problems (deletions have none: the
        node is gone or no longer the template's, and a deletion that fails is only retried). A spec the API
        server refused is not sent again until it changes: every Node update starts a pass."""
        refused = self._refused.get((template_uid, name))
        if refused is not None and spec is not None and refused[0] == spec:
            outcome.failures.append(refused[1])
            return False
        try:
            await write()
        except WriteError as exc:
            stale = exc.status in (404, 409) or (exc.status == 422 and not exc.invalid_fields)
            if not stale:
                log.warning("NodeConfig %s: %s", name, exc.message, extra={"node": node})
            if exc.status == 422 and exc.invalid_fields and node:
                problem = Problem(node, INVALID, f"the API server refused NodeConfig {name}: {exc.message}")
                outcome.failures.append(problem)
                if spec is not None:
                    self._refused[(template_uid, name)] = (spec, problem)
            else:
                outcome.retry = True
                if not stale and node:
                    outcome.failures.append(Problem(node, WRITE_FAILED, f"NodeConfig {name}: {exc.message}"))
            return False
        self._refused.pop((template_uid, name), None)
        return True
