"""Node configuration: one dataclass, filled from CLI flags or STREAMWAL_NODE_* variables."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class NodeConfig:
    listen: str = "127.0.0.1:19530"
    data_dir: str = "./data/node"
    node_id: int = 1
    metrics: str | None = None
    # "sync": fsync every group commit (acknowledged survives power loss);
    # "async": the write reaches the OS before the ack (survives kill -9, not power loss).
    durability: str = "sync"
    # On a new data dir (sync durability): filler written and dropped once so the first
    # appends overwrite a recycled WAL file (log_store.LogStore._prewarm_wal). 0: off.
    wal_prewarm_bytes: int = 64 * 1024 * 1024
    # RocksDB compaction threads run at the lowest CPU priority, below the event loop
    # (log_store._low_priority_compaction_env); "normal" leaves them at the node's.
    compaction_priority: str = "low"
    max_message_bytes: int = 4 * 1024 * 1024
    time_tick_interval_s: float = 0.2
    retention_check_interval_s: float = 5.0
    # An idempotent producer's state leaves memory after this long unused (its window
    # stays in RocksDB and is read again if the producer returns).
    producer_idle_s: float = 600.0
    default_retention_age_ms: int = 0
    default_retention_bytes: int = 0
    # A producer stream stops reading requests while this many bytes await their ack.
    max_inflight_bytes_per_producer: int = 64 * 1024 * 1024
    # Transactions (node/txn.py): default keepalive, buffered bytes per txn, open txns.
    txn_keepalive_s: float = 10.0
    txn_max_bytes: int = 16 * 1024 * 1024
    txn_max_open: int = 1024
    # Before serving, what earlier processes wrote is verified for at most this long (the
    # rest in the background); a damaged table block found then is salvaged at once.
    startup_verify_s: float = 5.0
    # A leader that heard from no majority of its replicas for this long is unhealthy.
    quorum_lease_s: float = 1.0
    # The produce port (plain TCP frames, proto/wire.proto): "auto" = the gRPC host on a
    # free port, HOST:PORT, or "off". Closed whenever TLS is configured.
    produce_listen: str = "auto"
    # Written with the bound port once serving: lets a supervisor use --listen HOST:0.
    port_file: str | None = None
