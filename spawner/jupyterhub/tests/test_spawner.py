"""GPUBrokerSpawner against a broker.

Tests marked ``contract`` use the ``broker`` fixture and run against the
fake here and against a real gpubroker in the e2e suite; the others steer
the fake (gates, failures, cut streams) and run here only.
"""

from __future__ import annotations

import asyncio
import logging

import pytest

from gpubroker_jupyterhub import BrokerSpawnError, GPUBrokerSpawner
from gpubroker_jupyterhub.client import BrokerClient

from conftest import HUB_TOKEN

contract = pytest.mark.contract


async def broker_server(broker, user, name):
    """The broker's record of a server, or None (asked as the hub)."""
    async with BrokerClient(broker.url, HUB_TOKEN if broker.fake else open(broker.token_file).read().strip()) as b:
        return await b.get(user, name)


async def collect(agen, into):
    async for ev in agen:
        into.append(ev)


def small(make_spawner, url, user, **kw):
    """A spawner whose user chose the profile "small"."""
    sp = make_spawner(url, user, **kw)
    sp.user_options = {"profile": "small"}
    return sp


async def start_waiting_for_running(fake, sp):
    """Start sp with the fake holding spawns before running; returns the
    start task once start() follows the event stream."""
    fake.hold("running")
    start = asyncio.ensure_future(sp.start())
    await fake.wait_for(lambda: fake._open_streams)
    return start


