"""Assembles a streaming node: LogStore + Wal + gRPC services + health + metrics."""

from __future__ import annotations

import asyncio
import logging
import os
import resource
import signal
import time

import grpc
from grpc import aio
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from prometheus_client import start_http_server

from streamwal.node import limits, salvage
from streamwal.node.config import NodeConfig
from streamwal.node.groups import GroupService
from streamwal.node.grpc_limits import CallLimits, server_options
from streamwal.node.log_store import LogStore
from streamwal.node.metrics import NodeMetrics
from streamwal.node.probe_port import ProbePort
from streamwal.node.produce_port import ProducePort
from streamwal.node.replication_port import ReplicationPort
from streamwal.node.service import NodeService
from streamwal.node.wal import Wal
from streamwal.proto import wire_pb2
from streamwal.transport import StartupError, TransportConfig, bind, check_bindable, make_server

log = logging.getLogger("streamwal.node")


def raise_fd_limit(connections: int) -> None:
    """Raise the soft limit on open files to the hard one: its four listeners may hold
    `connections` sockets each, and a node at its file limit locks every client out."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    needed = 4 * connections + 256
    if hard != resource.RLIM_INFINITY and hard < needed:
        log.warning(
            "open-file limit below the connection limits",
            extra={"limit": hard, "needed": needed, "max_connections": connections},
        )


class NodeServer:
    def __init__(self, config: NodeConfig, transport: TransportConfig | None = None) -> None:
        self.config = config
        self.transport = transport
        self.metrics = NodeMetrics()
        self.port = 0
        self._server = None
        self._metrics_server = None
        self._produce_port: ProducePort | None = None
        self._replication_port: ReplicationPort | None = None
        # Frames arriving in part on the produce and replication ports, both together.
        self._receive_buffer = limits.ReceiveBuffer(config.max_receive_buffer_bytes)
        self.internal_port = 0  # 0: the internal services share `port` (or not started)
        self._internal_server: aio.Server | None = None
        self._internal_calls: CallLimits | None = None
        self._probe_port: ProbePort | None = None

    def _grpc_server(self, calls: CallLimits) -> aio.Server:
        """A gRPC server with the node's limits and health and Describe services."""
        server = make_server(self.transport, server_options(self.config), [calls])
        health_pb2_grpc.add_HealthServicer_to_server(self._health, server)
        server.add_generic_rpc_handlers([self._info_handler()])
        return server

    def _bind(self, server: aio.Server, address: str, flag: str) -> int:
        """Listen on `address` (`flag` names it in errors); the bound port."""
        check_bindable(address, flag)
        try:
            port = bind(server, address, self.transport)
        except OSError as exc:  # the TLS files (STREAMWAL_TLS_*)
            raise StartupError(f"cannot read {exc.filename}: {exc.strerror}") from None
        except RuntimeError as exc:  # gRPC's "Failed to bind"
            raise StartupError(f"cannot listen on {address} ({flag}): {exc}") from None
        if port == 0:
            raise StartupError(f"cannot listen on {address} ({flag})")
        return port

    def _open_store(self) -> LogStore:
        """The node's store, salvaged first when damage was found (node/salvage.py), and
        repaired when RocksDB refuses to open it as corrupt."""
        cfg = self.config
        sync = cfg.durability == "sync"
        repaired = False
        while True:
            if salvage.needed(cfg.data_dir):
                salvage.salvage(cfg.data_dir)
            try:
                return LogStore(
                    cfg.data_dir,
                    sync=sync,
                    wal_prewarm_bytes=cfg.wal_prewarm_bytes if sync else 0,
                    low_priority_compaction=cfg.compaction_priority == "low",
                )
            except Exception as exc:
                if repaired or not str(exc).startswith("Corruption"):
                    raise
                salvage.repair(cfg.data_dir, str(exc))
                repaired = True

    async def start(self) -> None:
        cfg = self.config
        started = time.perf_counter()
        raise_fd_limit(cfg.max_connections)
        loop = asyncio.get_running_loop()
        for _ in range(2):
            try:
                self.store = await loop.run_in_executor(None, self._open_store)
            except Exception as exc:  # rocksdict raises plain Exceptions (permissions, a lock)
                raise StartupError(f"cannot open the data dir {cfg.data_dir}: {exc}") from None
            self.wal = Wal(self.store, cfg, self.metrics)
            self.wal.open()
            await self.wal.verify_before_serving(cfg.startup_verify_s)
            if not salvage.needed(cfg.data_dir):
                break
            await self.wal.close()  # a damaged table block: salvage before serving
            self.store.close()
        self.wal.start()
        self.service = NodeService(self.wal)
        self._health = health.aio.HealthServicer()
        client_services, internal_services = self.service.handlers()
        self.groups = GroupService(self.wal, self.service)
        self.groups.start()
        self._calls = CallLimits(cfg, self.service.count_limit)
        server = self._grpc_server(self._calls)
        server.add_generic_rpc_handlers([*client_services, self.groups.handler()])
        if cfg.internal_listen == "shared":  # one port, as the seed's node
            server.add_generic_rpc_handlers(internal_services)
        else:
            self._internal_calls = CallLimits(cfg, self.service.count_limit)
            self._internal_server = self._grpc_server(self._internal_calls)
            self._internal_server.add_generic_rpc_handlers(internal_services)
        self.port = self._bind(server, cfg.listen, "--listen")
        internal_host = cfg.listen.rpartition(":")[0]
        if self._internal_server is not None:
            where = cfg.internal_listen
            if where == "auto":  # the gRPC host, any free port (peers learn it from Describe)
                where = f"{internal_host}:0"
            else:
                internal_host = where.rpartition(":")[0]
            self.internal_port = self._bind(self._internal_server, where, "--internal-listen")
        await self._open_plain_ports(internal_host)
        await self._open_probe_port()
        await server.start()
        self._server = server
        if self._internal_server is not None:
            await self._internal_server.start()
        self.metrics.watch_limits(limits.configured(cfg), self._limit_usage)
        if cfg.metrics:
            host, _, port = cfg.metrics.rpartition(":")
            try:
                self._metrics_server, _ = start_http_server(
                    int(port), addr=host.strip("[]") or "0.0.0.0", registry=self.metrics.registry
                )
            except OSError as exc:
                raise StartupError(f"cannot serve metrics on {cfg.metrics}: {exc}") from None
        await self._health.set("", health_pb2.HealthCheckResponse.SERVING)
        if cfg.port_file:
            tmp = f"{cfg.port_file}.tmp"
            try:
                with open(tmp, "w") as f:
                    f.write(str(self.port))
                os.replace(tmp, cfg.port_file)
            except OSError as exc:
                raise StartupError(f"cannot write --port-file {cfg.port_file}: {exc}") from None
        log.info(
            "node serving",
            extra={
                "listen": cfg.listen,
                "port": self.port,
                "produce_port": self.produce_port,
                "internal_port": self.internal_port,
                "replication_port": self.replication_port,
                "node_id": cfg.node_id,
                "pchannels": len(self.wal.channels),
                "startup_s": round(time.perf_counter() - started, 3),
            },
        )

    @property
    def produce_port(self) -> int:
        return self._produce_port.port if self._produce_port else 0

    @property
    def replication_port(self) -> int:
        return self._replication_port.port if self._replication_port else 0

    def _limit_usage(self) -> dict[str, float]:
        ports = [p for p in (self._produce_port, self._replication_port) if p is not None]
        calls = [c for c in (self._calls, self._internal_calls) if c is not None]
        return {
            "connections": sum(c.connections.total for c in calls)
            + sum(p.counts.total for p in ports),
            "streams": sum(c.calls for c in calls),
            "receive_buffer": self._receive_buffer.used,
            "txns": len(self.service.txns),
        }

    async def _open_plain_ports(self, internal_host: str) -> None:
        """The plain-TCP produce and replication ports, unless turned off or TLS is on
        (they have no TLS). The produce port on the gRPC host, the replication port on
        the internal listener's, as only peer nodes may reach it; "auto" takes any free
        port there (clients and followers learn it from Describe)."""
        if (self.transport or TransportConfig.from_env()).tls:
            return
        cfg = self.config
        if cfg.produce_listen != "off":
            self._produce_port = ProducePort(self.service, cfg, self._receive_buffer)
            await self._start_plain(
                self._produce_port, cfg.produce_listen, cfg.listen.rpartition(":")[0], "produce"
            )
        if cfg.replication_listen != "off":
            self._replication_port = ReplicationPort(
                self.wal.replication, self.service, cfg, self._receive_buffer
            )
            await self._start_plain(
                self._replication_port, cfg.replication_listen, internal_host, "replication"
            )

    @staticmethod
    async def _start_plain(
        port: ProducePort | ReplicationPort, where: str, auto_host: str, name: str
    ) -> None:
        if where == "auto":
            where = f"{auto_host}:0"
        host, _, number = where.rpartition(":")
        try:
            await port.start(host.strip("[]") or None, int(number))
        except OSError as exc:
            raise StartupError(f"cannot listen on {where} (--{name}-listen): {exc}") from None

    async def _open_probe_port(self) -> None:
        """The probe port (node/probe_port.py), unless turned off; CollectStatus names it."""
        where = self.config.probe_listen
        if where == "off":
            return
        if where == "auto":
            where = f"{self.config.listen.rpartition(':')[0]}:0"
        self._probe_port = ProbePort(self.config.node_id, self.transport)
        try:
            await self._probe_port.start(where)
        except OSError as exc:
            raise StartupError(f"cannot listen on {where} (--probe-listen): {exc}") from None
        self.service.probe_port = self._probe_port.port

    def _info_handler(self) -> grpc.GenericRpcHandler:
        async def describe(_request, _context) -> wire_pb2.DescribeNodeResponse:
            return wire_pb2.DescribeNodeResponse(
                server_id=self.config.node_id,
                produce_port=self.produce_port,
                internal_port=self.internal_port,
                replication_port=self.replication_port,
            )

        return grpc.method_handlers_generic_handler(
            "streamwal.wire.StreamingNodeInfoService",
            {
                "Describe": grpc.unary_unary_rpc_method_handler(
                    describe,
                    wire_pb2.DescribeNodeRequest.FromString,
                    wire_pb2.DescribeNodeResponse.SerializeToString,
                )
            },
        )

    async def stop(self, grace: float = 2.0) -> None:
        """Stop serving, drain RPCs for `grace` seconds, write what is pending, close.

        Every phase has a deadline so SIGTERM always ends the process promptly: nothing
        unwritten was ever acknowledged, and RocksDB recovers its own WAL at the next
        start. The store is closed only after the WAL closed cleanly (never under a write).
        """
        self.service.serving = False
        clean = True
        for phase, step, deadline in (
            ("health", self._health.enter_graceful_shutdown(), 1.0),
            ("rpcs", self._stop_serving(grace), grace + 1),
            ("wal", self.wal.close(), 3.0),
        ):
            log.info("stopping", extra={"phase": phase})
            try:
                await asyncio.wait_for(step, deadline)
            except TimeoutError:
                clean = False
                log.error("stop phase timed out", extra={"phase": phase, "seconds": deadline})
        if self._probe_port is not None:
            await self._probe_port.stop()
        if clean:
            self.store.close()
        if self._metrics_server:
            self._metrics_server.shutdown()

    async def _stop_serving(self, grace: float) -> None:
        await asyncio.gather(
            self._server.stop(grace) if self._server else asyncio.sleep(0),
            self._internal_server.stop(grace) if self._internal_server else asyncio.sleep(0),
            self._produce_port.stop(grace) if self._produce_port else asyncio.sleep(0),
            self._replication_port.stop(grace) if self._replication_port else asyncio.sleep(0),
        )

    async def serve_forever(self) -> None:
        await self.start()
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()
        log.info("node stopping")
        await self.stop()
