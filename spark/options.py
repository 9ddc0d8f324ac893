"""The data source's options, parsed and checked once, without I/O.

Names and meanings follow Spark's Kafka source, so its users feel at home: a pchannel
plays the role of a Kafka topic-partition and an offset is the pchannel's MessageID.
Spark hands options over as strings, with lower-cased names; everything here turns them
into typed values and rejects bad input with an InvalidArgument that names the option. An
option this source does not know is refused, with the list of those it knows: a
misspelled option must not be silently ignored. docs/spark.md is the user's reference.
"""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from streamwal.errors import InvalidArgument
from streamwal.units import parse_duration_ms

EARLIEST = -2
LATEST = -1

# Kafka's defaults where Kafka has the option; ours are sized for a Python reader.
DEFAULT_MAX_OFFSETS_PER_PARTITION = 200_000
DEFAULT_DISCOVERY_TIMEOUT_S = 60.0
DEFAULT_READ_TIMEOUT_S = 30.0
DEFAULT_MAX_TRIGGER_DELAY_S = 15 * 60.0  # Kafka's 15m
BATCH_ROWS = 1000

DISCOVERY_OPTIONS = ("coord", "kubernetes", "kubeconfig", "nodes", "discoveryTimeoutMs")
SOURCE_OPTIONS = (
    *DISCOVERY_OPTIONS,
    "pchannels",
    "pchannelPattern",
    "startingOffsets",
    "startingTimestamp",
    "startingOffsetsByTimestamp",
    "startingOffsetsByTimestampStrategy",
    "endingOffsets",
    "endingTimestamp",
    "endingOffsetsByTimestamp",
    "failOnDataLoss",
    "maxOffsetsPerTrigger",
    "minOffsetsPerTrigger",
    "maxTriggerDelay",
    "minPartitions",
    "maxOffsetsPerPartition",
    "includeTimeTicks",
    "readTimeoutMs",
)
# `checkpointLocation` is Spark's own: writeStream passes it to the sink with the others.
SINK_OPTIONS = (*DISCOVERY_OPTIONS, "pchannel", "idempotencyKey", "batchRows", "checkpointLocation")
SINK_COLUMNS = ("payload", "pchannel", "vchannel", "message_type", "properties")
_STREAMING_ONLY = ("maxOffsetsPerTrigger", "minOffsetsPerTrigger", "maxTriggerDelay")
_BATCH_ONLY = ("endingOffsets", "endingTimestamp", "endingOffsetsByTimestamp")


@dataclass(frozen=True)
class OffsetSpec:
    """Where a query starts (or ends) in each pchannel.

    Values are offsets (-2 earliest, -1 latest, or a MessageID), or with `by_time`
    timestamps in ms: the first offset whose time tick is at or after that time.
    `default` applies to pchannels `per_pchannel` does not name; None means every
    pchannel must be named (a JSON of timestamps, as Kafka's). `option` names the option
    the spec came from, for error messages.
    """

    default: int | None
    per_pchannel: tuple[tuple[str, int], ...] = ()
    by_time: bool = False
    option: str = "startingOffsets"

    def value_for(self, pchannel: str) -> int:
        value = dict(self.per_pchannel).get(pchannel, self.default)
        if value is None:
            raise InvalidArgument(
                f"option {self.option} names no timestamp for pchannel {pchannel}"
            )
        return value

    def offset_values(self) -> tuple[int | None, ...]:
        """Every offset the spec names, its default included (none for times)."""
        return () if self.by_time else (self.default, *dict(self.per_pchannel).values())


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
    ending: OffsetSpec = OffsetSpec(LATEST, option="endingOffsets")
    # startingOffsetsByTimestampStrategy: True = start at the log end of a pchannel with
    # no message at or after the asked time ("latest"); False = fail ("error", Kafka's).
    time_not_found_latest: bool = False
    max_offsets_per_trigger: int | None = None
    min_offsets_per_trigger: int | None = None
    max_trigger_delay_s: float = DEFAULT_MAX_TRIGGER_DELAY_S
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

    @property
    def required(self) -> frozenset[str]:
        """Pchannels the query names: they must exist (checked at once) and be served."""
        named = {p for spec in (self.starting, self.ending) for p, _ in spec.per_pchannel}
        return frozenset(self.pchannels) | named


