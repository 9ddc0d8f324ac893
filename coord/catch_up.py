"""How a moved pchannel keeps its log: pure decisions about Assign's catch-up fields.

A pchannel's records live on the node that served it. When it moves, the new owner copies
what it lacks from the previous owner (`catch_up_from`) before serving the new term, so
the log stays whole. That is only possible while the previous owner can answer; once it
is gone (declared LOST, or its pod left the node set) the pchannel waits for it
(`hold`: safe failover, the default, as Kafka's `unclean.leader.election.enable=false`),
unless it allows data loss: then, once the node has been gone for the grace period, the
coord moves it without catch-up -- an *unclean failover*: records the lost node holds stay
there, and the new term starts at `min_next_offset` (the highest end of log the coord
saw) so offsets the coord knows of are never handed out twice.
"""

from __future__ import annotations

from dataclasses import dataclass

from streamwal.coord import state_machine as sm
from streamwal.proto import streaming_pb2 as pb


@dataclass(frozen=True)
class CatchUpPlan:
    """The catch-up fields of one Assign, and whether the move is an unclean failover."""

    catch_up_from: str  # "" when the target needs nothing copied (or nothing can be)
    min_next_offset: int
    unclean: bool = False


def data_holder(before: pb.PChannelMeta, remembered: sm.NodeRef | None) -> sm.NodeRef | None:
    """The node that last served `before`'s pchannel to clients (holds its records).

    A move that starts from ASSIGNED (or from UNAVAILABLE, which keeps the lost owner)
    leaves that owner as the holder; a retarget of a half-done move (ASSIGNING) keeps the
    holder remembered when the move began. A coord restarted mid-move has no memory and
    falls back to the oldest history entry (histories are cleared at every ASSIGNED, so
    that is the owner the chain of retargets started from).
    """
    if before.state == sm.ASSIGNED:
        return sm.owner(before)  # a fresh move: whatever was remembered is over
    if remembered is not None:
        return remembered
    if before.state == sm.UNAVAILABLE:
        return sm.owner(before)
    if before.state == sm.ASSIGNING and before.histories:
        return sm.NodeRef.from_proto(before.histories[0].node)
    return None


WAITING_FOR_REPLICA = "WaitingForReplica"


def hold(
    holder: sm.NodeRef | None,
    gone: bool,
    gone_for: float | None,
    allow_data_loss: bool,
    grace: float,
) -> str:
    """Why a single-replica pchannel must not move now ("": it may).

    `gone`: the holder of its records is out of the node set or declared LOST;
    `gone_for`: seconds since it left the node set (None: unknown, or already past the
    grace as a LOST node is). Without `allow_data_loss` a gone holder is waited for as
    long as it takes: it comes back with its log (a restarted pod on its volume), and
    moving without it would strand what it acknowledged. With it, the move waits out the
    grace period (a pod restart is not a loss), then goes uncleanly.
    """
    if holder is None or not gone:
        return ""
    if not allow_data_loss:
        return (
            f"node {holder.server_id} holds the only copy of its log and is gone: waiting "
            "for it to return (spec.failover.allowDataLoss moves it without its records)"
        )
    if gone_for is not None and gone_for < grace:
        return (
            f"node {holder.server_id} holds the only copy of its log and is gone: an "
            f"unclean failover in {grace - gone_for:.0f}s unless it returns"
        )
    return ""


def plan(
    holder: sm.NodeRef | None, target: sm.NodeRef, holder_lost: bool, last_seen_next: int
) -> CatchUpPlan:
    """The Assign fields for moving to `target`.

    - no holder (new pchannel) or the target is the holder: nothing to copy;
    - holder lost: no copy possible, unclean; offsets continue after what was seen;
    - otherwise copy from the holder (Assign fails, and is retried, while it is down).
    """
    if holder is None or holder.server_id == target.server_id:
        return CatchUpPlan("", last_seen_next)
    if holder_lost:
        return CatchUpPlan("", last_seen_next, unclean=True)
    return CatchUpPlan(holder.address, last_seen_next)
