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


def _fields(record: logging.LogRecord) -> dict:
    """The `extra=` fields of a record."""
    return {
        k: v for k, v in record.__dict__.items() if k not in _STANDARD and not k.startswith("_")
    }


def _timestamp(record: logging.LogRecord) -> str:
    return (
        time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        + f".{int(record.msecs):03d}Z"
    )


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out = {
            "ts": _timestamp(record),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
            **_fields(record),
        }
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


class TextFormatter(logging.Formatter):
    """For humans: the message, then every structured field as key=value (which port was
    bound, which pchannel failed), as logfmt does."""

    def format(self, record: logging.LogRecord) -> str:
        fields = " ".join(f"{k}={json.dumps(v, default=str)}" for k, v in _fields(record).items())
        line = f"{_timestamp(record)} {record.levelname} {record.name}: {record.getMessage()}"
        if fields:
            line += f"  {fields}"
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


class Repeats:
    """A warning that may repeat many times a second (a peer down, a request refused):
    the first one of each key is logged at once, the next ones at most once per `every`
    seconds, with how many were left out since (`repeated`)."""

    def __init__(self, every: float = 10.0, clock=time.monotonic) -> None:
        self._every = every
        self._clock = clock
        self._seen: dict[object, tuple[float, int]] = {}  # key -> (last logged, left out)

    def log(
        self, logger: logging.Logger, level: int, msg: str, key: object, **fields: object
    ) -> None:
        now = self._clock()
        last = self._seen.get(key)
        if last is not None and now - last[0] < self._every:
            self._seen[key] = (last[0], last[1] + 1)
            return
        if last is not None and last[1]:
            fields["repeated"] = last[1]
        self._seen[key] = (now, 0)
        logger.log(level, msg, extra=fields)

    def forget(self, key: object) -> None:
        """The condition is over: the next occurrence is logged at once."""
        self._seen.pop(key, None)


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
        handler.setFormatter(TextFormatter())
    else:
        handler.setFormatter(JsonFormatter())
    handler.addFilter(ClientGoneFilter(logging.getLevelName(level)))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
