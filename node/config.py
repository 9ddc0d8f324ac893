"""Node configuration: one dataclass, filled from CLI flags or STREAMWAL_NODE_* variables."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class NodeConfig:
    listen: str = "127.0.0.1:19530"
    # The manager and replication services' listener: "auto" = the gRPC host on a free
    # port (named by Describe), HOST:PORT, or "shared" (on `listen`, the seed's one port).
    internal_listen: str = "auto"
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
    # A producer stream stops reading requests while this many bytes await their ack,
    # or this many answers wait to be written (a producer that does not read them).
    max_inflight_bytes_per_producer: int = 64 * 1024 * 1024
    max_pending_answers: int = 4096
    # Transactions (node/txn.py): default and longest keepalive, buffered bytes per txn,
    # open txns per node and per producer stream.
    txn_keepalive_s: float = 10.0
    txn_max_keepalive_s: float = 600.0
    txn_max_bytes: int = 16 * 1024 * 1024
    txn_max_open: int = 1024
    txn_max_open_per_stream: int = 64
    # Before serving, what earlier processes wrote is verified for at most this long (the
    # rest in the background); a damaged table block found then is salvaged at once.
    startup_verify_s: float = 5.0
    # A leader that heard from no majority of its replicas for this long is unhealthy.
    quorum_lease_s: float = 1.0
    # Limits of the listeners (node/limits.py, docs/limits.md): connections per listener
    # (gRPC, produce port), in total and per peer address; gRPC calls in total and per
    # connection; the largest request frame (a gRPC message or a produce-port frame);
    # bytes of produce-port frames received in part, all connections together; a new
    # connection's first frame (handshake) and any connection's silence (timeouts).
    max_connections: int = 4096
    max_connections_per_peer: int = 1024
    max_streams: int = 16384
    max_streams_per_connection: int = 1024
    max_frame_bytes: int = 16 * 1024 * 1024
    max_receive_buffer_bytes: int = 64 * 1024 * 1024
    header_timeout_s: float = 10.0
    idle_timeout_s: float = 600.0
    # The produce port (plain TCP frames, proto/wire.proto): "auto" = the gRPC host on a
    # free port, HOST:PORT, or "off". Closed whenever TLS is configured.
    produce_listen: str = "auto"
    # The replication port (followers' Replicate streams as plain TCP frames): "auto" = the
    # internal listener's host on a free port, HOST:PORT, or "off". Closed with TLS.
    replication_listen: str = "auto"
    # The probe port (node/probe_port.py): "auto" = the gRPC host on a free port,
    # HOST:PORT, or "off".
    probe_listen: str = "auto"
    # Written with the bound port once serving: lets a supervisor use --listen HOST:0.
    port_file: str | None = None

    def check(self) -> None:
        """Raises ValueError, naming the flags, when settings do not fit together."""
        if self.max_message_bytes + 1024 > self.max_frame_bytes:
            raise ValueError(
                f"--max-frame-size ({self.max_frame_bytes} bytes) must exceed "
                f"--max-message-size ({self.max_message_bytes}) by 1 KiB at least: a frame "
                "must hold one message of the largest size"
            )
        if self.max_receive_buffer_bytes < self.max_frame_bytes:
            raise ValueError(
                f"--max-receive-buffer ({self.max_receive_buffer_bytes} bytes) must be at "
                f"least --max-frame-size ({self.max_frame_bytes})"
            )
        if self.txn_keepalive_s > self.txn_max_keepalive_s:
            raise ValueError(
                f"--txn-keepalive ({self.txn_keepalive_s:g} s) must not exceed "
                f"--txn-max-keepalive ({self.txn_max_keepalive_s:g} s)"
            )
