"""The status as plain data (dicts, lists, numbers), for exporters, the history and the CLI.

Converted generically from the status message by its descriptor, so this module needs no
generated code and new status fields appear without an edit here.
"""

from __future__ import annotations

from typing import Any


def to_data(message: Any) -> dict[str, Any]:
    """Every field of a protobuf message by its proto name; nested messages become dicts."""
    out: dict[str, Any] = {}
    for field in message.DESCRIPTOR.fields:
        value = getattr(message, field.name)
        if field.message_type is not None:
            out[field.name] = [to_data(v) for v in value] if field.is_repeated else to_data(value)
        else:
            out[field.name] = list(value) if field.is_repeated else value
    return out


def waiting_for(snap: dict[str, Any]) -> str:
    """Why no round runs yet ("waiting for 3 agents, 2 connected: aws-1, gcp-1"), or ""."""
    needed = int(snap.get("min_agents", 1))
    names = sorted(a["name"] for a in snap.get("agents", ()) if a.get("state") != "disconnected")
    if snap.get("rounds") or snap.get("finished") or len(names) >= needed:
        return ""
    connected = f": {', '.join(names)}" if names else ""
    return f"waiting for {needed} agents, {len(names)} connected{connected}"
