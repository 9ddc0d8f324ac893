"""What `streamwal produce` reads and `streamwal consume` writes, one line per message.

Pure: bytes in, bytes out. A message's key travels as the reserved property `_key`
(streamwal messages have no key field; Kafka users expect one): the console tools set it
and show it as `key`, and hide every internal property (`_tt`, `_wt`, `_vc`, `_t`,
`_key`...) unless asked, so the properties printed are the ones the producer set.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Mapping
from dataclasses import dataclass

from streamwal.message import RESERVED_PREFIX

PROP_KEY = "_key"
FORMATS = ("json", "raw", "text")
INPUTS = ("text", "json")


@dataclass(frozen=True)
class Record:
    """One message to send: payload, key (None: no key) and user properties."""

    payload: bytes
    key: str | None
    properties: dict[str, str]

    def all_properties(self) -> dict[str, str]:
        return {**self.properties, PROP_KEY: self.key} if self.key is not None else self.properties


def parse_property(text: str) -> tuple[str, str]:
    """`k=v` of `--property`; ValueError for a missing `=` or a reserved key."""
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise ValueError(f"{text!r} is not KEY=VALUE")
    if key.startswith(RESERVED_PREFIX):
        raise ValueError(f"{key!r}: keys starting with '_' are reserved")
    return key, value


def parse_line(line: bytes, number: int, key_separator: bytes | None, json_input: bool) -> Record:
    """The record of input line `number` (1-based, for the error message).

    Text lines are the payload, or KEY<sep>PAYLOAD with `key_separator` (a line without
    it is an error, as kafka-console-producer's). JSON lines are objects with `payload`
    (base64, as `consume --format json` prints it) or `text` (a UTF-8 string), and
    optional `key` and `properties` (string values)."""
    if json_input:
        return _json_record(line, number)
    if key_separator is None:
        return Record(line, None, {})
    key, sep, payload = line.partition(key_separator)
    if not sep:
        raise ValueError(f"line {number}: no key separator {key_separator.decode()!r}")
    return Record(payload, key.decode("utf-8", "replace"), {})


def _json_record(line: bytes, number: int) -> Record:
    try:
        obj = json.loads(line)
    except ValueError as exc:
        raise ValueError(f"line {number}: not JSON ({exc})") from None
    if not isinstance(obj, dict):
        raise ValueError(f"line {number}: not a JSON object")
    unknown = set(obj) - {"payload", "text", "key", "properties"}
    if unknown:
        raise ValueError(
            f"line {number}: unknown field(s) {', '.join(sorted(unknown))} "
            "(known: payload, text, key, properties)"
        )
    if ("payload" in obj) == ("text" in obj):
        raise ValueError(f"line {number}: give exactly one of payload (base64) and text")
    try:
        payload = (
            base64.b64decode(obj["payload"], validate=True)
            if "payload" in obj
            else str(obj["text"]).encode()
        )
    except (binascii.Error, TypeError):
        raise ValueError(f"line {number}: payload is not base64") from None
    key = obj.get("key")
    props = obj.get("properties") or {}
    if key is not None and not isinstance(key, str):
        raise ValueError(f"line {number}: key must be a string")
    if not isinstance(props, dict) or not all(isinstance(v, str) for v in props.values()):
        raise ValueError(f"line {number}: properties must map strings to strings")
    for k in props:
        if k.startswith(RESERVED_PREFIX):
            raise ValueError(f"line {number}: property {k!r}: keys starting with '_' are reserved")
    return Record(payload, key, dict(props))


def format_message(
    channel: str,
    offset: int,
    time_tick: int,
    properties: Mapping[str, str],
    payload: bytes,
    fmt: str,
    show_internal: bool,
) -> bytes:
    """One output line (with its newline).

    json: {"channel", "offset", "time_tick", "key", "properties", "payload" (base64)};
    raw: the payload bytes; text: `OFFSET<TAB>KEY<TAB>PAYLOAD` with the payload as UTF-8
    (undecodable bytes escaped) and `-` for no key."""
    key = properties.get(PROP_KEY)
    if fmt == "raw":
        return payload + b"\n"
    if fmt == "text":
        text = payload.decode("utf-8", "backslashreplace").replace("\n", "\\n")
        return f"{offset}\t{key if key is not None else '-'}\t{text}\n".encode()
    shown = (
        dict(properties)
        if show_internal
        else {k: v for k, v in properties.items() if not k.startswith(RESERVED_PREFIX)}
    )
    line = {
        "channel": channel,
        "offset": offset,
        "time_tick": time_tick,
        "key": key,
        "properties": shown,
        "payload": base64.b64encode(payload).decode(),
    }
    return json.dumps(line).encode() + b"\n"


def parse_start(text: str) -> tuple[str, int]:
    """`--from`: ("earliest", 0), ("latest", 0) or ("offset", N); ValueError otherwise.
    `all` is an old spelling of earliest."""
    word = text.strip().lower()
    if word in ("earliest", "all"):
        return "earliest", 0
    if word == "latest":
        return "latest", 0
    if word.isascii() and word.isdigit() and int(word) < 2**63:
        return "offset", int(word)
    raise ValueError(f"{text!r}: use earliest, latest or an offset 0..{2**63 - 1}")
