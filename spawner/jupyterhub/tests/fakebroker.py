"""An in-process stand-in for gpubroker's REST API, for the spawner's tests.

It is not a table of canned answers: it keeps servers with the broker's
lifecycle (pending → placing → creating → starting → running → stopping →
stopped, failed before running), one event stream per server that keeps the
events of earlier spawns, idempotency keys, per-user server quotas, a GPU
memory pool, the hub-token check and the profiles' group rules, answering
with the broker's status codes, error codes and kinds of sentences
(broker/internal/httpapi/errors.go, broker/internal/servers).

Tests steer it through gates: ``hold(state)`` makes every spawn wait before
entering state until ``release(state)``; ``fail_at(state, message)`` fails
the next spawn there. A create keeps going when its caller hangs up (the
broker finishes creates on a context the caller cannot cancel).
"""

from __future__ import annotations

import asyncio
import itertools
import json
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

from aiohttp import web

ORDER = ["pending", "placing", "creating", "starting", "running", "stopping", "stopped"]
TERMINAL = {"stopped", "failed"}
LIVE_STATES = {"pending", "placing", "creating", "starting", "running", "stopping"}


@dataclass
class Record:
    user: str
    name: str
    profile: str
    spawn_id: str
    key: str
    state: str
    message: str
    memory_mib: int
    url: str = ""

    def wire(self) -> Dict[str, Any]:
        out = {
            "user": self.user,
            "name": self.name,
            "profile": self.profile,
            "spawnId": self.spawn_id,
            "state": self.state,
            "message": self.message,
            "slice": {"memoryMiB": self.memory_mib, "computePercent": 10, "computeLimitPercent": 50},
            "createdAt": "2026-12-01T00:00:00Z",
            "updatedAt": "2026-12-01T00:00:00Z",
        }
        if self.url:
            out["url"] = self.url
        return out


@dataclass
class Create:
    """One create request as the broker received it."""

    user: str
    name: str
    body: Dict[str, Any]
    key: str
    groups: List[str]
    status: int = 0


@dataclass
class Stream:
    events: List[Dict[str, Any]] = field(default_factory=list)
    changed: asyncio.Condition = field(default_factory=asyncio.Condition)


def _error(status: int, code: str, message: str) -> web.Response:
    return web.json_response({"code": code, "message": message}, status=status)


