"""Structured logs: what grpc.aio reports about clients that went away."""

from __future__ import annotations

import io
import json
import logging

import pytest
from grpc._cython import cygrpc

from streamwal import logs


@pytest.fixture(autouse=True)
def _root_logger_restored():
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


def _log_grpc_error(batch: str, level: str) -> list[dict]:
    out = io.StringIO()
    logs.configure(level, "json")
    logging.getLogger().handlers[0].stream = out
    try:
        raise cygrpc.ExecuteBatchError(f'Failed "execute_batch": ({batch},)')
    except cygrpc.ExecuteBatchError:
        logging.getLogger("grpc._cython.cygrpc").exception(
            "ExecuteBatchError raised in core by servicer method [%s]", "/svc/Consume"
        )
    return [json.loads(line) for line in out.getvalue().splitlines()]


def test_a_status_nobody_was_left_to_receive_is_one_debug_line() -> None:
    status_only = "<grpc._cython.cygrpc.SendStatusFromServerOperation object at 0x7f>"
    assert _log_grpc_error(status_only, "info") == []
    (line,) = _log_grpc_error(status_only, "debug")
    assert line["level"] == "debug" and "exc" not in line
    assert "the client left" in line["msg"] and "/svc/Consume" in line["msg"]


def test_other_failed_batches_keep_their_traceback() -> None:
    message = "<grpc._cython.cygrpc.SendMessageOperation object at 0x7f>"
    (line,) = _log_grpc_error(message, "info")
    assert line["level"] == "error" and "Traceback" in line["exc"]


def test_text_logs_keep_every_structured_field() -> None:
    out = io.StringIO()
    logs.configure("info", "text")
    logging.getLogger().handlers[0].stream = out
    logging.getLogger("streamwal.node").info("node serving", extra={"port": 41149, "id": "n1"})
    line = out.getvalue().strip()
    assert "INFO streamwal.node: node serving" in line
    assert 'port=41149 id="n1"' in line


def test_a_repeating_warning_is_logged_once_then_counted() -> None:
    now = [0.0]
    repeats = logs.Repeats(every=10.0, clock=lambda: now[0])
    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    logger = logging.getLogger("test.repeats")
    logger.addHandler(Keep())
    logger.propagate = False
    for i in range(100):  # 100 failures in 5 s: one line
        now[0] = i * 0.05
        repeats.log(logger, logging.WARNING, "peer down", "peer-a", peer="a")
    now[0] = 12.0
    repeats.log(logger, logging.WARNING, "peer down", "peer-a", peer="a")
    repeats.log(logger, logging.WARNING, "peer down", "peer-b", peer="b")  # its own key
    assert [(r.peer, getattr(r, "repeated", 0)) for r in records] == [("a", 0), ("a", 99), ("b", 0)]
    repeats.forget("peer-a")
    repeats.log(logger, logging.WARNING, "peer down", "peer-a", peer="a")
    assert len(records) == 4