async def until(predicate, timeout=10.0):
    """Wait for predicate() on a deadline, yielding to the loop between checks."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not predicate():
        if loop.time() > deadline:
            raise AssertionError("condition not met within %ss" % timeout)
        await asyncio.sleep(0.005)


# --- contract: fake and real ---------------------------------------------------


@contract
async def test_start_runs_stop_stops(broker, make_spawner, user_name):
    user = user_name("alice")
    sp = small(make_spawner, broker.url, user)
    url = await sp.start()
    assert url.startswith("http://") and url.endswith(":8888"), url
    assert await sp.poll() is None
    state = sp.get_state()["gpubroker"]
    assert state["server"] == "(default)" and state["spawn_id"]
    rec = await broker_server(broker, user, "(default)")
    assert (rec["state"], rec["spawnId"], rec["profile"]) == ("running", state["spawn_id"], "small")

    await sp.stop()
    rec = await broker_server(broker, user, "(default)")
    assert rec["state"] == "stopped"
    assert await sp.poll() == 0
    sp.clear_state()
    assert "gpubroker" not in sp.get_state()
    await sp.stop()  # idempotent, also after the hub cleared the state


@contract
async def test_stop_is_idempotent_and_waits(broker, make_spawner, user_name):
    user = user_name("bo")
    sp = make_spawner(broker.url, user, name="nb")
    await sp.stop()  # never started: nothing to do
    sp.user_options = {"profile": "small"}
    await sp.start()
    await sp.stop()
    await sp.stop()
    assert (await broker_server(broker, user, "nb"))["state"] == "stopped"


@contract
async def test_named_and_default_servers_do_not_collide(broker, make_spawner, user_name):
    user = user_name("carla")
    default = make_spawner(broker.url, user)
    named = make_spawner(broker.url, user, name="default")  # the hub's name "default" is not the default server
    for sp in (default, named):
        sp.user_options = {"profile": "small"}
        await sp.start()
    assert (await broker_server(broker, user, "(default)"))["state"] == "running"
    assert (await broker_server(broker, user, "default"))["state"] == "running"

    reserved = make_spawner(broker.url, user, name="(default)")
    with pytest.raises(BrokerSpawnError) as e:
        await reserved.start()
    assert e.value.status_code == 400
    assert str(e.value) == "the server name '(default)' is reserved for your default server; choose another name"
    assert await reserved.poll() == 0
    for sp in (default, named):
        await sp.stop()


@contract
async def test_quota_refusal_is_a_clean_user_error(broker, make_spawner, user_name):
    user = user_name("dan")
    running = []
    for name in ("a", "b"):
        sp = make_spawner(broker.url, user, name=name)
        sp.user_options = {"profile": "small"}
        await sp.start()
        running.append(sp)
    third = small(make_spawner, broker.url, user, name="c")
    with pytest.raises(BrokerSpawnError) as e:
        await third.start()
    assert e.value.status_code == 403
    assert "quota exceeded: it allows 2 servers at once, and 2 are in use" in str(e.value)
    assert e.value.jupyterhub_message == str(e.value)
    assert await third.poll() == 0  # nothing half-made for the hub to stop
    rec = await broker_server(broker, user, "c")
    assert rec is None  # a refused start leaves no server
    for sp in running:
        await sp.stop()


@contract
async def test_capacity_refusal_names_the_free_memory(broker, make_spawner, user_name):
    # One GPU of 81559 MiB holds three medium slices (24576 MiB each).
    held = []
    for user, name in ((user_name("eve"), "a"), (user_name("eve"), "b"), (user_name("fay"), "a")):
        sp = make_spawner(broker.url, user, name=name)
        sp.user_options = {"profile": "medium"}
        await sp.start()
        held.append(sp)
    fourth = make_spawner(broker.url, user_name("fay"), name="b")
    fourth.user_options = {"profile": "medium"}
    with pytest.raises(BrokerSpawnError) as e:
        await fourth.start()
    assert e.value.status_code == 409
    assert str(e.value).startswith("no GPU has 24576 MiB free")
    for sp in held:
        await sp.stop()


@contract
async def test_unknown_profile_is_refused_in_the_brokers_words(broker, make_spawner, user_name):
    sp = make_spawner(broker.url, user_name("gus"))
    sp.user_options = {"profile": "huge"}
    with pytest.raises(BrokerSpawnError) as e:
        await sp.start()
    assert e.value.status_code == 400
    assert "there is no profile" in str(e.value) and "huge" in str(e.value)


@contract
async def test_leftover_server_of_an_earlier_hub_session_is_stopped_and_recreated(broker, make_spawner, user_name):
    user = user_name("hana")
    old = small(make_spawner, broker.url, user)
    await old.start()
    old_spawn = old.get_state()["gpubroker"]["spawn_id"]

    # The hub died inside start(): it never saved the state, and its next
    # spawner knows nothing of the running server (whose token is revoked).
    fresh = small(make_spawner, broker.url, user)
    await fresh.start()
    new_spawn = fresh.get_state()["gpubroker"]["spawn_id"]
    assert new_spawn != old_spawn
    rec = await broker_server(broker, user, "(default)")
    assert (rec["spawnId"], rec["state"]) == (new_spawn, "running")
    assert await old.poll() == 0  # the old spawn is gone
    await fresh.stop()


@contract
async def test_a_hub_restarted_after_dying_inside_start_stops_the_lost_spawn(broker, make_spawner, user_name):
    user = user_name("hugo")
    lost = small(make_spawner, broker.url, user)
    await lost.start()  # as far as the broker goes; the hub dies before saving

    # The restarted hub has the server's record, no state, and polls it.
    restarted = make_spawner(broker.url, user)
    restarted.load_state({})
    assert await restarted.poll() == 0
    rec = await broker_server(broker, user, "(default)")
    assert rec["state"] == "stopped"
    assert await restarted.poll() == 0  # nothing left: a no-op

    # Without a record of the server (never started), poll asks nothing.
    never = make_spawner(broker.url, user_name("ines"))
    never.orm_spawner.server = None
    assert await never.poll() == 0


@contract
async def test_load_state_after_a_hub_restart_finds_the_server(broker, make_spawner, user_name):
    user = user_name("ivan")
    first = small(make_spawner, broker.url, user, name="lab")
    await first.start()
    saved = first.get_state()

    restarted = make_spawner(broker.url, user, name="lab")
    restarted.load_state(saved)
    assert await restarted.poll() is None
    assert restarted.get_state() == saved
    await restarted.stop()
    assert await restarted.poll() == 0
    assert (await broker_server(broker, user, "lab"))["state"] == "stopped"


@contract
async def test_progress_relays_only_this_spawns_events(broker, make_spawner, user_name):
    user = user_name("jo")
    earlier = small(make_spawner, broker.url, user)
    await earlier.start()
    await earlier.stop()  # its events stay in the server's stream

    sp = small(make_spawner, broker.url, user)
    start = asyncio.ensure_future(sp.start())
    events = []
    relay = asyncio.ensure_future(collect(sp.progress(), events))
    await start
    await asyncio.wait_for(relay, 10)
    messages = [e["message"] for e in events]
    assert messages, "no progress at all"
    assert not any("stop" in m for m in messages), messages  # none of the earlier spawn's stop
    assert messages[0].startswith("server requested with profile")
    assert [e["progress"] for e in events] == sorted(e["progress"] for e in events)
    assert all(0 <= e["progress"] <= 100 for e in events)
    assert messages.count(messages[0]) == 1  # not the earlier spawn's request again
    await sp.stop()


@contract
async def test_options_form_lists_the_users_profiles(broker, make_spawner, user_name):
    sp = make_spawner(broker.url, user_name("kim"))
    html = await sp.get_options_form()
    assert 'value="small"' in html and 'value="medium"' in html
    assert "8 GiB GPU memory · 10 % of the GPU&#x27;s compute (bursts to 50 %) · 1 CPU · 1Gi memory" in html
    assert html.count(" checked") == 1
    assert sp.options_from_form({"profile": ["medium"]}) == {"profile": "medium"}
    assert sp.options_from_form({}) == {}


# --- the fake only: steering, failures, cancellation ------------------------


async def test_create_request_carries_command_env_and_secrets(fake, make_spawner):
    sp = make_spawner(fake.url, "alice", groups=["ml", "everyone"], args=["--debug"], environment={"EXTRA": "1"})
    sp.user_options = {"profile": "ml-large"}
    await sp.start()
    (call,) = fake.creates
    assert call.key.startswith("jupyterhub-") and len(call.key) > 20
    assert call.groups == ["everyone", "ml"]
    assert call.body["profile"] == "ml-large"
    assert call.body["args"] == ["jupyterhub-singleuser", "--debug"]
    assert "command" not in call.body  # the image's entrypoint stays
    secret, env = call.body["secretEnv"], call.body["env"]
    assert secret == {"JUPYTERHUB_API_TOKEN": sp.api_token, "JPY_API_TOKEN": sp.api_token}
    assert not any(sp.api_token in v for v in env.values())
    assert env["JUPYTERHUB_USER"] == "alice" and env["EXTRA"] == "1"
    assert env["JUPYTERHUB_SERVICE_URL"] == "http://0.0.0.0:8888/user/alice/"
    assert env["JUPYTERHUB_SERVICE_PREFIX"] == "/user/alice/"
    assert "PATH" not in env  # env_keep is empty: nothing of the hub's own environment
    await sp.stop()


async def test_each_spawn_has_its_own_idempotency_key(fake, make_spawner):
    sp = small(make_spawner, fake.url, "alice")
    await sp.start()
    await sp.stop()
    sp.clear_state()
    await sp.start()
    await sp.stop()
    keys = [c.key for c in fake.creates]
    assert len(keys) == 2 and keys[0] != keys[1]
    assert [c.status for c in fake.creates] == [201, 201]


async def test_profile_comes_from_the_form_or_the_default(fake, make_spawner):
    sp = make_spawner(fake.url, "alice")
    sp.user_options = {"profile": ["medium"]}  # raw form data passed through
    await sp.start()
    await sp.stop()
    sp.clear_state()
    sp.user_options = {"unrelated": "REST callers may send anything"}
    await sp.start()
    await sp.stop()
    other = make_spawner(fake.url, "bob", default_profile="medium")
    await other.start()
    await other.stop()
    assert [c.body["profile"] for c in fake.creates] == ["medium", "small", "medium"]


async def test_user_options_that_name_no_profile_are_refused(fake, make_spawner):
    sp = make_spawner(fake.url, "alice")
    sp.user_options = {"profile": {"name": "small"}}
    with pytest.raises(BrokerSpawnError) as e:
        await sp.start()
    assert (e.value.status_code, str(e.value)) == (400, "user_options 'profile' must name one profile as a string, not dict")
    assert fake.creates == []


async def test_profile_not_offered_to_the_users_groups(fake, make_spawner):
    sp = make_spawner(fake.url, "alice", groups=["physics"])
    sp.user_options = {"profile": "ml-large"}
    with pytest.raises(BrokerSpawnError) as e:
        await sp.start()
    assert (e.value.status_code, str(e.value)) == (403, "profile 'ml-large' is not offered to your groups")
    assert 'value="ml-large"' not in await sp.get_options_form()
    member = make_spawner(fake.url, "bob", groups=["ml"])
    html = await member.get_options_form()
    assert 'value="ml-large"' in html
    assert "ML &lt;large&gt;" in html and "for the ML team &amp; friends" in html  # escaped
    assert "<large>" not in html


async def test_group_names_with_commas_are_left_out(fake, make_spawner, caplog):
    sp = small(make_spawner, fake.url, "alice", groups=["a,b", "ml"])
    with caplog.at_level(logging.WARNING):
        await sp.start()
    assert fake.creates[0].groups == ["ml"]
    assert "group 'a,b' contains a comma" in caplog.text
    await sp.stop()


async def test_the_form_remembers_the_last_profile(fake, make_spawner):
    sp = make_spawner(fake.url, "alice")
    sp.user_options = {"profile": "medium"}
    html = await sp.get_options_form()
    assert 'value="medium" checked' in html and html.count(" checked") == 1


async def test_a_reserved_env_name_is_refused_with_the_brokers_reason(fake, make_spawner):
    sp = small(make_spawner, fake.url, "alice", environment={"NVIDIA_VISIBLE_DEVICES": "all"})
    with pytest.raises(BrokerSpawnError) as e:
        await sp.start()
    assert (e.value.status_code, str(e.value)) == (400, "environment variable NVIDIA_VISIBLE_DEVICES is set by gpubroker and cannot be overridden")


async def test_a_failed_spawn_fails_start_with_the_brokers_message(fake, make_spawner):
    fake.fail_at("running", "the notebook keeps crashing (CrashLoopBackOff): exit code 1")
    sp = small(make_spawner, fake.url, "alice")
    with pytest.raises(BrokerSpawnError) as e:
        await sp.start()
    assert e.value.status_code == 500
    assert e.value.jupyterhub_message == "the notebook keeps crashing (CrashLoopBackOff): exit code 1"
    assert await sp.poll() == 1
    assert fake.live() == []


async def test_a_pod_refused_by_the_cluster_is_a_conflict_not_a_leftover(fake, make_spawner):
    fake.fail_at("creating", "the cluster refused the notebook pod: exceeded quota: compute-resources")
    sp = small(make_spawner, fake.url, "alice")
    with pytest.raises(BrokerSpawnError) as e:
        await sp.start()
    assert (e.value.status_code, str(e.value)) == (409, "the cluster refused the notebook pod: exceeded quota: compute-resources")
    assert fake.deletes == []  # a failed record is not a left-over to stop
    assert len(fake.creates) == 1


async def test_leftover_still_stopping_is_waited_for(fake, make_spawner):
    old = small(make_spawner, fake.url, "alice")
    await old.start()
    fake.hold("stopped")  # the old pod takes its time to go
    fresh = small(make_spawner, fake.url, "alice")
    start = asyncio.ensure_future(fresh.start())
    await fake.wait_for(lambda: fake.records[("alice", "(default)")].state == "stopping")
    assert not start.done()
    assert await fresh.poll() is None  # starting
    fake.release("stopped")
    await start
    assert [c.status for c in fake.creates] == [201, 409, 201]
    assert fake.creates[1].key == fake.creates[2].key  # the retry of this spawn's own create
    await fresh.stop()


async def test_start_follows_the_stream_across_a_cut(fake, make_spawner):
    sp = small(make_spawner, fake.url, "alice")
    start = await start_waiting_for_running(fake, sp)
    assert fake.drop_streams() == 1
    await fake.wait_for(lambda: fake._open_streams)  # reconnected
    fake.release("running")
    assert (await start).endswith(":8888")
    await sp.stop()


async def test_get_state_is_cheap_and_side_effect_free_during_start(fake, make_spawner):
    sp = small(make_spawner, fake.url, "alice")
    start = await start_waiting_for_running(fake, sp)
    before = (len(fake.creates), len(fake.deletes))
    for _ in range(3):
        state = sp.get_state()
    assert state["gpubroker"]["spawn_id"] == fake.records[("alice", "(default)")].spawn_id
    assert (len(fake.creates), len(fake.deletes)) == before
    fake.release("running")
    await start
    await sp.stop()


async def test_cancel_start_while_the_create_is_in_flight_stops_what_it_made(fake, make_spawner):
    fake.hold("creating")  # the broker is still placing when the hub gives up
    sp = small(make_spawner, fake.url, "alice")
    start = asyncio.ensure_future(sp.start())
    await fake.wait_for(lambda: ("alice", "(default)") in fake.records)
    start.cancel()
    with pytest.raises(asyncio.CancelledError):
        await start
    # JupyterHub then stops the server: poll() must say "running" so that
    # stop() is called, and stop() waits for the cleanup.
    assert await sp.poll() is None
    stop = asyncio.ensure_future(sp.stop())
    fake.release("creating")  # the broker finishes the create it had begun
    await stop
    assert fake.live() == []
    assert fake.records[("alice", "(default)")].state == "stopped"
    assert await sp.poll() == 0


async def test_cancel_start_while_waiting_for_running(fake, make_spawner):
    sp = small(make_spawner, fake.url, "alice")
    start = await start_waiting_for_running(fake, sp)
    start.cancel()
    with pytest.raises(asyncio.CancelledError):
        await start
    await sp.stop()
    assert fake.live() == []
    assert fake.deletes == [("alice", "(default)")]


async def test_stop_during_start_cancels_it(fake, make_spawner):
    # JupyterHub 3.0-5.0 do not cancel start() on start_timeout; they call
    # poll() and stop() while it still runs.
    sp = small(make_spawner, fake.url, "alice")
    start = await start_waiting_for_running(fake, sp)
    assert await sp.poll() is None
    await sp.stop()
    assert start.cancelled()
    assert fake.live() == []


async def test_progress_can_be_cancelled_and_closes_its_stream(fake, make_spawner):
    fake.hold("running")
    sp = small(make_spawner, fake.url, "alice")
    start = asyncio.ensure_future(sp.start())
    events = []
    relay = asyncio.ensure_future(collect(sp.progress(), events))
    await until(lambda: len(events) >= 4)  # pending, placing, creating, starting
    await fake.wait_for(lambda: len(fake._open_streams) == 2)  # start's and progress's own
    relay.cancel()
    with pytest.raises(asyncio.CancelledError):
        await relay
    await fake.wait_for(lambda: len(fake._open_streams) == 1)
    fake.release("running")
    await start
    await sp.stop()


async def test_progress_waits_for_the_spawn_and_survives_a_cut(fake, make_spawner):
    fake.hold("placing")
    fake.hold("running")
    sp = small(make_spawner, fake.url, "alice")
    start = asyncio.ensure_future(sp.start())
    events = []
    relay = asyncio.ensure_future(collect(sp.progress(), events))
    await fake.wait_for(lambda: ("alice", "(default)") in fake.records)
    fake.release("placing")
    await until(lambda: len(events) >= 4)
    fake.drop_streams()
    fake.release("running")
    await start
    await asyncio.wait_for(relay, 10)
    states = [e["progress"] for e in events]
    assert states == [5, 15, 35, 60, 90], events
    assert events[-1]["message"] == "the notebook is running"
    await sp.stop()


async def test_progress_never_raises_when_the_broker_goes_away(fake, make_spawner, closed_port_url, caplog):
    sp = small(make_spawner, fake.url, "alice")
    fake.hold("running")
    start = asyncio.ensure_future(sp.start())
    await fake.wait_for(lambda: fake._open_streams)
    sp.broker_url = closed_port_url  # from now on nothing answers
    events = []
    with caplog.at_level(logging.WARNING):
        relay = asyncio.ensure_future(collect(sp.progress(), events))
        await until(lambda: caplog.text.count("progress: gpubroker's event stream broke") >= 2)
    assert not relay.done()  # still trying, not raising
    relay.cancel()
    with pytest.raises(asyncio.CancelledError):
        await relay
    assert events == []
    sp.broker_url = fake.url
    fake.release("running")
    await start
    await sp.stop()


async def test_progress_of_a_broken_configuration_ends_quietly(fake, make_spawner, caplog, tmp_path):
    sp = small(make_spawner, fake.url, "alice")
    await sp.start()
    sp.hub_token_file = str(tmp_path / "missing")
    events = []
    with caplog.at_level(logging.ERROR):
        await asyncio.wait_for(collect(sp.progress(), events), 10)
    assert events == [] and "progress from gpubroker ends here" in caplog.text


async def test_unreachable_broker(make_spawner, closed_port_url):
    sp = small(make_spawner, closed_port_url, "alice")
    with pytest.raises(BrokerSpawnError) as e:
        await sp.start()
    assert e.value.status_code == 503
    assert str(e.value).startswith("gpubroker at %s cannot be reached" % closed_port_url)
    with pytest.raises(BrokerSpawnError) as e:
        await sp.get_options_form()
    assert e.value.status_code == 503 and "cannot list your profiles now" in str(e.value)


async def test_poll_is_unknown_not_stopped_when_the_broker_is_unreachable(fake, make_spawner, closed_port_url):
    sp = small(make_spawner, fake.url, "alice")
    await sp.start()
    sp.broker_url = closed_port_url
    assert await sp.poll() is None
    with pytest.raises(BrokerSpawnError) as e:
        await sp.stop()
    assert e.value.status_code == 503 or "cannot be reached" in str(e.value)
    sp.broker_url = fake.url
    await sp.stop()


async def test_poll_maps_the_brokers_states(fake, make_spawner):
    sp = small(make_spawner, fake.url, "alice")
    await sp.start()
    assert await sp.poll() is None
    fake.hold("stopped")
    async with BrokerClient(fake.url, HUB_TOKEN) as b:
        await b.delete("alice", "(default)")  # the broker's reclaimer stops it
    assert await sp.poll() == 0  # stopping counts as stopped for the hub
    fake.release("stopped")
    await fake.wait_for(lambda: fake.live() == [])
    assert await sp.poll() == 0
    await sp.stop()


async def test_a_wrong_hub_token_reads_well(fake, make_spawner, tmp_path):
    bad = tmp_path / "bad-token"
    bad.write_text("not-the-token")
    sp = small(make_spawner, fake.url, "alice", hub_token_file=str(bad))
    with pytest.raises(BrokerSpawnError) as e:
        await sp.start()
    assert (e.value.status_code, str(e.value)) == (401, "the JupyterHub service token is not valid")


async def test_missing_configuration_says_what_to_set(make_spawner, tmp_path):
    sp = make_spawner("", "alice")
    with pytest.raises(RuntimeError, match="broker_url is not set"):
        await sp.start()
    sp = make_spawner("http://127.0.0.1:1", "alice", hub_token_file=str(tmp_path / "none"))
    with pytest.raises(RuntimeError, match="hub_token_file .* cannot be read"):
        await sp.start()
    with pytest.raises(Exception, match="must start with http"):
        make_spawner("gpubroker:8080", "alice")
    with pytest.raises(Exception, match="not a valid gpubroker server name: it contains '/'"):
        make_spawner("http://x", "alice", default_server_name="a/b")
    with pytest.raises(Exception, match="must be > 0 seconds"):
        make_spawner("http://x", "alice", stop_timeout=0)


async def test_stop_gives_up_after_stop_timeout(fake, make_spawner):
    sp = small(make_spawner, fake.url, "alice", stop_timeout=0.2)
    await sp.start()
    fake.hold("stopped")
    with pytest.raises(BrokerSpawnError) as e:
        await sp.stop()
    assert "did not stop server '(default)' within 0.2 s" in str(e.value)
    fake.release("stopped")
    await sp.stop()
    assert fake.live() == []


def test_internal_ssl_is_refused(make_spawner):
    sp = make_spawner("http://x", "alice")
    sp.internal_ssl = True
    with pytest.raises(BrokerSpawnError, match="internal_ssl is not supported"):
        asyncio.run(sp.start())


def test_percent_in_messages_survives_tornado_formatting():
    e = BrokerSpawnError(409, "no GPU has room for 20% compute")
    assert str(e) == "no GPU has room for 20% compute"
    assert e.log_message % e.args == "no GPU has room for 20% compute"


def test_entry_point_class_is_a_spawner():
    from jupyterhub.spawner import Spawner

    assert issubclass(GPUBrokerSpawner, Spawner)


async def test_broker_gone_while_start_follows_the_spawn(fake, make_spawner):
    sp = small(make_spawner, fake.url, "alice")
    start = await start_waiting_for_running(fake, sp)
    await fake.go_away()
    with pytest.raises(BrokerSpawnError) as e:
        await start
    assert e.value.status_code == 503 and "cannot be reached" in str(e.value)
    assert await sp.poll() is None  # unknown, not stopped: the hub calls stop()
    await fake.come_back()
    fake.release("running")
    await sp.stop()
    assert fake.live() == []
