"""A small asynchronous client of gpubroker's REST API (``/api/v1``).

Only what the spawner class needs: the caller's profiles, and create, get,
delete and the event stream of one server. Every call goes through its own
``aiohttp.ClientSession`` (one per :class:`BrokerClient`, which is an async
context manager), never through JupyterHub's shared tornado client: the hub
allows that client 10 connections, and a few long event streams on it starve
the hub's own requests. aiohttp also closes a stream
cleanly when the hub cancels the task reading it.

Errors:

- :class:`BrokerError` for every answer with status 400 or more, carrying
  the broker's ``{code, message}`` (``broker/api/v1`` ``Error``);
- :class:`BrokerUnreachable` when no answer came: connection refused, DNS,
  TLS, or a timeout.

The wire shapes (``Server``, ``Event``, ``Profile``) are the broker's
``broker/api/v1`` types; they are passed on as plain dicts, except events,
which become :class:`Event`.
"""

from __future__ import annotations

import asyncio
import json
import ssl
from dataclasses import dataclass
from typing import Any, AsyncIterator, Dict, List, Optional, Tuple
from urllib.parse import quote

import aiohttp

# HEADER_GROUPS carries a user's groups when the hub's service token acts for
# that user (broker/api/v1 HeaderGroups).
HEADER_GROUPS = "X-Gpubroker-Groups"
HEADER_IDEMPOTENCY_KEY = "Idempotency-Key"
HEADER_LAST_EVENT_ID = "Last-Event-ID"

# Server states (broker/api/v1 ServerState). TERMINAL ends an event stream.
RUNNING = "running"
STOPPING = "stopping"
STOPPED = "stopped"
FAILED = "failed"
TERMINAL = frozenset({STOPPED, FAILED})

# Status of an error that arrives inside a started event stream, by code;
# the stream's own status was already 200.
_STREAM_ERROR_STATUS = {"not_found": 404, "unavailable": 503}


class BrokerError(Exception):
    """The broker answered with an error.

    Attributes:
        status: the HTTP status, 400..599 (for an ``event: error`` inside a
            stream: 404 for ``not_found``, 503 for ``unavailable``, else 500).
        code: the broker's stable error word (``bad_request``,
            ``quota_exceeded``, ``no_capacity``, ``conflict``, ...); for an
            answer that was not the broker's JSON, ``http_<status>``.
        message: the broker's sentence, written for the person who asked.
    """

    def __init__(self, status: int, code: str, message: str):
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message

    def __str__(self) -> str:
        return self.message


class BrokerUnreachable(Exception):
    """No answer came from the broker (refused, unresolvable, TLS, timeout)."""


@dataclass(frozen=True)
class Event:
    """One lifecycle transition of a server (broker/api/v1 Event).

    Attributes:
        id: the stream id, usable as Last-Event-ID.
        spawn_id: the spawn it belongs to; a server's stream replays the
            events of its earlier spawns too.
        state: the state entered (pending, placing, creating, starting,
            running, stopping, stopped, failed).
        message: the broker's sentence about it.
    """

    id: str
    spawn_id: str
    state: str
    message: str


def server_path(user: str, name: str) -> str:
    """The API path of one server, each name escaped as one path segment."""
    return "/api/v1/users/%s/servers/%s" % (quote(user, safe=""), quote(name, safe=""))


def groups_header(groups: List[str]) -> str:
    """The X-Gpubroker-Groups value for groups: comma-separated.

    Raises ValueError if a group name contains a comma, which the header
    cannot carry; the caller decides what to leave out.
    """
    for g in groups:
        if "," in g:
            raise ValueError("group name %r contains a comma" % g)
    return ",".join(groups)


