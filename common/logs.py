"""Structured logging: one JSON object per line on stderr (or plain text for humans).

Operators grep and ship logs; JSON lines with stable keys (ts, level, logger, msg, plus
any `extra=` fields) survive both. `STREAMWAL_LOG_FORMAT=text` gives readable output.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time

_STANDARD = set(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in record.__dict__.items():
            if key not in _STANDARD and not key.startswith("_"):
                out[key] = value
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


class ClientGoneFilter(logging.Filter):
    """grpc.aio logs a traceback at ERROR when a streaming handler returns after its
    client has gone (cancelled or disconnected): sending the call's final status then
    fails in gRPC's core. Nothing is lost, as nobody is left to receive it. It becomes
    one DEBUG line, so a node's log shows a traceback only for a real fault.
    """

    def __init__(self, level: int) -> None:
        super().__init__()
        self.level = level  # the configured level: below it the DEBUG line is dropped

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if (
            type(exc).__name__ == "ExecuteBatchError"
            and str(record.msg).startswith("ExecuteBatchError raised in core")
            and str(exc).count("Operation object") == 1
            and "SendStatusFromServerOperation" in str(exc)
        ):
            record.msg = f"the client left before the final status was sent ({record.msg})"
            record.levelno, record.levelname = logging.DEBUG, "DEBUG"
            record.exc_info, record.exc_text = None, None
        return record.levelno >= self.level


def configure(level: str | None = None, fmt: str | None = None) -> None:
    """Set up the root logger once per process, from arguments or the environment."""
    level = (level or os.environ.get("STREAMWAL_LOG_LEVEL", "info")).upper()
    fmt = fmt or os.environ.get("STREAMWAL_LOG_FORMAT", "json")
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "text":
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    else:
        handler.setFormatter(JsonFormatter())
    handler.addFilter(ClientGoneFilter(logging.getLevelName(level)))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
