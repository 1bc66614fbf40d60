"""Fixtures: a broker (the fake, or a real gpubroker when GPUBROKER_TEST_URL
is set) and spawners built the way the hub builds them.

Real mode (the e2e suite, e2e/hubspawner_test.go): GPUBROKER_TEST_URL is
the broker's base URL and GPUBROKER_TEST_HUB_TOKEN_FILE the file with the
hub token it accepts; its catalog is e2e's testProfiles (small: 8192 MiB,
medium: 24576 MiB, 2 servers per user) on one 81559 MiB GPU, which the
fake copies. Run only the tests marked ``contract`` then.
"""

from __future__ import annotations

import faulthandler
import os
import sys
import uuid
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, Callable, List, Optional

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from jupyterhub import orm  # noqa: E402
from jupyterhub.objects import Hub  # noqa: E402

from fakebroker import FakeBroker  # noqa: E402
from gpubroker_jupyterhub import GPUBrokerSpawner  # noqa: E402
from gpubroker_jupyterhub import spawner as spawner_module  # noqa: E402

HUB_TOKEN = "hub-token-for-tests"

# The e2e suite's catalog (e2e/env_test.go testProfiles), plus one profile
# offered only to the group "ml", which the real catalog lacks.
PROFILES = [
    {"name": "small", "displayName": "Small", "image": "example.invalid/notebook:1", "cpu": "1", "memory": "1Gi",
     "slice": {"memoryMiB": 8192, "computePercent": 10, "computeLimitPercent": 50}},
    {"name": "medium", "displayName": "Medium", "image": "example.invalid/notebook:1", "cpu": "2", "memory": "2Gi",
     "slice": {"memoryMiB": 24576, "computePercent": 25, "computeLimitPercent": 75}},
    {"name": "ml-large", "displayName": "ML <large>", "description": "for the ML team & friends", "image": "example.invalid/notebook:1",
     "cpu": "4", "memory": "8Gi", "groups": ["ml"],
     "slice": {"memoryMiB": 40960, "computePercent": 50, "computeLimitPercent": 100}},
]
GPU_MEMORY_MIB = 81559


@dataclass
class BrokerUnderTest:
    url: str
    token_file: str
    fake: Optional[FakeBroker]  # None against a real broker


def real_broker() -> Optional[BrokerUnderTest]:
    url = os.environ.get("GPUBROKER_TEST_URL", "")
    if not url:
        return None
    return BrokerUnderTest(url=url, token_file=os.environ["GPUBROKER_TEST_HUB_TOKEN_FILE"], fake=None)


@pytest.fixture(autouse=True)
def hang_guard():
    """A test still running after 60 s prints every thread's stack and ends
    the run, so a hang names itself instead of running into Go's timeout."""
    faulthandler.dump_traceback_later(60, exit=True)
    yield
    faulthandler.cancel_dump_traceback_later()


@pytest.fixture(autouse=True)
def quick_retries(monkeypatch):
    """Retries of unanswered calls pause 10 ms instead of 0.5 s and 1 s."""
    monkeypatch.setattr(spawner_module, "_RETRY_DELAYS", (0.01, 0.01))


@pytest.fixture
def token_file(tmp_path) -> str:
    """The hub token file: the real broker's in real mode."""
    real = real_broker()
    if real is not None:
        return real.token_file
    p = tmp_path / "hub-token"
    p.write_text(HUB_TOKEN + "\n")
    return str(p)


@pytest.fixture
async def fake(token_file) -> FakeBroker:
    f = await FakeBroker(HUB_TOKEN, PROFILES, servers_per_user=2, gpu_memory_mib=GPU_MEMORY_MIB).start()
    f.token_file = token_file  # type: ignore[attr-defined]
    yield f
    await f.close()


@pytest.fixture
async def broker(token_file) -> BrokerUnderTest:
    """The broker of a contract test: real in real mode, else a fresh fake."""
    real = real_broker()
    if real is not None:
        yield real
        return
    f = await FakeBroker(HUB_TOKEN, PROFILES, servers_per_user=2, gpu_memory_mib=GPU_MEMORY_MIB).start()
    yield BrokerUnderTest(url=f.url, token_file=token_file, fake=f)
    await f.close()


@pytest.fixture
def user_name() -> Callable[[str], str]:
    """A user name unique to this test (a real broker is shared by all)."""
    suffix = uuid.uuid4().hex[:8]
    return lambda base="u": "%s-%s" % (base, suffix)


class FakeUser:
    """What a Spawner reads of the hub's User: name, url, groups."""

    def __init__(self, name: str, groups: List[str]):
        self.name = name
        self.escaped_name = name
        self.url = "/user/%s/" % name
        self.groups = [SimpleNamespace(name=g) for g in groups]


@pytest.fixture
def make_spawner(token_file) -> Callable[..., GPUBrokerSpawner]:
    """make_spawner(url, user, name="", groups=(), **traits): a spawner as
    the hub builds one for a server, with its own API token (a new one per
    spawner, as the hub issues per spawn)."""

    def make(url: str, user: str, name: str = "", groups=(), **traits: Any) -> GPUBrokerSpawner:
        u = FakeUser(user, list(groups))
        prefix = u.url + (name + "/" if name else "")
        orm_spawner = SimpleNamespace(name=name, server=orm.Server(base_url=prefix, ip="", port=0, proto="http", cookie_name=""), state=None, user_options=None)
        traits.setdefault("hub_token_file", token_file)
        return GPUBrokerSpawner(
            user=u,
            hub=Hub(ip="127.0.0.1", port=8081, base_url="/hub/"),
            orm_spawner=orm_spawner,
            broker_url=url,
            api_token="api-token-" + uuid.uuid4().hex,
            oauth_client_id="jupyterhub-user-" + user,
            **traits,
        )

    return make


@pytest.fixture
def closed_port_url() -> str:
    """A URL where nothing listens."""
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return "http://127.0.0.1:%d" % port
