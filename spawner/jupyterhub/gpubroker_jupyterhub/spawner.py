"""GPUBrokerSpawner: JupyterHub starts notebook servers through gpubroker.

The class is a thin client of the broker's REST API: the broker places the
GPU slice, creates the pod, follows it and reclaims it. The hub keeps its
own job (users, OAuth, proxy, the spawn page) and passes the broker what a
pod spawner passes a pod: the single-user command and its environment.

Contract with the hub (JupyterHub 3.0 to 5.x):

- ``start()`` creates the broker server with an idempotency key of its own,
  unique per hub spawn, follows the broker's event stream until the spawn
  runs and returns its URL. A server the broker still has from an earlier
  hub session (the hub died inside ``start()``, so it never saved its state)
  holds OAuth credentials the hub has since revoked: it is stopped and
  created again, never adopted. Refusals (bad profile, quota, capacity)
  raise :class:`BrokerSpawnError` with the broker's status (< 500) and
  words. When ``start()`` is cancelled (JupyterHub 5.1+ on start_timeout,
  or by ``stop()``) it stops what it created, in a task ``stop()`` waits
  for.
- ``poll()``: None while starting or running, 0 when stopped, stopping or
  gone, 1 when failed, None when the broker cannot be asked (unknown is
  not stopped). Polled for a server the hub has a record of but no saved
  spawn (the hub died inside ``start()`` and restarted), it stops what the
  broker runs under that name and answers 0: no pod or slice outlives
  the lost start.
- ``stop()``: idempotent; returns once the broker says stopped.
- ``progress()``: the broker's events of this spawn only, on its own HTTP
  session; never raises.
- ``get_state()`` returns attributes only (the hub calls it on every admin
  GET, even during ``start()``); ``load_state()`` restores them after a hub
  restart, so ``poll()`` finds the server again.
"""

from __future__ import annotations

import asyncio
import unicodedata
import uuid
from typing import Any, Awaitable, Callable, Dict, List, Optional, Tuple, TypeVar

from jupyterhub.spawner import Spawner
from tornado import web
from traitlets import Float, Unicode, default, validate

from . import form
from .client import (
    FAILED,
    RUNNING,
    STOPPED,
    STOPPING,
    TERMINAL,
    BrokerClient,
    BrokerError,
    BrokerUnreachable,
)

T = TypeVar("T")

# States that end start()'s wait, and the progress bar's position at each
# state (the hub adds its own first and last events).
_START_DECISIVE = frozenset({RUNNING, STOPPING, STOPPED, FAILED})
_PROGRESS = {
    "pending": 5,
    "placing": 15,
    "creating": 35,
    "starting": 60,
    RUNNING: 90,
    STOPPING: 100,
    STOPPED: 100,
    FAILED: 100,
}

# Words in an environment variable's name that make it a credential; such
# variables go into the broker's Secret (secretEnv), as the broker itself
# would treat them (broker/internal/servers/env.go).
_SECRET_WORDS = ("TOKEN", "SECRET", "PASSWORD", "KEY", "CREDENTIAL")

# Retries of idempotent calls that got no answer or a 502/503/504: delays in
# seconds before the second and third attempt.
_RETRY_DELAYS = (0.5, 1.0)
_RETRY_STATUS = frozenset({502, 503, 504})


def looks_secret(name: str) -> bool:
    """Whether an environment variable name marks a credential."""
    upper = name.upper()
    return any(w in upper for w in _SECRET_WORDS)


class BrokerSpawnError(web.HTTPError):
    """A spawn gpubroker refused or could not finish, as the hub shows it.

    status_code is the broker's status for refusals (400 invalid options,
    403 quota or a profile not offered, 409 no capacity), so the hub's REST
    API answers 4xx; 5xx when the broker failed or could not be reached.
    ``str()`` and ``jupyterhub_message`` are the broker's sentence, which the
    hub shows on its spawn form ("Spawn failed: ..." on the progress page).
    """

    def __init__(self, status: int, message: str, code: str = ""):
        # Without args, tornado doubles the % in log_message itself.
        super().__init__(status, message)
        self.jupyterhub_message = message
        self.code = code

    def __str__(self) -> str:
        return self.jupyterhub_message


