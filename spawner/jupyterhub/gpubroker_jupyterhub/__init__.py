"""gpubroker's JupyterHub spawner class.

Use it with ``c.JupyterHub.spawner_class = "gpubroker"`` (the
``jupyterhub.spawners`` entry point) or
``"gpubroker_jupyterhub.GPUBrokerSpawner"``; see README.md for settings.
"""

from .client import BrokerClient, BrokerError, BrokerUnreachable, Event
from .spawner import BrokerSpawnError, GPUBrokerSpawner

__version__ = "0.1.0"

__all__ = [
    "BrokerClient",
    "BrokerError",
    "BrokerSpawnError",
    "BrokerUnreachable",
    "Event",
    "GPUBrokerSpawner",
    "__version__",
]
