"""The z2jh values example (deploy/jupyterhub) stays true to the class: every
setting is a trait of the class and passes its checks. That the values agree
with the broker's Helm chart (names, ports, paths, secrets, network
policies) is checked next to the chart, by deploy/helm/render's
TestJupyterHubValuesMatchTheChart."""

from __future__ import annotations

import os
import tomllib

import pytest
import yaml
from traitlets.config import Config

from gpubroker_jupyterhub import GPUBrokerSpawner

ROOT = os.path.join(os.path.dirname(__file__), "..", "..", "..")


def load_all(rel):
    with open(os.path.join(ROOT, rel), encoding="utf-8") as f:
        return [d for d in yaml.safe_load_all(f) if d]


@pytest.fixture(scope="module")
def values():
    (v,) = load_all("deploy/jupyterhub/values.yaml")
    return v


def test_the_class_is_named_by_its_entry_point(values):
    assert values["hub"]["config"]["JupyterHub"]["spawner_class"] == "gpubroker"
    with open(os.path.join(ROOT, "spawner/jupyterhub/pyproject.toml"), "rb") as f:
        eps = tomllib.load(f)["project"]["entry-points"]["jupyterhub.spawners"]
    assert eps == {"gpubroker": "gpubroker_jupyterhub:GPUBrokerSpawner"}


def test_every_setting_is_a_trait_that_passes_its_checks(values):
    cfg = values["hub"]["config"]
    traits = GPUBrokerSpawner.class_traits(config=True)
    sections = {k: cfg[k] for k in ("GPUBrokerSpawner", "Spawner")}
    for section, settings in sections.items():
        for name in settings:
            assert name in traits, "hub.config.%s.%s is not a setting of GPUBrokerSpawner" % (section, name)
    sp = GPUBrokerSpawner(config=Config(sections))  # the validators run here
    for section, settings in sections.items():
        for name, value in settings.items():
            assert getattr(sp, name) == value, "%s.%s" % (section, name)


def test_the_proxy_reaches_the_notebooks_on_the_class_port(values):
    # The chart's side of the same port is spawner.DefaultNotebookPort
    # (TestJupyterHubValuesMatchTheChart).
    (proxy_egress,) = values["proxy"]["chp"]["networkPolicy"]["egress"]
    assert proxy_egress["ports"] == [{"port": GPUBrokerSpawner().port, "protocol": "TCP"}]


def test_the_broker_is_a_hub_service_with_the_scopes_it_uses(values):
    assert "gpubroker" in values["hub"]["services"]
    role = values["hub"]["loadRoles"]["gpubroker"]
    assert role["services"] == ["gpubroker"]
    # users:activity for GPU-busy notebooks (README, "JupyterHub's culler");
    # never access:servers: the broker's probes carry each server's own
    # token, and a token that opens every hub server must not exist for it.
    assert "users:activity" in role["scopes"]
    assert "access:servers" not in role["scopes"]
    assert values["cull"]["enabled"] is False


def test_refusals_cannot_make_the_hub_exit(values):
    # Quota and capacity refusals fail spawns; the hub must not count them
    # toward an exit (README: What users see).
    assert values["hub"]["consecutiveFailureLimit"] == 0
