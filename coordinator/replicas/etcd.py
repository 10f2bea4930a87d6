"""etcd through its gRPC gateway (``etcd3gw``): leases, keys and the v3election API.

etcd3gw speaks etcd's HTTP/JSON gateway, so it needs no generated protobuf code of its own
(python-etcd3's breaks on protobuf 4 and later) and rides on ``requests``. It covers
leases and keys; the election calls (Campaign, Leader, Observe, Resign) are the
gateway's ``/v3/election/*`` routes, posted through the same client. Each endpoint of the
cluster is tried in turn, so one etcd member down costs one failed request, not the
election. Why etcd and this client: docs/failover.md.
"""

from __future__ import annotations

import base64
import json
import logging
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import requests
from etcd3gw.client import Etcd3Client
from etcd3gw.exceptions import ConnectionFailedError, ConnectionTimeoutError, Etcd3Exception

log = logging.getLogger(__name__)

API_PATH = "/v3/"
"""etcd 3.4 and later serve the gateway here (Debian bookworm ships 3.4)."""
CONNECT_TIMEOUT_S = 2.0


class EtcdUnavailable(Exception):
    """No endpoint of the etcd cluster answered."""


class EtcdError(Exception):
    """etcd answered, and refused the request (its message says why)."""


UNREACHABLE = (ConnectionFailedError, ConnectionTimeoutError, requests.RequestException)


@dataclass(frozen=True, slots=True)
class TlsFiles:
    """The CA etcd's certificate chains to, and the client certificate a replica shows it."""

    ca: Path
    cert: Path
    key: Path


@dataclass(frozen=True, slots=True)
class LeaderKey:
    """A campaign's key: etcd's proof of leadership (Resign takes it back)."""

    name: bytes
    key: bytes
    rev: int
    """The key's create revision: etcd makes it strictly increasing, so it is the term."""
    lease: int


@dataclass(frozen=True, slots=True)
class KeyValue:
    key: bytes
    value: bytes
    create_revision: int
    lease: int


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _unb64(text: str) -> bytes:
    return base64.b64decode(text)


