"""The driver of `election`: reads and writes one `coordination.k8s.io/v1` Lease.

Writes are replaces guarded by the read's resourceVersion (a create when the Lease does not
exist), so two candidates never both win one round: the loser gets 409 and reads again.
The sync `kubernetes` client runs in a worker thread of the elector's own, each call
bounded in time; while leading, a call never outlasts the renew deadline. A thread of its
own: with the process's shared pool, a burst of status writes (a failover of thousands of
PChannels) would queue the renewal behind them until the renew deadline passed.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from streamwal.operator.election import (
    Election,
    ElectionConfig,
    LeaseRecord,
    Lost,
    Wait,
    Write,
)

log = logging.getLogger("streamwal.operator.lease")


def micro_time(now: datetime | None = None) -> str:
    """Kubernetes MicroTime, e.g. 2030-01-01T00:00:00.000000Z."""
    return (now or datetime.now(UTC)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def lease_record(obj: dict[str, Any]) -> LeaseRecord:
    spec = obj.get("spec") or {}
    return LeaseRecord(
        holder=spec.get("holderIdentity") or "",
        duration=float(spec.get("leaseDurationSeconds") or 0),
        transitions=int(spec.get("leaseTransitions") or 0),
        renewed=spec.get("renewTime") or "",
        version=obj["metadata"]["resourceVersion"],
    )


class LeaseElector:
    """Campaigns for the Lease `name`; `on_lead` runs once when this process wins.

    `run()` returns (with the reason) only when leadership is lost: the caller stops
    acting at once. `release()` gives the Lease up on a clean shutdown, so that a
    standby takes over at its next poll instead of after the lease duration.
    """

    def __init__(
        self,
        api: client.ApiClient,
        namespace: str,
        name: str,
        identity: str,
        config: ElectionConfig,
        on_lead: Callable[[], Awaitable[None]],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.api = client.CoordinationV1Api(api)
        self.namespace = namespace
        self.name = name
        self.election = Election(identity, config)
        self.on_lead = on_lead
        self.clock = clock
        self._acquired = ""  # acquireTime of the held Lease, kept on renewals
        self._complained = 0.0
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="lease")

    def _run(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> asyncio.Future[Any]:
        work = functools.partial(fn, *args, **kwargs)
        return asyncio.get_running_loop().run_in_executor(self._thread, work)

    async def _call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        cfg = self.election.config
        timeout = 2 * cfg.retry_period
        if self.election.renewed_at is not None:  # never wait past the renew deadline
            left = self.election.renewed_at + cfg.renew_deadline - self.clock()
            timeout = max(0.1, min(timeout, left))
        return await asyncio.wait_for(
            self._run(fn, *args, _request_timeout=timeout, **kwargs), timeout + 0.5
        )

    async def _read(self) -> bool:
        """Read the Lease into the election; False when the API did not answer."""
        started = self.clock()
        try:
            resp = await self._call(
                self.api.read_namespaced_lease, self.name, self.namespace, _preload_content=False
            )
            obj = json.loads(resp.data)
        except ApiException as err:
            if err.status != 404:
                self._complain("Lease not read", err)
                return False
            obj = None
        except Exception as err:
            self._complain("Lease not read", err)
            return False
        if obj is not None and self.election.seen is None:
            self._acquired = (obj.get("spec") or {}).get("acquireTime") or ""
        self.election.observe(None if obj is None else lease_record(obj), started)
        return True

    async def _write(self, write: Write) -> bool:
        """Create or replace the Lease as `write` says; True when it was accepted."""
        started = self.clock()
        now = micro_time()
        acquired = now if write.acquire or not self._acquired else self._acquired
        body = self._body(write.holder, write.duration, write.transitions, acquired, now)
        try:
            if write.version is None:
                resp = await self._call(
                    self.api.create_namespaced_lease, self.namespace, body, _preload_content=False
                )
            else:
                body["metadata"]["resourceVersion"] = write.version
                resp = await self._call(
                    self.api.replace_namespaced_lease, self.name, self.namespace, body,
                    _preload_content=False,
                )  # fmt: skip
        except ApiException as err:
            if err.status != 409:  # 409: another candidate wrote first; read again
                self._complain("Lease not written", err)
            return False
        except Exception as err:
            self._complain("Lease not written", err)
            return False
        version = json.loads(resp.data)["metadata"]["resourceVersion"]
        was_leading = self.election.leading
        self.election.wrote(write, version, now, started)
        self._acquired = acquired
        if not was_leading:
            log.info(
                "leading",
                extra={"lease": self.name, "identity": write.holder,
                       "transitions": write.transitions},
            )  # fmt: skip
            await self.on_lead()
        return True

    def _body(
        self, holder: str | None, duration: float, transitions: int, acquired: str, renewed: str
    ) -> dict[str, Any]:
        spec = {
            "holderIdentity": holder,
            "leaseDurationSeconds": max(1, round(duration)),
            "acquireTime": acquired,
            "renewTime": renewed,
            "leaseTransitions": transitions,
        }
        return {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": self.name, "namespace": self.namespace},
            "spec": spec,
        }

    def _complain(self, what: str, err: Exception) -> None:
        """Log API failures at most every 10 s (a partition would flood the log)."""
        if self.clock() - self._complained >= 10:
            self._complained = self.clock()
            reason = f"{err.status} {err.reason}" if isinstance(err, ApiException) else repr(err)
            log.warning(what, extra={"lease": self.name, "error": reason})

    async def run(self) -> str:
        """Campaign, then lead; returns the reason once leadership is lost."""
        cfg = self.election.config
        await self._read()
        while True:
            decision = self.election.decide(self.clock())
            if isinstance(decision, Lost):
                log.error("leadership lost", extra={"lease": self.name, "reason": decision.reason})
                return decision.reason
            if isinstance(decision, Wait):
                await asyncio.sleep(decision.seconds)
                await self._read()
            elif isinstance(decision, Write) and not await self._write(decision):
                await asyncio.sleep(min(cfg.retry_period / 4, 0.5))  # lost a race, or failed
                await self._read()

    async def release(self) -> None:
        """Give up a held Lease (no holder, 1 s duration), as client-go does on shutdown."""
        seen = self.election.seen
        if not self.election.leading or seen is None:
            return
        now = micro_time()
        body = self._body(None, 1, seen.transitions, self._acquired or now, now)
        body["metadata"]["resourceVersion"] = seen.version
        try:
            await self._run(
                self.api.replace_namespaced_lease, self.name, self.namespace, body,
                _request_timeout=2.0,
            )  # fmt: skip
            log.info("Lease released", extra={"lease": self.name})
        except Exception as err:  # the Lease then simply expires
            log.warning("Lease not released", extra={"lease": self.name, "error": str(err)})
        self.election.renewed_at = None