class BrokerClient:
    """One session with the broker, as an async context manager.

    Args:
        base_url: the broker's base URL (``https://gpubroker.example:8080``);
            the API is under ``/api/v1``.
        token: the JupyterHub service token the broker accepts
            (``gpubroker serve --hub-token-file``), sent as
            ``Authorization: token <token>``.
        ca_bundle: a PEM file of CA certificates for an https broker; ""
            uses the system's.
        connect_timeout: seconds to connect, > 0.
        request_timeout: seconds for a whole request and answer, and the
            longest silence tolerated inside an event stream (the broker
            writes a keepalive every few seconds), > 0.

    Not safe for use from several event loops; safe for concurrent calls
    within one.
    """

    def __init__(
        self,
        base_url: str,
        token: str,
        *,
        ca_bundle: str = "",
        connect_timeout: float = 5.0,
        request_timeout: float = 30.0,
        user_agent: str = "gpubroker-jupyterhub",
    ):
        self.base_url = base_url.rstrip("/")
        self._token = token
        self._ca_bundle = ca_bundle
        self._connect_timeout = connect_timeout
        self._request_timeout = request_timeout
        self._user_agent = user_agent
        self._session: Optional[aiohttp.ClientSession] = None

    async def __aenter__(self) -> "BrokerClient":
        ssl_ctx: Any = None
        if self._ca_bundle:
            ssl_ctx = ssl.create_default_context(cafile=self._ca_bundle)
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(ssl=ssl_ctx),
            headers={
                "Authorization": "token " + self._token,
                "User-Agent": self._user_agent,
                "Accept": "application/json",
            },
        )
        return self

    async def __aexit__(self, *exc: Any) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    def _timeout(self) -> aiohttp.ClientTimeout:
        return aiohttp.ClientTimeout(total=self._request_timeout, connect=self._connect_timeout)

    async def _call(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        headers: Optional[Dict[str, str]] = None,
    ) -> Tuple[int, Any]:
        """Send one request; returns (status, decoded JSON) for 2xx.

        Raises BrokerError for >= 400 and BrokerUnreachable when no answer came.
        """
        assert self._session is not None, "BrokerClient used outside 'async with'"
        url = self.base_url + path
        try:
            async with self._session.request(
                method, url, json=body, headers=headers, timeout=self._timeout()
            ) as resp:
                text = await resp.text()
                if resp.status >= 400:
                    raise _error_from(resp.status, text)
                return resp.status, (json.loads(text) if text.strip() else None)
        except (aiohttp.ClientError, asyncio.TimeoutError, ssl.SSLError, OSError) as e:
            raise BrokerUnreachable(_unreachable(self.base_url, e)) from e
        except ValueError as e:  # a 2xx answer that is not JSON
            raise BrokerError(502, "bad_answer", "gpubroker at %s answered %s %s with something that is not JSON" % (self.base_url, method, path)) from e

    async def profiles(self, groups: List[str]) -> List[Dict[str, Any]]:
        """The profiles the broker offers to a user in groups (GET /api/v1/profiles)."""
        _, out = await self._call("GET", "/api/v1/profiles", headers={HEADER_GROUPS: groups_header(groups)})
        return out or []

    async def create(
        self, user: str, name: str, body: Dict[str, Any], *, key: str, groups: List[str]
    ) -> Tuple[Dict[str, Any], bool]:
        """Create (start) a server; returns (server, created).

        created is False when the broker already had a spawn for this
        idempotency key (200), True for a new spawn (201). body is a
        broker/api/v1 CreateServerRequest.
        """
        status, out = await self._call(
            "PUT",
            server_path(user, name),
            body=body,
            headers={HEADER_IDEMPOTENCY_KEY: key, HEADER_GROUPS: groups_header(groups)},
        )
        return out, status == 201

    async def get(self, user: str, name: str) -> Optional[Dict[str, Any]]:
        """The server, or None if it does not exist (404)."""
        return await self._server_or_none("GET", user, name)

    async def delete(self, user: str, name: str) -> Optional[Dict[str, Any]]:
        """Stop the server (idempotent); returns its record after the call
        (stopping or stopped), or None if it never existed (404)."""
        return await self._server_or_none("DELETE", user, name)

    async def _server_or_none(self, method: str, user: str, name: str) -> Optional[Dict[str, Any]]:
        try:
            _, out = await self._call(method, server_path(user, name))
        except BrokerError as e:
            if e.status == 404:
                return None
            raise
        return out

    async def events(self, user: str, name: str, last_event_id: str = "") -> AsyncIterator[Event]:
        """Follow the server's event stream (server-sent events).

        Yields every state event after last_event_id ("" replays all the
        broker kept, earlier spawns' too). The iteration ends when the broker
        ends the stream (its latest event is stopped or failed). Raises
        BrokerError for an error answer or an ``event: error`` in the
        stream, BrokerUnreachable when the connection fails or stays silent
        longer than request_timeout.
        """
        assert self._session is not None, "BrokerClient used outside 'async with'"
        headers = {"Accept": "text/event-stream"}
        if last_event_id:
            headers[HEADER_LAST_EVENT_ID] = last_event_id
        url = self.base_url + server_path(user, name) + "/events"
        timeout = aiohttp.ClientTimeout(total=None, connect=self._connect_timeout, sock_read=self._request_timeout)
        try:
            async with self._session.get(url, headers=headers, timeout=timeout) as resp:
                if resp.status >= 400:
                    raise _error_from(resp.status, await resp.text())
                parser = _SSEParser()
                async for raw in resp.content:
                    for kind, ev_id, data in parser.feed(raw.decode("utf-8", "replace")):
                        ev = _decode_event(kind, ev_id, data)
                        if ev is not None:
                            yield ev
        except (aiohttp.ClientError, asyncio.TimeoutError, ssl.SSLError, OSError) as e:
            raise BrokerUnreachable(_unreachable(self.base_url, e)) from e