class Etcd:
    """One etcd cluster. Short calls time out after ``timeout_s``; a Campaign waits as long
    as it takes, on clients of its own (a request blocked there holds its connection)."""

    def __init__(
        self, endpoints: Sequence[str], *, tls: TlsFiles | None = None, timeout_s: float = 2.0
    ) -> None:
        self.endpoints = list(endpoints)
        self._tls = tls
        self._timeout_s = timeout_s
        self._clients = [self._client(url, (CONNECT_TIMEOUT_S, timeout_s)) for url in endpoints]
        self._next = 0
        self._lock = threading.Lock()

    def _client(self, url: str, timeout: Any) -> Etcd3Client:
        parts = urlsplit(url)
        tls = self._tls if parts.scheme == "https" else None
        client = Etcd3Client(
            host=parts.hostname or "",
            port=parts.port or 2379,
            protocol=parts.scheme,
            ca_cert=str(tls.ca) if tls else None,
            cert_key=str(tls.key) if tls else None,
            cert_cert=str(tls.cert) if tls else None,
            timeout=timeout,
            api_path=API_PATH,
        )
        # requests lets REQUESTS_CA_BUNDLE (and proxy variables) override the session's
        # own CA: etcd's certificate is checked against etcd_ca, and never via a proxy.
        client.session.trust_env = False
        return client

    def _post(
        self, path: str, body: dict[str, Any], clients: list[Etcd3Client] | None = None
    ) -> Any:
        """POST to the first endpoint that answers, starting from the last that did."""
        clients = clients or self._clients
        with self._lock:
            start = self._next
        errors = []
        for i in range(len(clients)):
            index = (start + i) % len(clients)
            client = clients[index]
            try:
                result = client.post(client.get_url(path), json=body)
            except UNREACHABLE as exc:
                errors.append(f"{self.endpoints[index]}: {type(exc).__name__}")
                continue
            except Etcd3Exception as exc:
                raise EtcdError(f"etcd {path}: {_message(exc)}") from exc
            with self._lock:
                self._next = index
            return result
        raise EtcdUnavailable(f"etcd {path}: " + "; ".join(errors))

    # ---- leases --------------------------------------------------------------------------

    def grant(self, ttl_s: int) -> tuple[int, int]:
        """A new lease: (its id, the TTL etcd granted, which may exceed ``ttl_s``)."""
        result = self._post("/lease/grant", {"TTL": ttl_s, "ID": 0})
        return int(result["ID"]), int(result["TTL"])

    def keepalive(self, lease: int) -> int:
        """Refresh ``lease``; its TTL from now, or -1 when etcd no longer has it."""
        result = self._post("/lease/keepalive", {"ID": lease})
        return int(result.get("result", {}).get("TTL", -1))

    def revoke(self, lease: int) -> None:
        """End ``lease`` now: every key it holds (a candidacy, a registration) goes with it."""
        self._post("/lease/revoke", {"ID": lease})

    # ---- keys ----------------------------------------------------------------------------

    def put(self, key: bytes, value: bytes, lease: int = 0) -> None:
        self._post("/kv/put", {"key": _b64(key), "value": _b64(value), "lease": lease})

    def get(self, key: bytes) -> KeyValue | None:
        result = self._post("/kv/range", {"key": _b64(key)})
        kvs = result.get("kvs", [])
        return _kv(kvs[0]) if kvs else None

    def put_if(self, held: LeaderKey, key: bytes, value: bytes) -> bool:
        """Put ``key`` only while ``held`` is still the leader's key of its election
        (the same create revision, the term): a deposed leader's write fails. True if
        it was written."""
        compare = {
            "key": _b64(held.key),
            "target": "CREATE",
            "result": "EQUAL",
            "create_revision": held.rev,
        }
        return self._txn([compare], key, value)

    def put_if_absent(self, key: bytes, value: bytes) -> bool:
        """Put ``key`` only if it does not exist; True if it was written."""
        compare = {"key": _b64(key), "target": "CREATE", "result": "EQUAL", "create_revision": 0}
        return self._txn([compare], key, value)

    def _txn(self, compare: list[dict[str, Any]], key: bytes, value: bytes) -> bool:
        put = {"request_put": {"key": _b64(key), "value": _b64(value)}}
        result = self._post("/kv/txn", {"compare": compare, "success": [put]})
        return bool(result.get("succeeded", False))

    def get_prefix(self, prefix: bytes) -> list[KeyValue]:
        end = prefix[:-1] + bytes([prefix[-1] + 1])
        result = self._post("/kv/range", {"key": _b64(prefix), "range_end": _b64(end)})
        return [_kv(kv) for kv in result.get("kvs", [])]

    # ---- election (v3election) -----------------------------------------------------------

    def campaign(self, name: bytes, lease: int, value: bytes) -> LeaderKey:
        """Wait until the candidate ``lease`` leads election ``name``, then its key."""
        clients = [self._client(url, (CONNECT_TIMEOUT_S, None)) for url in self.endpoints]
        try:
            body = {"name": _b64(name), "lease": lease, "value": _b64(value)}
            result = self._post("/election/campaign", body, clients)
        finally:
            for client in clients:
                client.session.close()
        leader = result["leader"]
        return LeaderKey(
            name=_unb64(leader["name"]),
            key=_unb64(leader["key"]),
            rev=int(leader["rev"]),
            lease=int(leader["lease"]),
        )

    def leader(self, name: bytes) -> KeyValue | None:
        """The current leader's key of election ``name``; None while there is none."""
        try:
            result = self._post("/election/leader", {"name": _b64(name)})
        except EtcdError as exc:
            if "no leader" in str(exc):
                return None  # the gateway answers "election: no leader" with status 500
            raise
        return _kv(result["kv"]) if "kv" in result else None

    def resign(self, leader: LeaderKey) -> None:
        body = {
            "leader": {
                "name": _b64(leader.name),
                "key": _b64(leader.key),
                "rev": leader.rev,
                "lease": leader.lease,
            }
        }
        self._post("/election/resign", body)

    def observe(self, name: bytes, stop: threading.Event) -> Iterator[KeyValue]:
        """Every leader of election ``name`` as etcd elects them, from the current one on,
        until ``stop`` is set or the stream breaks (EtcdUnavailable)."""
        body = json.dumps({"name": _b64(name)})
        for url in self.endpoints[self._next :] + self.endpoints[: self._next]:
            client = self._client(url, (CONNECT_TIMEOUT_S, None))
            try:
                response = client.session.post(
                    client.get_url("/election/observe"),
                    data=body,
                    stream=True,
                    timeout=(CONNECT_TIMEOUT_S, None),
                )
            except requests.RequestException:
                client.session.close()
                continue
            yield from _observed(response, client, stop)
            return
        raise EtcdUnavailable("etcd /election/observe: no endpoint answered")


def _observed(
    response: requests.Response, client: Etcd3Client, stop: threading.Event
) -> Iterator[KeyValue]:
    ended = threading.Event()

    def close_on_stop() -> None:  # unblocks the read below; ends with the stream
        while not ended.is_set():
            if stop.wait(0.5):
                response.close()
                return

    threading.Thread(target=close_on_stop, daemon=True).start()
    try:
        for line in response.iter_lines():
            if stop.is_set():
                return
            if not line.strip():
                continue
            message = json.loads(line)
            if "error" in message:
                raise EtcdUnavailable(f"etcd observe: {message['error']}")
            kv = message.get("result", {}).get("kv")
            if kv:
                yield _kv(kv)
    except (requests.RequestException, AttributeError, ValueError) as exc:
        if not stop.is_set():
            raise EtcdUnavailable(f"etcd observe ended: {exc!r}") from exc
    finally:
        ended.set()
        response.close()
        client.session.close()


def _message(exc: Etcd3Exception) -> str:
    """The gateway's own message out of the JSON body etcd3gw hands on."""
    text = exc.detail_text or str(exc)
    try:
        return str(json.loads(text).get("message", text))
    except ValueError:
        return text


def _kv(kv: dict[str, Any]) -> KeyValue:
    return KeyValue(
        key=_unb64(kv["key"]),
        value=_unb64(kv.get("value", "")),
        create_revision=int(kv.get("create_revision", 0)),
        lease=int(kv.get("lease", 0)),
    )
