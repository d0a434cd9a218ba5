"""Observe a topology's stream assets on demand, and the job the heartbeat sensor targets.

The stream assets are observable: one :func:`dagster.multi_observable_source_asset` per
topology (:func:`build_stream_observer`) whose function reads the topology from ZooKeeper once
and records one observation per stage, exactly as a heartbeat-sensor tick does
(:func:`~stream_ops.orchestration.observations.observe_topology`; heartbeat ages are rebuilt
from the sensor's recorded observations). The UI's "Observe" button runs it.

:func:`build_observe_job` selects every topology's stream assets. The heartbeat sensor lists
it among its jobs: Dagster lists a sensor under an asset's "Automation details" when the
sensor targets a job holding the asset, so each stream asset's page names the heartbeat
sensor as what keeps it observed (the sensor records its observations itself, every tick,
and never needs to request this job).

Note: this module does not use ``from __future__ import annotations`` because Dagster reads
the resource parameters' annotations of the decorated function at definition time.
"""

import time
import warnings
from collections.abc import Iterator, Sequence

import dagster as dg
from dagster._core.definitions.unresolved_asset_job_definition import (  # what define_asset_job returns; not re-exported
    UnresolvedAssetJobDefinition,
)

from stream_ops.nimbus.status import describe_topology
from stream_ops.nimbus.submission import find_topology_id
from stream_ops.orchestration.checks import observation_history, tracker_from_observations
from stream_ops.orchestration.observations import observe_absent_topology, observe_topology
from stream_ops.orchestration.resources import ZooKeeperResource
from stream_ops.orchestration.run_config import ROLE_TAG
from stream_ops.orchestration.translator import StreamOpsTranslator, python_identifier
from stream_ops.topology.plan import Plan

__all__ = ["OBSERVE_JOB_NAME", "ObserveJob", "build_observe_job", "build_stream_observer"]

#: The type of the observe job (:func:`dagster.define_asset_job`'s).
ObserveJob = UnresolvedAssetJobDefinition

#: Name of the job observing every stream asset (the heartbeat sensor targets it).
OBSERVE_JOB_NAME = "stream_ops_observe"


def build_stream_observer(
    *,
    plan: Plan,
    specs: Sequence[dg.AssetSpec],
    translator: StreamOpsTranslator,
    heartbeat_timeout_s: float = 10.0,
) -> dg.AssetsDefinition:
    """The observable stream assets of one topology (``specs``, one per stage).

    Args:
        plan: The topology's plan.
        specs: Its stream asset specs, in stage order.
        translator: Maps (topology, stage) to asset keys.
        heartbeat_timeout_s: A task is alive if owned and its heartbeat is at most this old.

    Returns:
        An assets definition observing all ``specs`` at once; it requires the ``zookeeper``
        resource.
    """
    topology_name = plan.topology
    keys = [spec.key for spec in specs]

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", dg.BetaWarning)  # multi_observable_source_asset is beta in Dagster 1.13

        @dg.multi_observable_source_asset(
            specs=list(specs),
            name=f"{python_identifier(topology_name)}_observe_streams",
            description=f"Observes every stage of `{topology_name}` from ZooKeeper, as a heartbeat-sensor tick does.",
            required_resource_keys={"zookeeper"},
        )
        def _observe(context: dg.AssetExecutionContext) -> Iterator[dg.ObserveResult]:
            zookeeper: ZooKeeperResource = context.resources.zookeeper
            history = [item for key in keys for item in observation_history(context.instance, key)]
            now = time.time()
            with zookeeper.store() as store:
                topology_id = find_topology_id(store, topology_name, missing_ok=True)
                status = None
                if topology_id is not None:
                    tracker = tracker_from_observations(history, topology_id=topology_id)
                    status = describe_topology(store, topology_id, clock=lambda: now, tracker=tracker)
            if status is None:
                observations = observe_absent_topology(
                    topology_name, [s.name for s in plan.stages], last_topology_id=None, translator=translator
                )
            else:
                observations = observe_topology(status, translator=translator, heartbeat_timeout_s=heartbeat_timeout_s)
            by_key = {o.asset_key: o for o in observations}
            for key in keys:
                found = by_key.get(key)
                if found is None:
                    context.log.warning(
                        f"{key.to_user_string()}: its stage is not in the running submission of {topology_name!r}"
                    )
                    yield dg.ObserveResult(asset_key=key, metadata={"status": dg.MetadataValue.text("NOT_IN_RUNNING_PLAN")})
                    continue
                yield dg.ObserveResult(asset_key=key, metadata=dict(found.metadata), tags=dict(found.tags or {}))

    return _observe


def build_observe_job(stream_keys: Sequence[dg.AssetKey], name: str = OBSERVE_JOB_NAME) -> ObserveJob:
    """The job observing ``stream_keys`` (every topology's stream assets), without their checks."""
    return dg.define_asset_job(
        name,
        selection=dg.AssetSelection.assets(*stream_keys).without_checks(),
        description="Observes the stream assets of every topology from ZooKeeper on demand. The heartbeat sensor "
        "targets it (so the UI lists the sensor under each stream asset's automations) but records the same "
        "observations itself on every tick.",
        tags={ROLE_TAG: "observe"},
    )