@dataclass(frozen=True)
class SinkOptions:
    discovery: DiscoveryConfig
    pchannel: str | None = None
    idempotency_key: str | None = None
    batch_rows: int = BATCH_ROWS
    columns: tuple[str, ...] = ()


def check_known(opts: Mapping[str, str], known: Iterable[str], what: str) -> None:
    """Refuse options this source (or sink) does not have, naming the ones it has."""
    spelled = {name.lower(): name for name in known}
    for name in opts:
        if name.lower() in spelled:
            continue
        close = difflib.get_close_matches(name.lower(), spelled, n=1, cutoff=0.75)
        hint = f" (did you mean {spelled[close[0]]}?)" if close else ""
        raise InvalidArgument(
            f"unknown option {name!r} for the streamwal {what}{hint}; its options are: "
            f"{', '.join(sorted(spelled.values(), key=str.lower))} (see docs/spark.md)"
        )


def _entries(option: str, value: dict) -> Iterable[tuple[str, object]]:
    """(pchannel, value) pairs of a flat {"pchannel": v} or Kafka's nested
    {"topic": {"partition": v}} JSON; the nested form names pchannel `topic_partition`,
    the names `channel create --prefix` gives (PREFIX_N, as Milvus's pchannels)."""
    for name, v in value.items():
        if not isinstance(v, dict):
            yield name, v
            continue
        for part, inner in v.items():
            if not (isinstance(part, str) and part.isdigit()):
                raise InvalidArgument(
                    f"option {option}: in {{{name!r}: {{partition: value}}}} a partition must "
                    f"be a number, got {part!r}"
                )
            yield f"{name}_{int(part)}", inner


def _json_spec(option: str, raw: str, default: int | None, by_time: bool) -> OffsetSpec:
    try:
        value = json.loads(raw)
    except ValueError:
        raise InvalidArgument(
            f"option {option}: expected "
            + ("" if by_time else "earliest, latest or ")
            + f'a JSON object {{"pchannel": {"timestamp" if by_time else "offset"}}} or '
            f'{{"topic": {{"partition": ...}}}}, got {raw!r}'
        ) from None
    if not isinstance(value, dict):
        raise InvalidArgument(f"option {option}: the JSON must be an object, got {raw!r}")
    pairs: dict[str, int] = {}
    lowest = 0 if by_time else EARLIEST
    for name, v in _entries(option, value):
        if isinstance(v, bool) or not isinstance(v, int) or v < lowest:
            wanted = (
                "a timestamp in ms since the epoch (>= 0)"
                if by_time
                else "an integer >= 0, or -2 (earliest) / -1 (latest)"
            )
            raise InvalidArgument(f"option {option}: value of {name!r} must be {wanted}, got {v!r}")
        if name in pairs:
            raise InvalidArgument(f"option {option}: pchannel {name!r} is named twice")
        pairs[name] = v
    return OffsetSpec(default, tuple(sorted(pairs.items())), by_time, option)


def parse_offsets(option: str, raw: str | None, default: int) -> OffsetSpec:
    """`earliest` | `latest` | JSON {pchannel: offset} (or nested, see _entries)."""
    if raw is None or not raw.strip():
        return OffsetSpec(default, option=option)
    text = raw.strip()
    if text.lower() == "earliest":
        return OffsetSpec(EARLIEST, option=option)
    if text.lower() == "latest":
        return OffsetSpec(LATEST, option=option)
    return _json_spec(option, text, default, by_time=False)


def _timestamp(option: str, raw: str) -> int:
    text = raw.strip()
    if not text.isdigit():
        raise InvalidArgument(
            f"option {option}: expected a timestamp in ms since the epoch, got {raw!r}"
        )
    return int(text)