class FakeBroker:
    """The fake. Start with ``await FakeBroker(...).start()``; ``url`` is its
    base URL; ``close()`` stops it."""

    def __init__(
        self,
        token: str,
        profiles: List[Dict[str, Any]],
        *,
        servers_per_user: int = 2,
        gpu_memory_mib: int = 81920,
        keepalive: float = 0.05,
    ):
        self.token = token
        self.profiles = profiles
        self.servers_per_user = servers_per_user
        self.gpu_memory_mib = gpu_memory_mib
        self.keepalive = keepalive
        self.records: Dict[Tuple[str, str], Record] = {}
        self.streams: Dict[Tuple[str, str], Stream] = {}
        self.creates: List[Create] = []
        self.deletes: List[Tuple[str, str]] = []
        self._gates: Dict[str, asyncio.Event] = {}
        self._fail: Dict[str, str] = {}
        self._ids = itertools.count(1)
        self._event_ids = itertools.count(1)
        self._tasks: set = set()
        self._open_streams: set = set()
        self.url = ""
        self._runner: Optional[web.AppRunner] = None
        self._changed = asyncio.Event()

    # --- control ----------------------------------------------------------

    async def start(self) -> "FakeBroker":
        app = web.Application()
        app.router.add_get("/api/v1/profiles", self._profiles)
        app.router.add_put("/api/v1/users/{user}/servers/{name}", self._create)
        app.router.add_get("/api/v1/users/{user}/servers/{name}", self._get)
        app.router.add_delete("/api/v1/users/{user}/servers/{name}", self._delete)
        app.router.add_get("/api/v1/users/{user}/servers/{name}/events", self._events)
        self._runner = web.AppRunner(app, handle_signals=False)
        await self._runner.setup()
        # A short shutdown_timeout: go_away() cuts connections at once.
        self._site = web.TCPSite(self._runner, "127.0.0.1", 0, shutdown_timeout=0.05)
        await self._site.start()
        self._port = self._site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = "http://127.0.0.1:%d" % self._port
        return self

    async def go_away(self) -> None:
        """Stop listening and cut the open streams: the broker is gone
        (a crash, a network partition) until come_back()."""
        self.drop_streams()
        await self._site.stop()

    async def come_back(self) -> None:
        """Listen again on the same port."""
        self._site = web.TCPSite(self._runner, "127.0.0.1", self._port, shutdown_timeout=0.05)
        await self._site.start()

    async def close(self) -> None:
        for t in list(self._tasks):
            t.cancel()
        if self._tasks:
            await asyncio.wait(list(self._tasks))
        if self._runner is not None:
            await self._runner.cleanup()

    def gate(self, state: str) -> asyncio.Event:
        ev = self._gates.get(state)
        if ev is None:
            ev = self._gates[state] = asyncio.Event()
            ev.set()
        return ev

    def hold(self, state: str) -> None:
        """Spawns (and stops, for "stopped") wait before entering state."""
        self.gate(state).clear()

    def release(self, state: str) -> None:
        self.gate(state).set()

    def fail_at(self, state: str, message: str) -> None:
        """The next spawn that would enter state fails there with message."""
        self._fail[state] = message

    def drop_streams(self) -> int:
        """Cut every open event stream mid-way (a broker restart or a proxy
        timeout, as the client sees it); returns how many were cut."""
        n = 0
        for transport in list(self._open_streams):
            transport.abort()
            n += 1
        self._open_streams.clear()
        self._notify()
        return n

    def live(self, user: Optional[str] = None) -> List[Record]:
        return [r for r in self.records.values() if r.state in LIVE_STATES and (user is None or r.user == user)]

    async def wait_for(self, predicate, timeout: float = 10.0) -> None:
        """Wait until predicate() is true, checking again after every change
        of any server; AssertionError after timeout seconds."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            changed = self._changed
            if predicate():
                return
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise AssertionError("condition not met within %ss" % timeout)
            try:
                await asyncio.wait_for(changed.wait(), remaining)
            except asyncio.TimeoutError:
                pass

    def _notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    # --- state machine ----------------------------------------------------------

    def _stream(self, k: Tuple[str, str]) -> Stream:
        s = self.streams.get(k)
        if s is None:
            s = self.streams[k] = Stream()
        return s

    async def _transition(self, rec: Record, to: str, message: str, spawn_id: str, **patch: Any) -> bool:
        """Move rec to state to, if it still holds spawn_id and to comes
        after its state (a late step of an old spawn never resurrects it)."""
        if rec.spawn_id != spawn_id or rec.state in TERMINAL:
            return False
        if to != "failed" and ORDER.index(to) <= ORDER.index(rec.state):
            return False
        rec.state, rec.message = to, message
        for k, v in patch.items():
            setattr(rec, k, v)
        s = self._stream((rec.user, rec.name))
        async with s.changed:
            s.events.append({"id": "%d-0" % next(self._event_ids), "spawnId": spawn_id, "state": to, "message": message, "time": "2026-12-01T00:00:00Z"})
            s.changed.notify_all()
        self._notify()
        return True

    async def _step(self, rec: Record, to: str, message: str, spawn_id: str, **patch: Any) -> bool:
        """One spawn step: wait at the gate, fail there if asked, then move."""
        await self.gate(to).wait()
        if rec.spawn_id != spawn_id or rec.state in ("stopping", "stopped", "failed"):
            return False
        if to in self._fail:
            await self._transition(rec, "failed", self._fail.pop(to), spawn_id)
            return False
        return await self._transition(rec, to, message, spawn_id, **patch)

    async def _spawn_until_starting(self, rec: Record) -> Optional[web.Response]:
        """What a create does before it answers: quota, placement, the pod."""
        sid = rec.spawn_id
        live = [r for r in self.live(rec.user) if r is not rec]
        if len(live) + 1 > self.servers_per_user:
            msg = "user %s quota exceeded: it allows %d servers at once, and %d are in use" % (rec.user, self.servers_per_user, len(live))
            return _error(403, "quota_exceeded", msg)
        if not await self._step(rec, "placing", "looking for a GPU with room for the slice", sid):
            return None
        used = sum(r.memory_mib for r in self.live() if r is not rec)
        free = self.gpu_memory_mib - used
        if rec.memory_mib > free:
            msg = "no GPU has %d MiB free; the largest free block is %d MiB on node gpu-1" % (rec.memory_mib, free)
            return _error(409, "no_capacity", msg)
        if not await self._step(rec, "creating", "placed %d MiB and 10%% compute on GPU GPU-1 (node gpu-1); creating the pod" % rec.memory_mib, sid):
            return None
        await self._step(rec, "starting", "pod created; waiting for it to start", sid)
        return None

    async def _run_when_ready(self, rec: Record) -> None:
        await self._step(rec, "running", "the notebook is running", rec.spawn_id, url="http://10.0.0.%d:8888" % (int(rec.spawn_id[1:]) % 250 + 1))

    async def _finish_stop(self, rec: Record, spawn_id: str) -> None:
        await self.gate("stopped").wait()
        await self._transition(rec, "stopped", "stopped", spawn_id, url="")

    def _bg(self, coro) -> None:
        t = asyncio.ensure_future(coro)
        self._tasks.add(t)
        t.add_done_callback(self._tasks.discard)

    # --- handlers ----------------------------------------------------------

    def _authorized(self, req: web.Request) -> Optional[web.Response]:
        scheme, _, tok = req.headers.get("Authorization", "").partition(" ")
        if scheme.lower() not in ("token", "bearer") or not tok:
            return _error(401, "unauthorized", "sign in, or send a bearer token")
        if tok.strip() != self.token:
            return _error(401, "unauthorized", "the JupyterHub service token is not valid")
        return None

    @staticmethod
    def _groups(req: web.Request) -> List[str]:
        raw = req.headers.get("X-Gpubroker-Groups", "")
        return sorted({g.strip() for g in raw.split(",") if g.strip()})

    def _offered(self, groups: List[str]) -> List[Dict[str, Any]]:
        return [p for p in self.profiles if not p.get("groups") or set(p["groups"]) & set(groups)]

    async def _profiles(self, req: web.Request) -> web.Response:
        bad = self._authorized(req)
        if bad is not None:
            return bad
        return web.json_response(self._offered(self._groups(req)))

    async def _create(self, req: web.Request) -> web.Response:
        bad = self._authorized(req)
        if bad is not None:
            return bad
        user, name = req.match_info["user"], req.match_info["name"]
        groups = self._groups(req)
        try:
            body = await req.json()
        except ValueError:
            return _error(400, "bad_request", "the body is not valid JSON")
        key = req.headers.get("Idempotency-Key", "")
        call = Create(user, name, body, key, groups)
        self.creates.append(call)
        # The work runs in its own task: a caller that hangs up does not
        # stop it (the broker detaches creates from the request).
        t = asyncio.ensure_future(self._do_create(user, name, body, key, groups))
        self._tasks.add(t)
        t.add_done_callback(self._tasks.discard)
        resp = await asyncio.shield(t)
        call.status = resp.status
        return resp

    async def _do_create(self, user: str, name: str, body: Dict[str, Any], key: str, groups: List[str]) -> web.Response:
        unknown = sorted(set(body) - {"profile", "env", "secretEnv", "command", "args"})
        if unknown:
            return _error(400, "bad_request", 'the body has an unknown field "%s"' % unknown[0])
        if not body.get("profile"):
            return _error(400, "bad_request", "profile is required")
        env, secret = body.get("env") or {}, body.get("secretEnv") or {}
        reserved = sorted(n for n in list(env) + list(secret) if n.upper().startswith(("GPUBROKER_", "NVIDIA_")))
        if reserved:
            return _error(400, "bad_request", "environment variable %s is set by gpubroker and cannot be overridden" % reserved[0])
        prof = next((p for p in self.profiles if p["name"] == body["profile"]), None)
        if prof is None:
            return _error(400, "bad_request", "there is no profile %r" % body["profile"])
        if prof not in self._offered(groups):
            return _error(403, "forbidden", "profile %r is not offered to your groups" % body["profile"])
        k = (user, name)
        old = self.records.get(k)
        if old is not None:
            if key and old.key == key:
                return web.json_response(old.wire(), status=200)
            if old.state not in TERMINAL:
                return _error(409, "conflict", "server %r of %s is already %s (spawn %s); stop it first" % (name, user, old.state, old.spawn_id))
        rec = Record(
            user=user, name=name, profile=prof["name"], spawn_id="s%d" % next(self._ids),
            key=key or "auto-%d" % next(self._ids), state="pending", message="",
            memory_mib=prof["slice"]["memoryMiB"],
        )
        self.records[k] = rec
        s = self._stream(k)
        async with s.changed:
            rec.message = "server requested with profile %s" % prof.get("displayName", prof["name"])
            s.events.append({"id": "%d-0" % next(self._event_ids), "spawnId": rec.spawn_id, "state": "pending", "message": rec.message, "time": "2026-12-01T00:00:00Z"})
            s.changed.notify_all()
        self._notify()
        refused = await self._spawn_until_starting(rec)
        if refused is not None:
            # As the broker: a refused start leaves nothing behind; the
            # record it replaced (if any) and its events come back.
            s.events[:] = [e for e in s.events if e["spawnId"] != rec.spawn_id]
            if old is not None:
                self.records[k] = old
            else:
                del self.records[k]
            self._notify()
            return refused
        if rec.state == "failed":
            return _error(409, "conflict", rec.message)
        if rec.state == "starting":
            self._bg(self._run_when_ready(rec))
        return web.json_response(rec.wire(), status=201)

    async def _get(self, req: web.Request) -> web.Response:
        bad = self._authorized(req)
        if bad is not None:
            return bad
        rec = self.records.get((req.match_info["user"], req.match_info["name"]))
        if rec is None:
            return _error(404, "not_found", "user %r has no server named %r" % (req.match_info["user"], req.match_info["name"]))
        return web.json_response(rec.wire())

    async def _delete(self, req: web.Request) -> web.Response:
        bad = self._authorized(req)
        if bad is not None:
            return bad
        k = (req.match_info["user"], req.match_info["name"])
        rec = self.records.get(k)
        if rec is None:
            return _error(404, "not_found", "user %r has no server named %r" % k)
        self.deletes.append(k)
        if rec.state not in TERMINAL and rec.state != "stopping":
            await self._transition(rec, "stopping", "stopping: deleting the pod", rec.spawn_id)
            self._bg(self._finish_stop(rec, rec.spawn_id))
        return web.json_response(rec.wire(), status=202)

    async def _events(self, req: web.Request) -> web.StreamResponse:
        bad = self._authorized(req)
        if bad is not None:
            return bad
        k = (req.match_info["user"], req.match_info["name"])
        if k not in self.records:
            return _error(404, "not_found", "user %r has no server named %r" % k)
        after = req.headers.get("Last-Event-ID", "")
        s = self._stream(k)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await resp.prepare(req)
        transport = req.transport
        self._open_streams.add(transport)
        self._notify()
        try:
            pos = 0
            if after:
                ids = [e["id"] for e in s.events]
                pos = ids.index(after) + 1 if after in ids else 0
            while True:
                while pos < len(s.events):
                    ev = s.events[pos]
                    pos += 1
                    await resp.write(("id: %s\nevent: state\ndata: %s\n\n" % (ev["id"], json.dumps(ev))).encode())
                if s.events and s.events[-1]["state"] in TERMINAL:
                    break
                async with s.changed:
                    try:
                        await asyncio.wait_for(s.changed.wait_for(lambda: len(s.events) > pos), self.keepalive)
                    except asyncio.TimeoutError:
                        await resp.write(b": keepalive\n\n")
        except (ConnectionResetError, asyncio.CancelledError):
            return resp  # the client went away
        finally:
            self._open_streams.discard(transport)
            self._notify()
        await resp.write_eof()
        return resp
