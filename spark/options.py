"""The data source's options, parsed and checked once, without I/O.

Names and meanings follow Spark's Kafka source, so its users feel at home: a pchannel
plays the role of a Kafka topic-partition and an offset is the pchannel's MessageID.
Spark hands options over as strings; everything here turns them into typed values and
rejects bad input with an InvalidArgument that names the option.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from streamwal.errors import InvalidArgument

EARLIEST = -2
LATEST = -1

# Kafka's defaults where Kafka has the option; ours are sized for a Python reader.
DEFAULT_MAX_OFFSETS_PER_PARTITION = 200_000
DEFAULT_DISCOVERY_TIMEOUT_S = 60.0
DEFAULT_READ_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class OffsetSpec:
    """`earliest`, `latest`, or explicit offsets per pchannel (-2 earliest, -1 latest).

    `default` applies to pchannels the JSON does not name.
    """

    default: int
    per_pchannel: tuple[tuple[str, int], ...] = ()

    def offset_for(self, pchannel: str) -> int:
        return dict(self.per_pchannel).get(pchannel, self.default)


@dataclass(frozen=True)
class DiscoveryConfig:
    """Where to find the node that owns each pchannel (exactly one way is set)."""

    coord: str | None = None
    kube_namespace: str | None = None
    kubeconfig: str | None = None
    nodes: tuple[str, ...] = ()
    timeout_s: float = DEFAULT_DISCOVERY_TIMEOUT_S


@dataclass(frozen=True)
class SourceOptions:
    pchannels: tuple[str, ...] = ()
    pattern: str | None = None
    starting: OffsetSpec = OffsetSpec(EARLIEST)
    ending: OffsetSpec = OffsetSpec(LATEST)
    max_offsets_per_trigger: int | None = None
    max_offsets_per_partition: int = DEFAULT_MAX_OFFSETS_PER_PARTITION
    min_partitions: int | None = None
    fail_on_data_loss: bool = True
    include_time_ticks: bool = False
    read_timeout_s: float = DEFAULT_READ_TIMEOUT_S
    discovery: DiscoveryConfig = field(default_factory=DiscoveryConfig)

    def selects(self, pchannel: str) -> bool:
        if self.pattern is not None:
            return re.fullmatch(self.pattern, pchannel) is not None
        return pchannel in self.pchannels


def parse_offsets(option: str, raw: str | None, default: int) -> OffsetSpec:
    """`earliest` | `latest` | JSON object {pchannel: offset}; offsets -2, -1 or >= 0."""
    if raw is None or not raw.strip():
        return OffsetSpec(default)
    text = raw.strip()
    if text.lower() == "earliest":
        return OffsetSpec(EARLIEST)
    if text.lower() == "latest":
        return OffsetSpec(LATEST)
    try:
        value = json.loads(text)
    except ValueError:
        raise InvalidArgument(
            f"option {option}: expected earliest, latest or a JSON object "
            f'{{"pchannel": offset}}, got {raw!r}'
        ) from None
    if not isinstance(value, dict):
        raise InvalidArgument(f"option {option}: the JSON must be an object, got {raw!r}")
    pairs = []
    for name, offset in sorted(value.items()):
        if isinstance(offset, bool) or not isinstance(offset, int) or offset < EARLIEST:
            raise InvalidArgument(
                f"option {option}: offset of {name!r} must be an integer >= 0, "
                f"or -2 (earliest) / -1 (latest), got {offset!r}"
            )
        pairs.append((name, offset))
    return OffsetSpec(default, tuple(pairs))


def _bool(option: str, raw: str | None, default: bool) -> bool:
    if raw is None:
        return default
    text = raw.strip().lower()
    if text in ("true", "1", "yes"):
        return True
    if text in ("false", "0", "no"):
        return False
    raise InvalidArgument(f"option {option}: expected true or false, got {raw!r}")


def _positive_int(option: str, raw: str | None) -> int | None:
    if raw is None:
        return None
    try:
        value = int(raw)
    except ValueError:
        raise InvalidArgument(
            f"option {option}: expected a positive integer, got {raw!r}"
        ) from None
    if value <= 0:
        raise InvalidArgument(f"option {option}: expected a positive integer, got {raw!r}")
    return value


def _seconds(option: str, raw: str | None, default: float) -> float:
    ms = _positive_int(option, raw)
    return default if ms is None else ms / 1000.0


def _discovery(opts: Mapping[str, str]) -> DiscoveryConfig:
    coord = opts.get("coord") or None
    namespace = opts.get("kubernetes") or None
    nodes = tuple(n.strip() for n in (opts.get("nodes") or "").split(",") if n.strip())
    chosen = [name for name, v in (("coord", coord), ("kubernetes", namespace), ("nodes", nodes))
              if v]  # fmt: skip
    if len(chosen) != 1:
        raise InvalidArgument(
            "exactly one of the options coord (HOST:PORT of AssignmentDiscover), kubernetes "
            f"(namespace of the PChannel resources) or nodes (HOST:PORT,...) is needed, got "
            f"{chosen or 'none'}"
        )
    return DiscoveryConfig(
        coord=coord,
        kube_namespace=namespace,
        kubeconfig=opts.get("kubeconfig") or None,
        nodes=nodes,
        timeout_s=_seconds("discoveryTimeoutMs", opts.get("discoveryTimeoutMs"),
                           DEFAULT_DISCOVERY_TIMEOUT_S),
    )  # fmt: skip


def parse_source(opts: Mapping[str, str], *, streaming: bool) -> SourceOptions:
    """Check and type the reader options (`opts` may be Spark's case-insensitive dict)."""
    pchannels = tuple(p.strip() for p in (opts.get("pchannels") or "").split(",") if p.strip())
    pattern = opts.get("pchannelPattern") or None
    if bool(pchannels) == bool(pattern):
        raise InvalidArgument("exactly one of the options pchannels or pchannelPattern is needed")
    if pattern is not None:
        try:
            re.compile(pattern)
        except re.error as exc:
            raise InvalidArgument(f"option pchannelPattern: bad regex {pattern!r}: {exc}") from None
    starting = parse_offsets(
        "startingOffsets", opts.get("startingOffsets"), LATEST if streaming else EARLIEST
    )
    if streaming and opts.get("endingOffsets") is not None:
        raise InvalidArgument("option endingOffsets is for batch queries only")
    ending = parse_offsets("endingOffsets", opts.get("endingOffsets"), LATEST)
    if not streaming:
        # As Kafka: a batch query cannot start at latest nor end at earliest.
        if starting.default == LATEST or LATEST in dict(starting.per_pchannel).values():
            raise InvalidArgument("option startingOffsets: latest is not allowed in a batch query")
        if ending.default == EARLIEST or EARLIEST in dict(ending.per_pchannel).values():
            raise InvalidArgument("option endingOffsets: earliest is not allowed")
    per_partition = _positive_int("maxOffsetsPerPartition", opts.get("maxOffsetsPerPartition"))
    return SourceOptions(
        pchannels=pchannels,
        pattern=pattern,
        starting=starting,
        ending=ending,
        max_offsets_per_trigger=_positive_int(
            "maxOffsetsPerTrigger", opts.get("maxOffsetsPerTrigger")
        ),
        max_offsets_per_partition=per_partition or DEFAULT_MAX_OFFSETS_PER_PARTITION,
        min_partitions=_positive_int("minPartitions", opts.get("minPartitions")),
        fail_on_data_loss=_bool("failOnDataLoss", opts.get("failOnDataLoss"), True),
        include_time_ticks=_bool("includeTimeTicks", opts.get("includeTimeTicks"), False),
        read_timeout_s=_seconds("readTimeoutMs", opts.get("readTimeoutMs"),
                                DEFAULT_READ_TIMEOUT_S),
        discovery=_discovery(opts),
    )  # fmt: skip