def _position(opts: Mapping[str, str], end: str, default: int) -> OffsetSpec:
    """One spec from `<end>Offsets`, `<end>Timestamp` and `<end>OffsetsByTimestamp`
    (`end` is "starting" or "ending"). Kafka lets the timestamp options silently win over
    the others; here naming more than one of them is an error."""
    names = (f"{end}Offsets", f"{end}Timestamp", f"{end}OffsetsByTimestamp")
    given = [n for n in names if opts.get(n) is not None]
    if len(given) > 1:
        raise InvalidArgument(f"options {' and '.join(given)}: set only one of them")
    if not given or given[0] == names[0]:
        return parse_offsets(names[0], opts.get(names[0]), default)
    option = given[0]
    if option == names[1]:
        return OffsetSpec(_timestamp(option, opts[option]), by_time=True, option=option)
    return _json_spec(option, opts[option].strip(), None, by_time=True)


def _bool(option: str, raw: str | None, default: bool) -> bool:
    if raw is None:
        return default
    text = raw.strip().lower()
    if text in ("true", "1", "yes"):
        return True
    if text in ("false", "0", "no"):
        return False
    raise InvalidArgument(f"option {option}: expected true or false, got {raw!r}")


def positive_int(option: str, raw: str | None) -> int | None:
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


def _millis(option: str, raw: str | None, default: float) -> float:
    ms = positive_int(option, raw)
    return default if ms is None else ms / 1000.0


def _duration_s(option: str, raw: str | None, default: float) -> float:
    """A duration with its unit (500ms, 30s, 15m): a bare number would be milliseconds to
    Kafka and seconds to streamwal's other flags, so it is refused."""
    if raw is None:
        return default
    if raw.strip().replace(".", "", 1).isdigit():
        raise InvalidArgument(f"option {option}: give a unit, e.g. 500ms, 30s or 15m; got {raw!r}")
    try:
        return parse_duration_ms(raw) / 1000.0
    except ValueError as exc:
        raise InvalidArgument(f"option {option}: {exc}") from None


def parse_discovery(opts: Mapping[str, str]) -> DiscoveryConfig:
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
    if opts.get("kubeconfig") and not namespace:
        raise InvalidArgument("option kubeconfig is for the kubernetes discovery only")
    return DiscoveryConfig(
        coord=coord,
        kube_namespace=namespace,
        kubeconfig=opts.get("kubeconfig") or None,
        nodes=nodes,
        timeout_s=_millis("discoveryTimeoutMs", opts.get("discoveryTimeoutMs"),
                          DEFAULT_DISCOVERY_TIMEOUT_S),
    )  # fmt: skip


