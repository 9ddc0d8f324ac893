"""Runs a round's plan: every job's saga, step by step, against the nodes and the records.

The one place the coord's decisions meet I/O. Waves run in order, the jobs of a wave
together. A job on a pchannel holds its lock and first checks that the record is still
the version it was planned from (else it is skipped: the next round plans again). Each
step of its saga is run here (persist through `ChannelRecords`, node calls through the
links, bounded by the round's timeouts) and its outcome is sent back to the saga.

After every step the step hooks run with (step name, pchannel): the seam where tests and
the simulator inject a crash at a step boundary (`streamwal.testing.crash`). Production
installs none.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from streamwal.coord import catch_up, sagas
from streamwal.coord import leader_choice as lc
from streamwal.coord import planner as pl
from streamwal.coord import state_machine as sm
from streamwal.coord.channel_records import ChannelRecords
from streamwal.coord.memory import Memory
from streamwal.coord.meta_store import VersionConflict
from streamwal.coord.metrics import CoordMetrics
from streamwal.errors import StreamingError
from streamwal.proto import streaming_pb2 as pb

log = logging.getLogger("streamwal.coord")

StepHook = Callable[[str, str], None]  # (step name, pchannel), after the step ran
Listener = Callable[[str, str, dict], None]  # (outcome kind, pchannel, fields)

# Hooks every executor runs unless given its own: a process started by the testing
# package's crash wrapper installs one here before the coord starts. Empty in production.
installed_hooks: list[StepHook] = []

# Announcements that also count in a metric (CoordMetrics attribute).
_COUNTED = {"unclean-failover": "unclean_failovers"}
# Announcements that leave a pchannel without a leader: its cause in the waiting metric.
_WAITING = {"no leader chosen": "no-leader", "assign failed": "assign-failed"}


class Links(Protocol):
    """What the executor and the coordinator call on nodes (coord/node_link.NodeLinks)."""

    async def assign(
        self,
        address: str,
        name: str,
        term: int,
        timeout: float,
        catch_up_from: str = "",
        min_next_offset: int = 0,
        replica_set: pb.ReplicaSet | None = None,
        accept_data_loss: bool = False,
        retention: pb.RetentionPolicy | None = None,
    ) -> None: ...

    async def fence(
        self, address: str, name: str, term: int, timeout: float
    ) -> pb.FenceResponse: ...

    async def remove(self, address: str, name: str, term: int, timeout: float) -> None: ...

    async def collect_status(
        self, address: str, timeout: float
    ) -> pb.StreamingNodeManagerCollectStatusResponse: ...

    def reconnect(self, address: str) -> None:
        """The node answers again after it did not: reach it on a new connection."""

    async def close(self) -> None: ...


class Executor:
    def __init__(
        self,
        records: ChannelRecords,
        links: Links,
        memory: Memory,
        metrics: CoordMetrics,
        clock: Callable[[], float],
        on_done: Callable[[str, sagas.Assigned], None],
        notify: Listener,
        hooks: Sequence[StepHook] | None = None,
    ) -> None:
        self.records = records
        self.links = links
        self.memory = memory
        self.metrics = metrics
        self.clock = clock
        self.on_done = on_done
        self.notify = notify
        self.hooks = installed_hooks if hooks is None else hooks

    async def run(self, plan: pl.Plan, ctx: sagas.Round) -> None:
        for wave in plan.waves:
            if wave is plan.fence and wave:
                log.info("fencing stale pchannels", extra={"count": len(wave)})
            if wave:
                await asyncio.gather(*(self.run_job(job, ctx) for job in wave))

    async def run_job(self, job: pl.Job, ctx: sagas.Round) -> sagas.Result:
        if isinstance(job, pl.RemoveStale):
            return await self.drive(job.name, sagas.remove_stale(job.node, job.name, job.term, ctx))
        async with self.records.lock(job.name):
            stored = self.records.get(job.name)
            if stored is None or stored.version != job.version or stored.record.destroyed:
                log.debug("job skipped: record changed", extra={"pchannel": job.name})
                return None
            try:
                result = await self.drive(job.name, self._saga(job, stored.record, ctx))
            except VersionConflict as err:
                log.info(
                    "meta changed by another writer",
                    extra={"pchannel": job.name, "error": str(err)},
                )
                return None
            self._remember(job, result)
        if isinstance(result, sagas.Assigned):
            if self.memory.waiting.pop(job.name, None) is not None:
                self.metrics.set_waiting(job.name, None)
            self.metrics.reassignments.labels(result.reason).inc()
            self.on_done(job.name, result)
        return result

    def _saga(self, job: pl.Job, record, ctx: sagas.Round) -> sagas.Saga:
        name = job.name
        if isinstance(job, pl.Reassign):
            holder = catch_up.data_holder(record.meta, self.memory.holders.get(name))
            if holder is not None:
                self.memory.holders[name] = holder
            seen = self.memory.seen_next.get(name, 0)
            return sagas.reassignment(
                record, job.target, job.reason, holder, seen, ctx, job.accept_data_loss
            )
        if isinstance(job, pl.ChangeTerm):
            return sagas.term_change(record, job.members, job.reason, ctx)
        if isinstance(job, pl.Rejoin):
            return sagas.rejoin(record, job.nodes, ctx)
        if isinstance(job, pl.CompleteJoint):
            return sagas.complete_joint(record)
        if isinstance(job, pl.ApplyRetention):
            return sagas.apply_retention(record, ctx)
        if isinstance(job, pl.Unschedulable):
            if job.reason:
                self.memory.unschedulable[name] = job.reason
            else:
                self.memory.unschedulable.pop(name, None)
            return sagas.unschedulable(record, job.reason)
        if isinstance(job, pl.MarkUnavailable):
            return sagas.mark_unavailable(record, job.node, job.reason, job.code)
        raise AssertionError(f"unknown job {job!r}")

    def _remember(self, job: pl.Job, result: sagas.Result) -> None:
        name = job.name
        if isinstance(job, pl.Reassign):
            if isinstance(result, sagas.Assigned):
                self.memory.failed_target.pop(name, None)
                self.memory.holders.pop(name, None)
            elif isinstance(result, sagas.Failed) and result.node is not None:
                self.memory.failed_target[name] = result.node
            if isinstance(result, sagas.Failed) and result.data_loss:
                self.memory.data_loss[name] = result.data_loss
        if isinstance(result, sagas.Assigned) and result.handover_kept:
            self.memory.handover_after[name] = self.clock() + HANDOVER_BACKOFF

    # ----------------------------------------------------------------- steps

    async def drive(self, name: str, saga: sagas.Saga) -> sagas.Result:
        """Run `saga` to its end: each step, then the hooks, then the next step."""
        outcome: Any = None
        while True:
            try:
                step = saga.send(outcome)
            except StopIteration as done:
                return done.value
            outcome = await self._step(name, step)
            if not isinstance(step, sagas.Announce):
                for hook in self.hooks:
                    hook(step.step.value, name)

    async def _step(self, name: str, step: sagas.Step) -> Any:
        if isinstance(step, sagas.Persist):
            await self.records.persist(name, step.record)
            if step.step == sm.Step.PERSIST_ASSIGNED:
                self.memory.assigned_at[name] = self.memory.touched_at = self.clock()
            return None
        if isinstance(step, sagas.Remove):
            return await self._remove(step)
        if isinstance(step, sagas.Assign):
            return await self._assign(step)
        if isinstance(step, sagas.Fence):
            got = await asyncio.gather(*(self._fence(step, node) for node in step.nodes))
            return [r for r in got if r is not None]
        if isinstance(step, sagas.AssignFollowers):
            return list(await asyncio.gather(*(self._follower(a) for a in step.assigns)))
        self._announce(name, step)
        return None

    async def _remove(self, step: sagas.Remove) -> StreamingError | None:
        try:
            await self.links.remove(step.node.address, step.name, step.term, step.timeout)
        except StreamingError as err:
            log.info(
                "remove skipped",
                extra={
                    "pchannel": step.name,
                    "node": step.node.server_id,
                    "term": step.term,
                    "error": str(err),
                },
            )
            return err
        return None

    async def _assign(self, step: sagas.Assign) -> StreamingError | None:
        try:
            await self.links.assign(
                step.node.address,
                step.name,
                step.term,
                step.timeout,
                catch_up_from=step.catch_up_from,
                min_next_offset=step.min_next_offset,
                replica_set=step.replica_set,
                accept_data_loss=step.accept_data_loss,
                retention=step.retention,
            )
        except StreamingError as err:
            return err
        return None

    async def _fence(self, step: sagas.Fence, node) -> lc.FenceReport | None:
        try:
            reply = await self.links.fence(node.address, step.name, step.term, step.timeout)
        except StreamingError as err:
            _failed("fence failed", step.name, node.server_id, step.term, err)
            return None
        ineligible = reply.data_loss or self.memory.ineligible(node.server_id, step.name)
        if ineligible:
            log.warning(
                "replica may not lead",
                extra={"pchannel": step.name, "node": node.server_id, "reason": ineligible},
            )
        return lc.FenceReport(
            node.server_id,
            reply.last_term,
            reply.next_offset,
            reply.commit_offset,
            ineligible,
        )

    async def _follower(self, step: sagas.Assign) -> bool:
        """Best effort: a follower that fails here rejoins on a later round."""
        now = self.memory.touched_at = self.clock()
        self.memory.rejoined_at[(step.name, step.node.server_id)] = now
        error = await self._assign(step)
        if error is not None:
            _failed("follower assign failed", step.name, step.node.server_id, step.term, error)
        return error is None

    def _announce(self, name: str, step: sagas.Announce) -> None:
        log.log(step.level, step.message, extra=dict(step.fields))
        counter = _COUNTED.get(step.notify)
        if counter is not None:
            getattr(self.metrics, counter).inc()
        if step.notify in ("assign-failed", "unavailable"):
            fields = step.fields
            why = str(fields.get("reason") or fields.get("error") or step.message)
            self.memory.waiting[name] = why
            cause = _WAITING.get(step.message, "unavailable")
            self.metrics.set_waiting(name, cause)
        if step.notify:
            fields = step.fields if step.notify_fields is None else step.notify_fields
            self.notify(step.notify, name, dict(fields))


HANDOVER_BACKOFF = 5.0  # seconds before a drained leader that kept leading tries again


def _failed(what: str, name: str, node: int, term: int, err: StreamingError) -> None:
    log.info(what, extra={"pchannel": name, "node": node, "term": term, "error": str(err)})
