"""Helpers of the Spark tests: produce through the real client, assign, read node status."""

from __future__ import annotations

from streamwal.client.sync import SyncNodeClient


def produce(
    address: str,
    pchannel: str,
    count: int,
    *,
    term: int = 1,
    prefix: str = "m",
    batch: int = 500,
    vchannel: str | None = None,
    properties: dict[str, str] | None = None,
    msg_type: int | None = None,
) -> dict[int, bytes]:
    """Append `count` messages; returns {offset: payload} as acknowledged by the node."""
    out: dict[int, bytes] = {}
    with SyncNodeClient(address) as client, client.producer(pchannel, term) as producer:
        for lo in range(0, count, batch):
            payloads = [
                f"{prefix}-{pchannel}-{i}".encode() for i in range(lo, min(count, lo + batch))
            ]
            results = producer.send_many(
                payloads, vchannel=vchannel, properties=properties, msg_type=msg_type
            )
            out.update((r.offset, p) for r, p in zip(results, payloads, strict=True))
    return out


def assign(address: str, term: int, *pchannels: str, **retention) -> None:
    with SyncNodeClient(address) as client:
        for p in pchannels:
            client.assign(p, term, **retention)


def status(address: str) -> dict[str, tuple[int, int]]:
    """{pchannel: (first retained offset, next offset)} of a node."""
    with SyncNodeClient(address) as client:
        reply = client.collect_status()
    return {c.pchannel.name: (c.first_offset, c.next_offset) for c in reply.channels}
