"""Prometheus metrics of a real node after real traffic, read from its /metrics endpoint."""

from __future__ import annotations

import asyncio
import time

from streamwal.client.node_client import NodeClient
from streamwal.client.policy import DeliverPolicy
from streamwal.testing.local_node import free_port
from tests.node.helpers import read_data, sample, scrape


async def _eventually(check, timeout: float = 10.0):
    deadline = time.monotonic() + timeout
    while True:
        try:
            return await asyncio.to_thread(check)
        except AssertionError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.1)


def _python_info() -> dict[str, str]:
    import platform

    major, minor, patch = platform.python_version_tuple()
    return {
        "implementation": platform.python_implementation(),
        "major": major,
        "minor": minor,
        "patchlevel": patch,
        "version": platform.python_version(),
    }


async def test_an_idle_pchannel_appends_ticks_not_messages(start_node, pchannel) -> None:
    """An idle pchannel's time ticks used to count as appended messages (~4/s). Ticks
    are written for a reader that takes them."""
    port = free_port()
    node = start_node("n1", "--metrics", f"127.0.0.1:{port}", "--time-tick-interval", "0.05")
    async with NodeClient(node.address) as c:
        await c.assign(pchannel, 1)
        reader = await c.consumer(pchannel, 1, DeliverPolicy.latest(), time_ticks=True)

        def ticking() -> None:
            m = scrape(port)
            assert sample(m, "streamwal_appended_time_ticks_total", pchannel=pchannel) >= 5
            assert sample(m, "streamwal_appended_messages_total", pchannel=pchannel) == 0

        await _eventually(ticking)
        await reader.close()


async def test_metrics_after_traffic(start_node, pchannel) -> None:
    port = free_port()
    node = start_node("n1", "--metrics", f"127.0.0.1:{port}")
    p = pchannel
    count, size = 3000, 8192
    async with NodeClient(node.address) as c:
        await c.assign(p, 2)
        producer = await c.producer(p, 2)
        stalled = await c.consumer(p, 2, DeliverPolicy.all())
        follower = await c.consumer(p, 2, DeliverPolicy.all())
        first = await producer.send(b"first")
        assert (await read_data(stalled, 1))[0].offset == first.offset  # then it stops reading
        for _ in range(count // 100):
            await producer.send_many([b"m" * size] * 100)
        await read_data(follower, count + 1, timeout=30)

        def busy() -> None:
            m = scrape(port)
            # Exactly what the producer sent: the node's idle time ticks count apart.
            assert sample(m, "streamwal_appended_messages_total", pchannel=p) == count + 1
            # the consumers got all of it (time ticks not counted): the consume rate
            assert sample(m, "streamwal_delivered_messages_total", pchannel=p) >= count + 2
            assert sample(m, "process_resident_memory_bytes") > 0
            assert sample(m, "python_info", **_python_info()) == 1
            assert sample(m, "streamwal_appended_bytes_total", pchannel=p) >= count * size
            assert sample(m, "streamwal_active_producers", pchannel=p) == 1
            assert sample(m, "streamwal_active_consumers", pchannel=p) == 2
            assert sample(m, "streamwal_pchannel_term", pchannel=p) == 2
            assert sample(m, "streamwal_log_size_bytes", pchannel=p) >= count * size
            assert sample(m, "streamwal_log_end_offset", pchannel=p) >= count + 1
            # The stalled consumer is far behind the log end.
            assert sample(m, "streamwal_consumer_lag_messages", pchannel=p) >= count // 2
            records = sample(m, "streamwal_append_latency_seconds_count")
            assert records >= count / 100
            mean = sample(m, "streamwal_append_latency_seconds_sum") / records
            assert 0 < mean < 1.0
            assert sample(m, "streamwal_append_latency_seconds_bucket", le="+Inf") == records
            writes = sample(m, "streamwal_fsync_latency_seconds_count")
            assert 1 <= writes <= records  # group commit: never more writes than records
            assert 0 < sample(m, "streamwal_fsync_latency_seconds_sum") / writes < 1.0

        await _eventually(busy)
        await read_data(stalled, count, timeout=60)  # it catches up: lag falls
        await producer.send(b"last")
        await read_data(follower, 1)
        await read_data(stalled, 1)

        def caught_up() -> None:
            m = scrape(port)
            assert sample(m, "streamwal_consumer_lag_messages", pchannel=p) <= 2

        await _eventually(caught_up)
        await producer.close()
        await stalled.close()
        await follower.close()

        def idle() -> None:
            m = scrape(port)
            assert sample(m, "streamwal_active_producers", pchannel=p) == 0
            assert sample(m, "streamwal_active_consumers", pchannel=p) == 0

        await _eventually(idle)


async def test_idle_producer_state_leaves_memory_and_is_read_again(start_node, pchannel) -> None:
    """A node that sees a new producer id per Spark task would hold every one forever;
    idle states leave memory (the gauge shows it) and still answer a late resend."""
    port = free_port()
    node = start_node(
        "n1",
        "--metrics",
        f"127.0.0.1:{port}",
        "--producer-idle",
        "300ms",
        "--retention-check-interval",
        "100ms",
    )
    states = lambda: sample(scrape(port), "streamwal_producer_states", pchannel=pchannel)  # noqa: E731
    async with NodeClient(node.address) as client:
        await client.assign(pchannel, 1)
        first = await client.producer(pchannel, 1, producer_id="task-7")
        sent = await first.send_batch([first.encode(b"once")], sequence=1)
        await first.close()
        assert await asyncio.to_thread(states) == 1

        def evicted() -> None:
            assert states() == 0

        await _eventually(evicted, timeout=5)
        again = await client.producer(pchannel, 1, producer_id="task-7")
        assert again.last_sequence == 1  # read back from disk
        assert await again.send_batch([again.encode(b"once")], sequence=1) == sent
        await again.close()
        assert await asyncio.to_thread(states) == 1
        consumer = await client.consumer(pchannel, 1, DeliverPolicy.all(), time_ticks=False)
        assert [m.payload for m in await read_data(consumer, 1)] == [b"once"]
        await consumer.close()
