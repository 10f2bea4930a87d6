"""Codec specs on the wire: a codec name, optionally with its constructor parameters.

``"fp16"``, ``'topk:{"density": 0.01, "values": "int8"}'`` or, typed by people,
``topk:bits=2,density=0.01`` (each value read as JSON, else as a string). The
coordinator's policy owns the parameters; sending them with the codec keeps both ends of
a link on the same codec.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from skyfed.compression.base import Codec
from skyfed.compression.registry import make_codec

MAX_SPEC_CHARS = 512


def wire_spec(name: str, params_json: str) -> str:
    """The spec for a codec name and its parameters as they travel in separate fields."""
    return f"{name}:{params_json}" if params_json else name


def parse_spec(spec: str) -> tuple[str, dict[str, Any]]:
    """Split a spec; a malformed one raises ``ValueError`` naming it."""
    if len(spec) > MAX_SPEC_CHARS:
        raise ValueError(f"codec spec of {len(spec)} characters is too long")
    name, sep, raw = spec.partition(":")
    if not sep:
        return name, {}
    if not raw.lstrip().startswith(("{", "[")):
        return name, _key_values(spec, raw)
    try:
        params = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ValueError(f"codec spec {spec!r} has malformed parameters: {exc}") from None
    if not isinstance(params, dict):
        raise ValueError(f"codec spec {spec!r}: parameters must be an object")
    return name, params


def codec_from_spec(spec: str, seed: int | Sequence[int] | None = None) -> Codec:
    """The codec a spec names, built with its parameters (and ``seed`` for its rounding,
    if it rounds at random); ``ValueError`` if it cannot be."""
    name, params = parse_spec(spec)
    if "seed" in params:
        raise ValueError(f"codec spec {spec!r}: the sender seeds its own rounding")
    try:
        return make_codec(name, seed=seed, **params)
    except TypeError as exc:
        raise ValueError(f"codec spec {spec!r}: {exc}") from None


def _key_values(spec: str, raw: str) -> dict[str, Any]:
    """``bits=2,density=0.01`` as ``{"bits": 2, "density": 0.01}``."""
    params: dict[str, Any] = {}
    for item in raw.split(","):
        key, eq, value = item.partition("=")
        if not eq or not key.strip():
            raise ValueError(f"codec spec {spec!r}: {item!r} is not key=value")
        try:
            params[key.strip()] = json.loads(value)
        except json.JSONDecodeError:
            params[key.strip()] = value.strip()
    return params