def _unreachable(base: str, e: BaseException) -> str:
    if isinstance(e, asyncio.TimeoutError):
        return "gpubroker at %s did not answer in time" % base
    return "gpubroker at %s cannot be reached: %s" % (base, e or type(e).__name__)


def _error_from(status: int, text: str) -> BrokerError:
    """A BrokerError from an error answer: the broker's {code, message},
    or the start of whatever else came (a proxy's page)."""
    try:
        body = json.loads(text)
        if isinstance(body, dict) and isinstance(body.get("message"), str):
            return BrokerError(status, str(body.get("code") or "http_%d" % status), body["message"])
    except ValueError:
        pass
    snippet = " ".join(text.split())[:200]
    return BrokerError(status, "http_%d" % status, "gpubroker answered HTTP %d%s" % (status, ": " + snippet if snippet else ""))


def _decode_event(kind: str, ev_id: str, data: str) -> Optional[Event]:
    """An Event from one dispatched SSE event; None for kinds we ignore.

    Raises BrokerError for ``event: error`` (its data is a v1 Error).
    """
    if kind == "error":
        try:
            body = json.loads(data)
            code, message = str(body.get("code", "internal")), str(body.get("message", data))
        except (ValueError, AttributeError):
            code, message = "internal", data
        raise BrokerError(_STREAM_ERROR_STATUS.get(code, 500), code, message)
    if kind != "state":
        return None
    try:
        body = json.loads(data)
        return Event(
            id=str(body.get("id") or ev_id),
            spawn_id=str(body["spawnId"]),
            state=str(body["state"]),
            message=str(body.get("message", "")),
        )
    except (ValueError, KeyError, AttributeError, TypeError) as e:
        raise BrokerError(502, "bad_answer", "gpubroker sent an event that is not a server event: %.200s" % data) from e


class _SSEParser:
    """Incremental parser of a text/event-stream body (the WHATWG HTML
    "server-sent events" interpretation rules: fields id, event, data;
    comment lines start with ':'; a blank line dispatches; CR, LF and CRLF
    all end lines)."""

    def __init__(self) -> None:
        self._buf = ""
        self._kind = ""
        self._id = ""
        self._data: List[str] = []

    def feed(self, text: str) -> List[Tuple[str, str, str]]:
        """Consume text; returns the events it completed as (kind, id, data)."""
        self._buf += text
        out = []
        while True:
            cut = _line_end(self._buf)
            if cut is None:
                return out
            line, rest = self._buf[: cut[0]], self._buf[cut[1] :]
            self._buf = rest
            if line == "":
                if self._data:
                    out.append((self._kind or "message", self._id, "\n".join(self._data)))
                self._kind, self._data = "", []
                continue
            if line.startswith(":"):
                continue
            field, _, value = line.partition(":")
            if value.startswith(" "):
                value = value[1:]
            if field == "event":
                self._kind = value
            elif field == "data":
                self._data.append(value)
            elif field == "id" and "\0" not in value:
                self._id = value


def _line_end(buf: str) -> Optional[Tuple[int, int]]:
    """(end of line, start of next) for the first complete line in buf.

    A CR at the very end may be the first half of CRLF, so it waits for
    more input.
    """
    for i, ch in enumerate(buf):
        if ch == "\n":
            return i, i + 1
        if ch == "\r":
            if i + 1 == len(buf):
                return None
            return i, i + 2 if buf[i + 1] == "\n" else i + 1
    return None