def parse_source(opts: Mapping[str, str], *, streaming: bool) -> SourceOptions:
    """Check and type the reader options (`opts` may be Spark's case-insensitive dict)."""
    check_known(opts, SOURCE_OPTIONS, "source")
    kind = "streaming" if streaming else "batch"
    for name in _BATCH_ONLY if streaming else _STREAMING_ONLY:
        if opts.get(name) is not None:
            wanted = "batch" if streaming else "streaming"
            raise InvalidArgument(f"option {name} is for {wanted} queries only (this is {kind})")
    pchannels = tuple(p.strip() for p in (opts.get("pchannels") or "").split(",") if p.strip())
    pattern = opts.get("pchannelPattern") or None
    if bool(pchannels) == bool(pattern):
        raise InvalidArgument("exactly one of the options pchannels or pchannelPattern is needed")
    if pattern is not None:
        try:
            re.compile(pattern)
        except re.error as exc:
            raise InvalidArgument(f"option pchannelPattern: bad regex {pattern!r}: {exc}") from None
    starting = _position(opts, "starting", LATEST if streaming else EARLIEST)
    ending = _position(opts, "ending", LATEST)
    if not streaming:
        # As Kafka: a batch query cannot start at latest nor end at earliest.
        if LATEST in starting.offset_values():
            raise InvalidArgument("option startingOffsets: latest is not allowed in a batch query")
        if EARLIEST in ending.offset_values():
            raise InvalidArgument("option endingOffsets: earliest is not allowed")
    selects = SourceOptions(pchannels=pchannels, pattern=pattern).selects
    for spec in (starting, ending):
        for name, _ in spec.per_pchannel:
            if not selects(name):
                raise InvalidArgument(
                    f"option {spec.option} names pchannel {name}, which the query does not "
                    f"read (see pchannels / pchannelPattern)"
                )
    strategy = (opts.get("startingOffsetsByTimestampStrategy") or "error").strip().lower()
    if strategy not in ("error", "latest"):
        raise InvalidArgument(
            f"option startingOffsetsByTimestampStrategy: expected error or latest, got {strategy!r}"
        )
    if opts.get("startingOffsetsByTimestampStrategy") is not None and not starting.by_time:
        raise InvalidArgument(
            "option startingOffsetsByTimestampStrategy applies to startingTimestamp and "
            "startingOffsetsByTimestamp only"
        )
    max_per_trigger = positive_int("maxOffsetsPerTrigger", opts.get("maxOffsetsPerTrigger"))
    min_per_trigger = positive_int("minOffsetsPerTrigger", opts.get("minOffsetsPerTrigger"))
    if opts.get("maxTriggerDelay") is not None and min_per_trigger is None:
        raise InvalidArgument("option maxTriggerDelay applies with minOffsetsPerTrigger only")
    if min_per_trigger and max_per_trigger and min_per_trigger > max_per_trigger:
        raise InvalidArgument(
            f"option minOffsetsPerTrigger ({min_per_trigger}) is above maxOffsetsPerTrigger "
            f"({max_per_trigger})"
        )
    per_partition = positive_int("maxOffsetsPerPartition", opts.get("maxOffsetsPerPartition"))
    return SourceOptions(
        pchannels=pchannels,
        pattern=pattern,
        starting=starting,
        ending=ending,
        time_not_found_latest=strategy == "latest",
        max_offsets_per_trigger=max_per_trigger,
        min_offsets_per_trigger=min_per_trigger,
        max_trigger_delay_s=_duration_s("maxTriggerDelay", opts.get("maxTriggerDelay"),
                                        DEFAULT_MAX_TRIGGER_DELAY_S),
        max_offsets_per_partition=per_partition or DEFAULT_MAX_OFFSETS_PER_PARTITION,
        min_partitions=positive_int("minPartitions", opts.get("minPartitions")),
        fail_on_data_loss=_bool("failOnDataLoss", opts.get("failOnDataLoss"), True),
        include_time_ticks=_bool("includeTimeTicks", opts.get("includeTimeTicks"), False),
        read_timeout_s=_millis("readTimeoutMs", opts.get("readTimeoutMs"),
                               DEFAULT_READ_TIMEOUT_S),
        discovery=parse_discovery(opts),
    )  # fmt: skip


def parse_sink(opts: Mapping[str, str], columns: tuple[str, ...]) -> SinkOptions:
    """Check and type the writer options against the DataFrame's columns."""
    check_known(opts, SINK_OPTIONS, "sink")
    if "payload" not in columns:
        raise InvalidArgument("the streamwal sink needs a binary column `payload`")
    unknown = [c for c in columns if c not in SINK_COLUMNS]
    if unknown:
        raise InvalidArgument(
            f"the streamwal sink has no use for the column(s) {', '.join(unknown)}: its "
            f"columns are {', '.join(SINK_COLUMNS)} (select them before writing)"
        )
    default = opts.get("pchannel") or None
    if default is None and "pchannel" not in columns and "vchannel" not in columns:
        raise InvalidArgument(
            "the streamwal sink needs a `pchannel` or `vchannel` column, or the option pchannel"
        )
    return SinkOptions(
        discovery=parse_discovery(opts),
        pchannel=default,
        idempotency_key=opts.get("idempotencyKey") or None,
        batch_rows=positive_int("batchRows", opts.get("batchRows")) or BATCH_ROWS,
        columns=columns,
    )