def _refusal(e: BrokerError) -> BrokerSpawnError:
    return BrokerSpawnError(e.status, e.message, e.code)


def validate_server_name(name: str) -> Optional[str]:
    """Why the broker would refuse name as a server name, or None.

    The broker's rule (broker/internal/fleet/names.go, and the API's edge):
    1..255 bytes of UTF-8, no '/', no control or invisible (Unicode Cf)
    characters, no surrounding spaces, not "." or "..".
    """
    if not name:
        return "it is empty"
    if len(name.encode("utf-8", "surrogatepass")) > 255:
        return "it is longer than 255 bytes"
    if name.strip() != name:
        return "it starts or ends with spaces"
    if "/" in name:
        return "it contains '/'"
    if name in (".", ".."):
        return "it is . or .."
    for ch in name:
        cat = unicodedata.category(ch)
        if cat in ("Cc", "Cf", "Cs"):
            return "it contains control or invisible characters"
    return None


class GPUBrokerSpawner(Spawner):
    """Starts each notebook server through gpubroker, with a GPU slice.

    Configure at least ``broker_url`` and ``hub_token_file``; see the
    package README for every setting and a z2jh example.
    """

    broker_url = Unicode(
        "",
        help="""Base URL of gpubroker, for example
        http://gpubroker.gpubroker.svc.cluster.local:8080 (the API is under
        /api/v1). Required.""",
    ).tag(config=True)

    hub_token_file = Unicode(
        "",
        help="""File holding the service token gpubroker accepts from this
        hub (the content of the broker's --hub-token-file; surrounding
        whitespace is ignored). Read at every call, so the token can be
        rotated without restarting the hub. Required.""",
    ).tag(config=True)

    ca_bundle = Unicode(
        "",
        help="""PEM file of CA certificates to verify an https broker_url
        with; empty uses the system's.""",
    ).tag(config=True)

    connect_timeout = Float(
        5.0, help="Seconds to connect to gpubroker, > 0."
    ).tag(config=True)

    request_timeout = Float(
        30.0,
        help="""Seconds for one API call, and the longest silence tolerated
        on the broker's event stream (it sends a keepalive every 3 s), > 0.""",
    ).tag(config=True)

    stop_timeout = Float(
        120.0,
        help="""Seconds stop() waits for gpubroker to report the server
        stopped (the pod gone and the slice freed) before it gives up with an
        error, > 0.""",
    ).tag(config=True)

    default_server_name = Unicode(
        "(default)",
        help="""The broker's name for each user's default server (the hub's
        server ""; the broker's names are never empty). The default contains
        parentheses, which JupyterHub 6's named-server names
        ([a-z0-9-]) cannot; with 3.0 to 5.x a named server of exactly this
        name is refused with a readable message instead of colliding.""",
    ).tag(config=True)

    default_profile = Unicode(
        "",
        help="""Profile for spawns whose user_options name none (REST calls
        without options); empty takes the first profile the broker offers
        the user.""",
    ).tag(config=True)

    @validate("broker_url")
    def _check_broker_url(self, proposal: Dict[str, Any]) -> str:
        url = proposal["value"].strip()
        if url and not (url.startswith("http://") or url.startswith("https://")):
            raise ValueError("GPUBrokerSpawner.broker_url must start with http:// or https://, not %r" % url)
        return url.rstrip("/")

    @validate("connect_timeout", "request_timeout", "stop_timeout")
    def _check_positive(self, proposal: Dict[str, Any]) -> float:
        if not proposal["value"] > 0:
            raise ValueError("GPUBrokerSpawner.%s must be > 0 seconds, not %r" % (proposal["trait"].name, proposal["value"]))
        return proposal["value"]

    @validate("default_server_name")
    def _check_default_name(self, proposal: Dict[str, Any]) -> str:
        why = validate_server_name(proposal["value"])
        if why:
            raise ValueError("GPUBrokerSpawner.default_server_name %r is not a valid gpubroker server name: %s" % (proposal["value"], why))
        return proposal["value"]

    # The notebook listens on all of the pod's addresses, on the broker's
    # notebook port (gpubroker's spawner.DefaultNotebookPort); the hub builds
    # JUPYTERHUB_SERVICE_URL from these.
    @default("ip")
    def _default_ip(self) -> str:
        return "0.0.0.0"

    @default("port")
    def _default_port(self) -> int:
        return 8888

    # Nothing of the hub's own process environment belongs in a pod.
    @default("env_keep")
    def _default_env_keep(self) -> List[str]:
        return []

    @default("options_form")
    def _default_options_form(self) -> Callable[..., Awaitable[str]]:
        return self._profiles_form

    @default("options_from_form")
    def _default_options_from_form(self) -> Callable[..., Dict[str, str]]:
        return form.from_form

    def __init__(self, **kwargs: Any):
        super().__init__(**kwargs)
        # Persisted through get_state/load_state.
        self._broker_server = ""  # the broker's name of this server
        self._broker_spawn_id = ""  # the broker's spawn id of the current start
        self._broker_key = ""  # the idempotency key of the current start
        # This process only.
        self._broker_starting = False  # start() is running
        self._broker_start_task: Optional[asyncio.Task] = None  # the task that runs start()
        self._broker_create_task: Optional[asyncio.Future] = None
        self._broker_cleanup_task: Optional[asyncio.Future] = None
        self._broker_spawn_known: Optional[asyncio.Event] = None

    # --- names, groups, the broker session -------------------------------

    def broker_server_name(self) -> str:
        """The broker's name of this server: the hub's name, or
        default_server_name for the default server "".

        Raises BrokerSpawnError (400) for a named server called exactly
        default_server_name, which would collide with the default server.
        """
        if not self.name:
            return self.default_server_name
        if self.name == self.default_server_name:
            raise BrokerSpawnError(
                400,
                "the server name %r is reserved for your default server; choose another name" % self.name,
                "bad_request",
            )
        return self.name

    def _groups(self) -> List[str]:
        """The user's hub groups, for the broker's profile and quota rules.

        A group name with a comma cannot travel in X-Gpubroker-Groups; it is
        left out (fewer groups can only mean fewer profiles), with a warning.
        """
        out = set()
        for g in getattr(self.user, "groups", None) or []:
            name = getattr(g, "name", g)
            if not isinstance(name, str) or not name:
                continue
            if "," in name:
                self.log.warning("%s: group %r contains a comma; gpubroker is not told about it", self._log_name, name)
                continue
            out.add(name)
        return sorted(out)

    def _hub_token(self) -> str:
        if not self.hub_token_file:
            raise RuntimeError("GPUBrokerSpawner.hub_token_file is not set: it names the file with the token gpubroker accepts from this hub")
        try:
            with open(self.hub_token_file, encoding="utf-8") as f:
                token = f.read().strip()
        except OSError as e:
            raise RuntimeError("GPUBrokerSpawner.hub_token_file %s cannot be read: %s" % (self.hub_token_file, e.strerror or e)) from e
        if not token:
            raise RuntimeError("GPUBrokerSpawner.hub_token_file %s is empty" % self.hub_token_file)
        return token

    def _broker(self) -> BrokerClient:
        """A new broker session (use with ``async with``)."""
        if not self.broker_url:
            raise RuntimeError("GPUBrokerSpawner.broker_url is not set: it is gpubroker's base URL, for example http://gpubroker.gpubroker.svc.cluster.local:8080")
        return BrokerClient(
            self.broker_url,
            self._hub_token(),
            ca_bundle=self.ca_bundle,
            connect_timeout=self.connect_timeout,
            request_timeout=self.request_timeout,
        )

    async def _retry(self, call: Callable[..., Awaitable[T]], *args: Any, **kwargs: Any) -> T:
        """call(*args), again after a short pause when no answer came or the
        broker answered 502/503/504; only for idempotent calls."""
        for delay in _RETRY_DELAYS + (None,):
            try:
                return await call(*args, **kwargs)
            except BrokerUnreachable as e:
                if delay is None:
                    raise
                self.log.warning("%s: %s; trying again in %.1fs", self._log_name, e, delay)
            except BrokerError as e:
                if delay is None or e.status not in _RETRY_STATUS:
                    raise
                self.log.warning("%s: gpubroker answered %d (%s); trying again in %.1fs", self._log_name, e.status, e, delay)
            await asyncio.sleep(delay)
        raise AssertionError("unreachable")

    # --- the options form --------------------------------------------------

    async def _profiles_form(self, spawner: Any = None) -> str:
        """The options form: the profiles the broker offers this user."""
        try:
            async with self._broker() as b:
                profiles = await self._retry(b.profiles, self._groups())
        except BrokerError as e:
            raise BrokerSpawnError(e.status, "gpubroker cannot list your profiles: %s" % e.message, e.code) from e
        except BrokerUnreachable as e:
            raise BrokerSpawnError(503, "gpubroker cannot list your profiles now: %s" % e, "unavailable") from e
        try:
            selected = form.requested_profile(self.user_options) or self.default_profile
        except form.OptionsError:
            selected = self.default_profile
        return form.render(profiles, selected)

    # --- start ---------------------------------------------------------------

    async def start(self) -> str:
        """Create the server at the broker and wait until it runs; returns
        its URL (http://<pod IP>:<port>)."""
        self._broker_start_task = asyncio.current_task()
        self._broker_create_task = None
        self._broker_cleanup_task = None
        self._broker_spawn_id = ""
        self._broker_key = "jupyterhub-" + uuid.uuid4().hex
        self._broker_spawn_known = asyncio.Event()
        self._broker_server = self.broker_server_name()
        if self.internal_ssl:
            raise BrokerSpawnError(500, "JupyterHub.internal_ssl is not supported with gpubroker: its certificates are files on the hub's disk, which a notebook pod cannot read")
        self._broker_starting = True
        try:
            return await self._start()
        except asyncio.CancelledError:
            # Cancelled by the hub (start_timeout, 5.1+) or by stop(): stop
            # what this start created, in a task stop() waits for.
            self._broker_cleanup_task = asyncio.ensure_future(self._abandon())
            raise
        except Exception:
            self._broker_cleanup_task = asyncio.ensure_future(self._abandon())
            await asyncio.wait([self._broker_cleanup_task])
            raise
        finally:
            self._broker_starting = False

    async def _start(self) -> str:
        try:
            return await self._start_steps()
        except BrokerError as e:
            raise _refusal(e) from e
        except BrokerUnreachable as e:
            raise BrokerSpawnError(503, str(e), "unavailable") from e

    async def _start_steps(self) -> str:
        groups = self._groups()
        async with self._broker() as b:
            profile = await self._choose_profile(b, groups)
        server = await self._create(self._create_body(profile), groups)
        self._broker_spawn_id = str(server["spawnId"])
        assert self._broker_spawn_known is not None
        self._broker_spawn_known.set()
        self.log.info("%s: gpubroker spawn %s of server %r (profile %s)", self._log_name, self._broker_spawn_id, self._broker_server, profile)
        async with self._broker() as b:
            cur = await self._follow(b, self._broker_spawn_id, _START_DECISIVE)
        if cur is None or cur.get("spawnId") != self._broker_spawn_id:
            raise BrokerSpawnError(500, "the server was stopped or replaced at gpubroker while it started")
        state, message = cur.get("state"), str(cur.get("message", ""))
        if state == RUNNING:
            url = str(cur.get("url") or "")
            if not url:
                raise BrokerSpawnError(502, "gpubroker reports the server running but gives no address for it")
            return url
        if state == FAILED:
            raise BrokerSpawnError(500, message or "gpubroker could not start the server")
        raise BrokerSpawnError(500, "the server was stopped while it started: %s" % message)

    async def _choose_profile(self, b: BrokerClient, groups: List[str]) -> str:
        try:
            name = form.requested_profile(self.user_options)
        except form.OptionsError as e:
            raise BrokerSpawnError(400, str(e), "bad_request") from e
        if name or self.default_profile:
            return name or self.default_profile
        try:
            profiles = await self._retry(b.profiles, groups)
        except BrokerError as e:
            raise _refusal(e) from e
        except BrokerUnreachable as e:
            raise BrokerSpawnError(503, str(e), "unavailable") from e
        if not profiles:
            raise BrokerSpawnError(
                403,
                "gpubroker offers no profile to %s (groups: %s)" % (self.user.name, ", ".join(groups) or "none"),
                "forbidden",
            )
        return str(profiles[0]["name"])

    def _create_body(self, profile: str) -> Dict[str, Any]:
        """The broker/api/v1 CreateServerRequest of this spawn: the profile,
        the hub's command as args (the image's entrypoint stays), and the
        hub's environment with credentials in secretEnv."""
        plain: Dict[str, str] = {}
        secret: Dict[str, str] = {}
        for name, value in self.get_env().items():
            if value is None:
                continue
            (secret if looks_secret(name) else plain)[name] = str(value)
        body: Dict[str, Any] = {"profile": profile, "args": list(self.cmd) + list(self.get_args())}
        if plain:
            body["env"] = plain
        if secret:
            body["secretEnv"] = secret
        return body

    async def _create(self, body: Dict[str, Any], groups: List[str]) -> Dict[str, Any]:
        """PUT the server with this spawn's key; a live server left at the
        name (409 conflict) is stopped first, once."""
        for attempt in (1, 2):
            # The PUT runs in its own task: if this start is cancelled while
            # it is in flight, _abandon still learns what it created.
            self._broker_create_task = asyncio.ensure_future(self._put(body, groups))
            try:
                server, _ = await asyncio.shield(self._broker_create_task)
                return server
            except BrokerError as e:
                if e.status == 409 and e.code == "conflict" and attempt == 1 and await self._replace_leftover(e):
                    continue
                raise _refusal(e) from e
            except BrokerUnreachable as e:
                raise BrokerSpawnError(503, str(e), "unavailable") from e
        raise AssertionError("unreachable")

    async def _put(self, body: Dict[str, Any], groups: List[str]) -> Tuple[Dict[str, Any], bool]:
        async with self._broker() as b:
            return await self._retry(b.create, self.user.name, self._broker_server, body, key=self._broker_key, groups=groups)

    async def _replace_leftover(self, refusal: BrokerError) -> bool:
        """After a 409 conflict: stop a server the broker still runs under
        this name, which this hub does not know it has (its OAuth token is
        revoked, so it is never adopted). Returns whether the create should
        be tried again: False when the conflict was this create's own
        refusal (the cluster refused the pod), whose failed record carries
        the same message."""
        async with self._broker() as b:
            cur = await self._retry(b.get, self.user.name, self._broker_server)
            if cur is None:
                return True
            if cur.get("state") in TERMINAL:
                return cur.get("message") != refusal.message  # a left-over that ended meanwhile
            self.log.warning(
                "%s: gpubroker still has server %r (spawn %s, %s) from an earlier hub session; stopping it to start afresh",
                self._log_name, self._broker_server, cur.get("spawnId"), cur.get("state"),
            )
            await self._stop_and_wait(b, cur)
            return True

    async def _abandon(self) -> None:
        """After a failed or cancelled start: stop the spawn it created, if
        any (learning the outcome of a PUT still in flight first)."""
        spawn_id = self._broker_spawn_id
        task = self._broker_create_task
        if not spawn_id and task is not None:
            try:
                server, _ = await task
                spawn_id = self._broker_spawn_id = str(server["spawnId"])
            except Exception:
                return  # the PUT created nothing
        if not spawn_id:
            return
        try:
            await self._stop_spawn(spawn_id)
        except Exception as e:
            self.log.error("%s: could not stop gpubroker spawn %s after its start ended: %s", self._log_name, spawn_id, e)

    async def _follow(self, b: BrokerClient, spawn_id: str, decisive: frozenset) -> Optional[Dict[str, Any]]:
        """Wait until spawn_id reaches one of the decisive states.

        Returns the server's record then, the record of another spawn if
        one replaced it, or None if the server is gone. Reads the record
        first (nothing is missed), then follows the event stream,
        reconnecting after its last event id when it breaks.
        """
        last, pause = "", 0.25
        while True:
            cur = await self._retry(b.get, self.user.name, self._broker_server)
            if cur is None or cur.get("spawnId") != spawn_id or cur.get("state") in decisive:
                return cur
            try:
                async for ev in b.events(self.user.name, self._broker_server, last):
                    last, pause = ev.id, 0.25
                    if ev.spawn_id == spawn_id and ev.state in decisive:
                        break
                else:
                    await asyncio.sleep(pause)  # ended without news of this spawn
                    pause = min(pause * 2, 5.0)
            except (BrokerUnreachable, BrokerError) as e:
                self.log.warning("%s: gpubroker's event stream broke (%s); reading again", self._log_name, e)
                await asyncio.sleep(pause)
                pause = min(pause * 2, 5.0)

    # --- stop ------------------------------------------------------------------

    async def stop(self, now: bool = False) -> None:
        """Stop the server and return once gpubroker says it stopped.

        Idempotent: a server already stopped or gone is fine. A start still
        running is cancelled first (it then stops what it created).
        """
        task = self._broker_start_task
        if task is not None and not task.done() and task is not asyncio.current_task():
            task.cancel()
            await asyncio.wait([task])
        if self._broker_cleanup_task is not None:
            await asyncio.wait([self._broker_cleanup_task])
        if not self._broker_server:
            return  # nothing was ever created under this spawner
        await self._stop_spawn(self._broker_spawn_id)

    async def _stop_spawn(self, spawn_id: str) -> None:
        """Stop spawn_id of this server ("" : whatever spawn is there) and
        wait up to stop_timeout; a server now running another spawn is left
        alone."""
        try:
            async with self._broker() as b:
                cur = await self._retry(b.get, self.user.name, self._broker_server)
                if cur is None or (spawn_id and cur.get("spawnId") != spawn_id):
                    return
                await self._stop_and_wait(b, cur)
        except BrokerError as e:
            raise _refusal(e) from e
        except BrokerUnreachable as e:
            raise BrokerSpawnError(503, str(e), "unavailable") from e

    async def _stop_and_wait(self, b: BrokerClient, cur: Dict[str, Any]) -> None:
        sid = cur.get("spawnId")
        if cur.get("state") not in TERMINAL:
            cur = await self._retry(b.delete, self.user.name, self._broker_server)
        if cur is None or cur.get("spawnId") != sid or cur.get("state") in TERMINAL:
            return
        try:
            await asyncio.wait_for(self._follow(b, str(sid), TERMINAL), self.stop_timeout)
        except asyncio.TimeoutError:
            raise BrokerSpawnError(
                504,
                "gpubroker did not stop server %r within %g s; it is still %s" % (self._broker_server, self.stop_timeout, cur.get("state")),
            ) from None

    # --- poll, progress, state -------------------------------------------------

    async def poll(self) -> Optional[int]:
        """None while starting or running; 0 stopped, stopping or gone; 1
        failed. None also when gpubroker cannot be asked: unknown is not
        stopped."""
        cleanup = self._broker_cleanup_task
        if self._broker_starting or (cleanup is not None and not cleanup.done()):
            return None
        if not self._broker_spawn_id:
            if self.server is not None:
                await self._stop_unsaved()
            return 0
        try:
            async with self._broker() as b:
                cur = await b.get(self.user.name, self._broker_server)
        except (BrokerUnreachable, BrokerError, RuntimeError) as e:
            self.log.warning("%s: cannot ask gpubroker about the server (%s); taking it as still running", self._log_name, e)
            return None
        if cur is None or cur.get("spawnId") != self._broker_spawn_id:
            return 0
        state = cur.get("state")
        if state == FAILED:
            return 1
        if state in (STOPPING, STOPPED):
            return 0
        return None

    async def _stop_unsaved(self) -> None:
        """The hub has a record of this server but no saved spawn: the hub
        died inside start() (state reaches its database only after start()
        returns) and now, restarted, polls the record before it drops it.
        What the broker runs under this name came from that lost start,
        with credentials the hub has revoked: stop it, so that no pod or
        slice outlives the hub's record. Never raises (poll() must answer);
        a broker that cannot be asked now leaves the server to the next
        start, which stops it (the 409 path)."""
        try:
            self._broker_server = self.broker_server_name()
            self.log.warning(
                "%s: the hub has no saved state of this server (it stopped inside start()); stopping whatever gpubroker runs as %r",
                self._log_name, self._broker_server,
            )
            await self._stop_spawn("")
        except Exception as e:
            self.log.error("%s: could not stop gpubroker's server %r left by a lost start: %s", self._log_name, self._broker_server, e)

    async def progress(self):  # type: ignore[override]
        """The broker's events of this spawn as the hub's progress events
        ``{"progress": 0..100, "message": <the broker's words>}``.

        Waits for start() to learn the spawn id, then follows the server's
        event stream on its own session, skipping earlier spawns' events,
        until the spawn runs or ends. Never raises: problems are logged.
        """
        try:
            known = self._broker_spawn_known
            if known is None:
                return
            await known.wait()
            spawn_id, pause, last = self._broker_spawn_id, 0.25, ""
            async with self._broker() as b:
                while True:
                    try:
                        async for ev in b.events(self.user.name, self._broker_server, last):
                            last, pause = ev.id, 0.25
                            if ev.spawn_id != spawn_id:
                                continue
                            yield {"progress": _PROGRESS.get(ev.state, 50), "message": ev.message}
                            if ev.state in _START_DECISIVE:
                                return
                        return  # the stream ends only at stopped or failed
                    except (BrokerUnreachable, BrokerError) as e:
                        if isinstance(e, BrokerError) and e.status == 404:
                            return
                        self.log.warning("%s: progress: gpubroker's event stream broke (%s); reading again", self._log_name, e)
                        await asyncio.sleep(pause)
                        pause = min(pause * 2, 5.0)
        except Exception:
            self.log.exception("%s: progress from gpubroker ends here", self._log_name)

    def get_state(self) -> Dict[str, Any]:
        """The hub's saved state: the broker's server name, spawn id and
        idempotency key. Reads attributes only."""
        state = super().get_state()
        if self._broker_spawn_id:
            state["gpubroker"] = {"server": self._broker_server, "spawn_id": self._broker_spawn_id, "spawn_key": self._broker_key}
        return state

    def load_state(self, state: Dict[str, Any]) -> None:
        """Restore what get_state saved (after a hub restart)."""
        super().load_state(state)
        saved = state.get("gpubroker") if isinstance(state, dict) else None
        if isinstance(saved, dict):
            self._broker_server = str(saved.get("server") or "")
            self._broker_spawn_id = str(saved.get("spawn_id") or "")
            self._broker_key = str(saved.get("spawn_key") or "")

    def clear_state(self) -> None:
        """Forget the stopped server."""
        super().clear_state()
        self._broker_server = self._broker_spawn_id = self._broker_key = ""
