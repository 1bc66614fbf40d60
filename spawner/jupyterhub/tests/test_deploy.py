"""The z2jh values example (deploy/jupyterhub) stays true to the class and to
the broker's manifests (deploy/broker): every setting is a trait of the class
and passes its checks, and names, ports, paths and secrets agree."""

from __future__ import annotations

import os
import tomllib
from urllib.parse import urlparse

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


@pytest.fixture(scope="module")
def broker():
    docs = load_all("deploy/broker/broker.yaml")
    dep = next(d for d in docs if d["kind"] == "Deployment")
    svc = next(d for d in docs if d["kind"] == "Service")
    container = dep["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e.get("value") for e in container["env"]}
    return {"dep": dep, "svc": svc, "container": container, "env": env}


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


def test_the_hub_reaches_the_brokers_service(values, broker):
    url = urlparse(values["hub"]["config"]["GPUBrokerSpawner"]["broker_url"])
    svc = broker["svc"]["metadata"]
    assert url.hostname == "%s.%s.svc.cluster.local" % (svc["name"], svc["namespace"])
    (port,) = broker["svc"]["spec"]["ports"]
    assert (url.port or {"http": 80, "https": 443}[url.scheme]) == port["port"]
    container_port = next(p["containerPort"] for p in broker["container"]["ports"] if p["name"] == port["targetPort"])
    (egress,) = values["hub"]["networkPolicy"]["egress"]
    assert egress["ports"] == [{"port": container_port, "protocol": "TCP"}]
    assert egress["to"][0]["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"] == svc["namespace"]
    assert egress["to"][0]["podSelector"]["matchLabels"] == broker["dep"]["spec"]["selector"]["matchLabels"]


def test_both_sides_read_the_same_hub_token_secret(values, broker):
    token_file = values["hub"]["config"]["GPUBrokerSpawner"]["hub_token_file"]
    mount = next(m for m in values["hub"]["extraVolumeMounts"] if token_file.startswith(m["mountPath"] + "/"))
    volume = next(v for v in values["hub"]["extraVolumes"] if v["name"] == mount["name"])
    broker_file = broker["env"]["GPUBROKER_HUB_TOKEN_FILE"]
    broker_mount = next(m for m in broker["container"]["volumeMounts"] if broker_file.startswith(m["mountPath"] + "/"))
    broker_volume = next(v for v in broker["dep"]["spec"]["template"]["spec"]["volumes"] if v["name"] == broker_mount["name"])
    assert volume["secret"]["secretName"] == broker_volume["secret"]["secretName"]
    assert os.path.basename(token_file) == os.path.basename(broker_file)  # the same key of the Secret


def test_notebooks_reach_the_hub_and_the_proxy_reaches_them(values, broker):
    notebooks_ns = broker["env"]["GPUBROKER_NAMESPACE"]
    connect = urlparse(values["hub"]["config"]["Spawner"]["hub_connect_url"])
    assert connect.hostname.endswith(".jupyterhub.svc.cluster.local"), "a short name does not resolve from %s" % notebooks_ns
    ingress = values["hub"]["networkPolicy"]["ingress"][0]
    assert ingress["from"][0]["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"] == notebooks_ns
    assert ingress["ports"] == [{"port": connect.port, "protocol": "TCP"}]
    (proxy_egress,) = values["proxy"]["chp"]["networkPolicy"]["egress"]
    assert proxy_egress["to"][0]["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"] == notebooks_ns
    assert proxy_egress["ports"] == [{"port": GPUBrokerSpawner().port, "protocol": "TCP"}]
    (policy,) = load_all("deploy/jupyterhub/notebooks-networkpolicy.yaml")
    assert policy["metadata"]["namespace"] == notebooks_ns
    assert policy["spec"]["ingress"][0]["ports"] == [{"port": GPUBrokerSpawner().port, "protocol": "TCP"}]


def test_the_broker_is_a_hub_service_with_the_scopes_it_uses(values):
    assert "gpubroker" in values["hub"]["services"]
    role = values["hub"]["loadRoles"]["gpubroker"]
    assert role["services"] == ["gpubroker"]
    # users:activity for GPU-busy notebooks, access:servers for kernel probes
    # (README, "JupyterHub's culler").
    assert {"users:activity", "access:servers"} <= set(role["scopes"])
    assert values["cull"]["enabled"] is False


def test_refusals_cannot_make_the_hub_exit(values):
    # Quota and capacity refusals fail spawns; the hub must not count them
    # toward an exit (README: What users see).
    assert values["hub"]["consecutiveFailureLimit"] == 0
