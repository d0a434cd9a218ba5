"""Resources whose whole configuration comes from the deployment, never from run config.

Dagster lets whoever launches a run replace a bound resource's configuration
(``resources.<key>.config`` in the Launchpad, GraphQL ``launchRun`` or a sensor's run request):
a bound value is only a default. For the cluster resources that default is the trust boundary:
a run config naming another ``hosts`` would have the ZooKeeper digest sent to that address, and
one naming another ``spark_config`` would choose what the workers' JVMs run. So the code
location binds them *pinned*: a resource definition with an empty config schema (Dagster refuses
any ``resources.<key>.config`` of a run, naming the entry) that hands every run and sensor the
resource exactly as the deployment built it. ``EnvVar`` fields are still read when a run or tick
starts, from that process's own environment (the deployment's), not from anything a client sends.

Example:
    >>> from stream_ops.orchestration.resources import ZooKeeperResource
    >>> pinned = pinned_resource(ZooKeeperResource(hosts="zk1:2181"))
    >>> pinned.config_schema.as_field().config_type.fields
    {}
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import dagster as dg

__all__ = ["pinned_resource"]


def pinned_resource(resource: dg.ConfigurableResource) -> dg.ResourceDefinition:
    """``resource`` as a definition no run config can change.

    Args:
        resource: The resource as the deployment configures it (literal values and ``EnvVar``
            references).

    Returns:
        A resource definition with an empty config schema yielding ``resource`` with its
        ``EnvVar`` fields resolved in the process that uses it; its setup and teardown run as the
        resource's own would.
    """

    @dg.resource(config_schema={}, description=resource.__doc__)
    def _pinned(_context: dg.InitResourceContext) -> Iterator[Any]:
        with resource.process_config_and_initialize_cm() as value:
            yield value

    return _pinned
