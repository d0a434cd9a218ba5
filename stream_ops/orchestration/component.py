"""One topology as a Dagster Component: ``dg``'s ``defs.yaml`` instead of Python wiring.

A ``defs.yaml`` per topology::

    type: stream_ops.StreamTopologyComponent
    attributes:
      topology: stream_ops.examples.wordcount:topology   # module:attribute, or .module:attribute
      workers: 2

gives that topology's submission, stream, state and sink assets, its checks and its
rebalance and compaction schedules, as :func:`~stream_ops.orchestration.build_definitions`
does. ``dg scaffold defs stream_ops.StreamTopologyComponent my_stream`` writes such a file and a
starter ``topology.py`` next to it.

Several components in one project merge into one code location with the control room of
``build_definitions``: one heartbeat sensor observing every topology, one relaunch sensor, one
set of jobs, one set of resources. Dagster's ``Definitions.merge`` accepts a resource key twice
only for the very same object, and a sensor or an explicit job name only once, so:

* the resources are built from the environment (as ``definitions/`` reads it) once per set of
  values and memoized (:func:`cluster_resources_from_env`): every component returns the same
  objects;
* the components of a project find each other through Dagster's component tree; the first one
  (in the tree's order, i.e. by path) builds the cluster-wide jobs and sensors over all their
  topologies (:func:`~stream_ops.orchestration.definitions.build_cluster_definitions`) and
  each topology's schedules (named after it, set by its own component's attributes), and is the
  only one to return them; every component returns its own assets and checks. (The defs.yaml
  loader copies the jobs each component's definitions target, to add metadata: schedules
  returned by several components would bring several copies of a job, a conflict.)

Environment (read when the code location loads, as ``definitions/__init__.py`` does):
``STREAM_OPS_ZOOKEEPER``, ``STREAM_OPS_CHROOT``, ``STREAM_OPS_ZK_AUTH``,
``STREAM_OPS_ZK_OPEN_READS``, ``STREAM_OPS_ZK_INSECURE``, ``STREAM_OPS_HOME`` (resolved
against the working directory), ``STREAM_OPS_QUERY_TOKEN`` and ``STREAM_OPS_QUERY_TLS_CERT`` /
``_KEY`` / ``_CA``.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import MappingProxyType
from typing import Annotated, Any, Literal, Self

import dagster as dg
from dagster.components.component_scaffolding import scaffold_component
from pydantic import BaseModel, Field, PrivateAttr

from stream_ops.config import DEFAULT_CHROOT, DEFAULT_ZOOKEEPER
from stream_ops.dsl.loading import load_topology
from stream_ops.dsl.streams import Topology
from stream_ops.errors import TopologyLoadError
from stream_ops.orchestration.assets import (
    STREAM_CLUSTER_RESOURCE_KEY,
    ZOOKEEPER_RESOURCE_KEY,
    TopologyDefinitions,
    topology_assets,
)
from stream_ops.orchestration.consumer_lag import DEFAULT_CONSUMER_LAG_THRESHOLD
from stream_ops.orchestration.definitions import (
    StreamClusterDefinitions,
    build_cluster_definitions,
    build_topology_schedules,
)
from stream_ops.orchestration.jobs import StreamOpsJobs
from stream_ops.orchestration.resources import (
    PYSPARK_RESOURCE_KEY,
    StreamClusterResource,
    ZooKeeperResource,
    pyspark_resource,
)
from stream_ops.orchestration.translator import StreamOpsTranslator, source_key
from stream_ops.sources import SourceSpec

__all__ = [
    "StreamTopologyComponent",
    "StreamTopologyScaffoldParams",
    "StreamTopologyScaffolder",
    "TopologyNamingTranslator",
    "cluster_resources_from_env",
]

_TRUE = ("1", "true", "yes")


# --- resources -----------------------------------------------------------------------------


def cluster_resources_from_env(environ: Mapping[str, str] | None = None) -> Mapping[str, Any]:
    """The ``zookeeper``, ``stream_cluster`` and ``pyspark`` resources the environment describes.

    The same environment values give the very same resource objects (memoized), so the
    definitions of several components merge. Secrets (``STREAM_OPS_ZK_AUTH``,
    ``STREAM_OPS_QUERY_TOKEN``) become :class:`dagster.EnvVar` fields, resolved when a run or a
    sensor tick uses them; only whether they are set is part of the memo's key.

    Args:
        environ: The environment; default ``os.environ``.

    Returns:
        A read-only mapping resource key -> resource.

    Example:
        >>> resources = cluster_resources_from_env({"STREAM_OPS_ZOOKEEPER": "zk1:2181"})
        >>> resources["zookeeper"].hosts
        'zk1:2181'
        >>> resources is cluster_resources_from_env({"STREAM_OPS_ZOOKEEPER": "zk1:2181"})
        True
    """
    env = os.environ if environ is None else environ
    return _cluster_resources(
        hosts=env.get("STREAM_OPS_ZOOKEEPER", DEFAULT_ZOOKEEPER),
        chroot=env.get("STREAM_OPS_CHROOT", DEFAULT_CHROOT),
        zk_auth=bool(env.get("STREAM_OPS_ZK_AUTH")),
        open_reads=env.get("STREAM_OPS_ZK_OPEN_READS", "false").lower() in _TRUE,
        insecure=env.get("STREAM_OPS_ZK_INSECURE", "false").lower() in _TRUE,
        root=str(Path(env.get("STREAM_OPS_HOME", "var/stream_ops")).resolve()),
        query_token=bool(env.get("STREAM_OPS_QUERY_TOKEN")),
        query_tls_cert=env.get("STREAM_OPS_QUERY_TLS_CERT") or None,
        query_tls_key=env.get("STREAM_OPS_QUERY_TLS_KEY") or None,
        query_tls_ca=env.get("STREAM_OPS_QUERY_TLS_CA") or None,
    )


@functools.lru_cache(maxsize=16)
def _cluster_resources(
    *,
    hosts: str,
    chroot: str,
    zk_auth: bool,
    open_reads: bool,
    insecure: bool,
    root: str,
    query_token: bool,
    query_tls_cert: str | None,
    query_tls_key: str | None,
    query_tls_ca: str | None,
) -> Mapping[str, Any]:
    stream_cluster = StreamClusterResource(
        root=root,
        query_token=dg.EnvVar("STREAM_OPS_QUERY_TOKEN") if query_token else None,
        query_tls_cert=query_tls_cert,
        query_tls_key=query_tls_key,
        query_tls_ca=query_tls_ca,
    )
    return MappingProxyType(
        {
            ZOOKEEPER_RESOURCE_KEY: ZooKeeperResource(
                hosts=hosts,
                chroot=chroot,
                auth_digest=dg.EnvVar("STREAM_OPS_ZK_AUTH") if zk_auth else None,
                open_reads=open_reads,
                insecure=insecure,
            ),
            STREAM_CLUSTER_RESOURCE_KEY: stream_cluster,
            PYSPARK_RESOURCE_KEY: pyspark_resource(stream_cluster),
        }
    )


# --- naming --------------------------------------------------------------------------------


class TopologyNamingTranslator(StreamOpsTranslator):
    """:class:`StreamOpsTranslator` with a key prefix and a group of its own per topology.

    Topologies not in ``naming`` keep the defaults (prefix ``stream_ops``, group = topology).

    Example:
        >>> translator = TopologyNamingTranslator({"wordcount": (("prod", "streams"), "words")})
        >>> translator.stream_asset_key("wordcount", "count").to_user_string()
        'prod/streams/wordcount/count'
        >>> translator.group_name("wordcount"), translator.group_name("other")
        ('words', 'other')
    """

    def __init__(self, naming: Mapping[str, tuple[Sequence[str], str | None]]) -> None:
        self._naming = {name: (tuple(prefix), group) for name, (prefix, group) in naming.items()}

    def _prefix(self, topology_name: str) -> tuple[str, ...]:
        naming = self._naming.get(topology_name)
        return naming[0] if naming is not None else self.key_prefix

    def submission_asset_key(self, topology_name: str) -> dg.AssetKey:
        return dg.AssetKey([*self._prefix(topology_name), topology_name, "submission"])

    def stream_asset_key(self, topology_name: str, stage_name: str) -> dg.AssetKey:
        return dg.AssetKey([*self._prefix(topology_name), topology_name, stage_name])

    def sink_asset_key(self, topology_name: str, sink_name: str) -> dg.AssetKey:
        return dg.AssetKey([*self._prefix(topology_name), topology_name, "sinks", sink_name])

    def state_asset_key(self, topology_name: str, stage_name: str) -> dg.AssetKey:
        return dg.AssetKey([*self._prefix(topology_name), topology_name, f"{stage_name}_state"])

    def health_asset_key(self, topology_name: str) -> dg.AssetKey:
        return dg.AssetKey([*self._prefix(topology_name), topology_name, "health"])

    def source_asset_key(self, topology_name: str, source: SourceSpec) -> dg.AssetKey | None:
        return source_key(self._prefix(topology_name), source)

    def group_name(self, topology_name: str) -> str | None:
        naming = self._naming.get(topology_name)
        if naming is not None and naming[1]:
            return naming[1]
        return super().group_name(topology_name)


# --- scaffolding ---------------------------------------------------------------------------

_NOT_NAME = re.compile(r"[^A-Za-z0-9_-]")

_STARTER_TOPOLOGY = '''\
"""The topology of the `{name}` component; defs.yaml points at `topology` below.

A word count to start from (Trident's): JSON lines {{"sentence": "..."}} dropped into
$STREAM_OPS_HOME/input/{name} (default var/stream_ops/..., under the working directory), split
into words by Spark SQL, counted per word in opaque-transactional state, queryable as `words`.
Rewrite it with the stream_ops DSL (see stream_ops' docs/guide.md, section 2).
"""

import os
from pathlib import Path

from stream_ops import Count, FileTopic, OpaqueMapState, Topology


def topology() -> Topology:
    """The `{name}` topology (a zero-argument function: the component calls it when the code loads)."""
    home = Path(os.environ.get("STREAM_OPS_HOME", "var/stream_ops")).resolve()
    topology = Topology("{name}")
    sentences = topology.source(
        "sentences", FileTopic(home / "input" / "{name}", queues=2), schema={{"sentence": "string"}}
    )
    # Spark SQL, analysed once when the code first loads (then cached under ~/.cache/stream_ops).
    words = sentences.select_expr("explode(split(sentence, ' ')) AS word")
    counts = words.group_by("word").persistent_aggregate(Count(), out="count", state=OpaqueMapState)
    topology.query("words", counts)
    return topology
'''

_PYTHON_COMPONENT = """\
import dagster as dg

from stream_ops import StreamTopologyComponent


@dg.component_instance
def load(context: dg.ComponentLoadContext) -> StreamTopologyComponent:
    return StreamTopologyComponent(topology={topology}, workers={workers})
"""


class StreamTopologyScaffoldParams(BaseModel):
    """Options of ``dg scaffold defs stream_ops.StreamTopologyComponent <path>``."""

    topology: str | None = Field(
        default=None,
        description=(
            "The topology, as 'module:attribute' (a Topology or a zero-argument function returning one). "
            "Default: a starter word count written to topology.py next to defs.yaml, named after the folder."
        ),
    )
    workers: int = Field(default=2, ge=1, description="Worker slots the topology asks for at submission.")


def _topology_name(path: Path) -> str:
    """A valid topology name from a folder name (letters, digits, ``_``, ``-``; a letter first)."""
    name = _NOT_NAME.sub("_", path.name)
    if not name[:1].isalpha():
        name = f"t_{name}"
    return name[:63]


class StreamTopologyScaffolder(dg.Scaffolder[StreamTopologyScaffoldParams]):
    """Writes a ``defs.yaml`` (or ``component.py``) and, without ``--topology``, a starter ``topology.py``."""

    @classmethod
    def get_scaffold_params(cls) -> type[StreamTopologyScaffoldParams]:
        return StreamTopologyScaffoldParams

    def scaffold(self, request: dg.ScaffoldRequest[StreamTopologyScaffoldParams]) -> None:
        params = request.params if request.params is not None else StreamTopologyScaffoldParams()
        topology = params.topology
        folder = request.target_path.parent if request.append else request.target_path
        if topology is None:
            topology_py = folder / "topology.py"
            if not topology_py.exists():
                topology_py.write_text(_STARTER_TOPOLOGY.format(name=_topology_name(folder)), encoding="utf-8")
            topology = ".topology:topology"
        if request.scaffold_format == "python":
            # component.py is imported as <defs module>.<folder>.component: a relative reference is
            # made absolute with its __package__.
            expression = f'f"{{__package__}}{topology}"' if topology.startswith(".") else repr(topology)
            text = _PYTHON_COMPONENT.format(topology=expression, workers=params.workers)
            (folder / "component.py").write_text(text, encoding="utf-8")
            return
        scaffold_component(request, {"topology": topology, "workers": params.workers})


# --- the component -------------------------------------------------------------------------


@dg.scaffold_with(StreamTopologyScaffolder)
class StreamTopologyComponent(dg.Component, dg.Resolvable, dg.Model):
    """A stream_ops topology: submission, stream, state and sink assets, checks, schedules.

    All the stream_ops components of a project share one control room: one heartbeat sensor
    observing every topology (observations, checks, rebalance and worker runs), one worker
    relaunch sensor, the worker/rebalance/activate/deactivate/kill/compaction jobs and the
    ``zookeeper``, ``stream_cluster`` and ``pyspark`` resources, configured from the
    ``STREAM_OPS_*`` environment variables.
    """

    topology: Annotated[
        str,
        Field(
            description=(
                "The topology as 'module:attribute': a stream_ops Topology or a zero-argument function returning "
                "one, e.g. 'stream_ops.examples.wordcount:topology'. A leading '.' makes the module relative to "
                "this defs.yaml's folder, e.g. '.topology:topology' for topology.py next to it."
            )
        ),
    ]
    workers: Annotated[int, Field(ge=1, description="Worker slots the topology asks for at submission.")] = 2
    standby_replicas: Annotated[
        int, Field(ge=0, description="Standby replicas of each stateful task (warm copies of its state on other workers).")
    ] = 0
    conf: Annotated[dict[str, Any], Field(description="Topology configuration stored with the submission.")] = {}
    schedules: Annotated[
        bool, Field(description="Whether the topology has its rebalance and (with keyed stages) compaction schedules.")
    ] = True
    schedule_status: Annotated[
        Literal["running", "stopped"], Field(description="Whether the schedules run as soon as the code location loads.")
    ] = "running"
    rebalance_cron: Annotated[str, Field(description="Cron of the rebalance schedule (a sticky reassign).")] = "*/15 * * * *"
    compaction_cron: Annotated[str, Field(description="Cron of the state compaction schedule.")] = "0 * * * *"
    key_prefix: Annotated[
        list[str], Field(description="Asset key prefix: keys are <prefix>/<topology>/<stage>, ...submission, ...sinks/<sink>.")
    ] = ["stream_ops"]
    group: Annotated[
        str | None, Field(description="Asset group of the topology's assets; default the topology name ('-' -> '_').")
    ] = None
    consumer_lag_threshold: Annotated[
        int,
        Field(
            ge=1,
            description="The consumer_lag check of a Kafka topic this topology reads fails once the topology is this "
            "many records behind (end offsets less committed offsets, over all partitions).",
        ),
    ] = DEFAULT_CONSUMER_LAG_THRESHOLD

    _package: str | None = PrivateAttr(default=None)
    _where: str | None = PrivateAttr(default=None)
    _definitions: TopologyDefinitions | None = PrivateAttr(default=None)
    _room: _ControlRoom | None = PrivateAttr(default=None)

    @classmethod
    def get_spec(cls) -> dg.ComponentTypeSpec:
        return dg.ComponentTypeSpec(
            description="A stream_ops topology (Storm/Trident-style streaming on Spark) and its Dagster control room.",
            tags=["stream_ops", "spark", "zookeeper", "streaming"],
            produces=["asset", "asset_check", "schedule", "sensor", "job", "resource"],
        )

    @classmethod
    def load(cls, attributes: BaseModel | None, context: dg.ComponentLoadContext) -> Self:
        component = super().load(attributes, context)
        component._locate(context)
        return component

    def _locate(self, context: dg.ComponentLoadContext) -> None:
        """Remember the component's package (for relative references) and folder (for messages)."""
        self._package = context.defs_relative_module_name(context.path)
        try:
            self._where = context.path.relative_to(context.defs_module_path).as_posix()
        except ValueError:
            self._where = str(context.path)

    # --- this topology ---

    def load_topology(self) -> Topology:
        """Import the topology :attr:`topology` refers to (relative references from this component's folder).

        Raises:
            TopologyLoadError: The reference cannot be imported or is not a Topology.
        """
        module, sep, attribute = self.topology.partition(":")
        reference = self.topology
        if sep and module.startswith("."):
            if self._package is None:
                raise TopologyLoadError(
                    f"topology {self.topology!r} is relative to the component's folder, which is known only when "
                    "the component is loaded from a defs folder; use an absolute 'module:attribute'"
                )
            try:
                reference = f"{importlib.util.resolve_name(module, self._package)}:{attribute}"
            except ImportError as e:
                raise TopologyLoadError(f"topology {self.topology!r} relative to {self._package!r}: {e}") from e
        return load_topology(reference)

    def naming(self, topology_name: str) -> TopologyNamingTranslator:
        """The translator of this component's topology (its key prefix and group)."""
        return TopologyNamingTranslator({topology_name: (self.key_prefix, self.group)})

    def topology_definitions(self) -> TopologyDefinitions:
        """This topology's assets and checks (built once per component)."""
        if self._definitions is None:
            topology = self.load_topology()
            definitions = topology_assets(
                topology=topology,
                workers=self.workers,
                standby_replicas=self.standby_replicas,
                conf=self.conf,
                translator=self.naming(topology.name),
                consumer_lag_threshold=self.consumer_lag_threshold,
            )
            self._definitions = definitions
        return self._definitions

    # --- all the topologies of the project ---

    def _peers(self, context: dg.ComponentLoadContext) -> tuple[StreamTopologyComponent, ...]:
        """The stream_ops components of this project, in the component tree's order (this one alone outside a tree)."""
        try:
            found = context.component_tree.get_all_components(StreamTopologyComponent)
        except Exception:  # noqa: BLE001 - a test context without a project tree: this component alone
            found = []
        if not any(peer is self for peer in found):
            return (self,)
        return tuple(found)

    def _schedules(self, own: TopologyDefinitions, jobs: StreamOpsJobs) -> list[dg.ScheduleDefinition]:
        """This topology's rebalance and compaction schedules, as its attributes say."""
        if not self.schedules:
            return []
        return build_topology_schedules(
            own,
            jobs,
            rebalance_cron=self.rebalance_cron,
            compaction_cron=self.compaction_cron,
            schedule_status=dg.DefaultScheduleStatus.RUNNING
            if self.schedule_status == "running"
            else dg.DefaultScheduleStatus.STOPPED,
        )

    def _control_room(self, peers: tuple[StreamTopologyComponent, ...]) -> _ControlRoom:
        """Jobs, sensors, resources and schedules over ``peers``' topologies, built once (on the first peer)."""
        cached = self._room
        if cached is not None and len(cached.peers) == len(peers) and all(a is b for a, b in zip(cached.peers, peers)):
            return cached
        per_topology = [peer.topology_definitions() for peer in peers]
        names = [d.topology_name for d in per_topology]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            where = {n: [p._where or p.topology for p, d in zip(peers, per_topology) if d.topology_name == n] for n in duplicates}
            raise ValueError(
                f"StreamTopologyComponent: several components define a topology named {duplicates} ({where}); "
                "topology names must be unique in a code location"
            )
        translator = TopologyNamingTranslator(
            {d.topology_name: (peer.key_prefix, peer.group) for peer, d in zip(peers, per_topology)}
        )
        resources = cluster_resources_from_env()
        cluster = build_cluster_definitions(
            topologies=per_topology,
            zookeeper=resources[ZOOKEEPER_RESOURCE_KEY],
            stream_cluster=resources[STREAM_CLUSTER_RESOURCE_KEY],
            pyspark=resources[PYSPARK_RESOURCE_KEY],
            translator=translator,
        )
        schedules = tuple(schedule for peer, d in zip(peers, per_topology) for schedule in peer._schedules(d, cluster.jobs))
        self._room = _ControlRoom(peers=peers, cluster=cluster, schedules=schedules)
        return self._room

    def build_defs(self, context: dg.ComponentLoadContext) -> dg.Definitions:
        if self._package is None:
            self._locate(context)
        peers = self._peers(context)
        leader = peers[0]
        room = leader._control_room(peers)
        own = self.topology_definitions()
        # Every component: its assets and checks, and the resources (the same objects in every
        # component, which Definitions.merge accepts). The first one only: the jobs, the sensors
        # and every topology's schedules. (The defs.yaml loader gives each component its own copy
        # of the jobs its definitions target, and two copies of a job are a conflict.)
        first = self is leader
        return dg.Definitions(
            assets=own.assets,
            asset_checks=[*own.asset_checks, *(room.cluster.asset_checks if first else ())],
            jobs=room.cluster.all_jobs if first else [],
            sensors=list(room.cluster.sensors) if first else [],
            schedules=list(room.schedules) if first else [],
            resources=dict(room.cluster.resources),
        )


@dataclasses.dataclass(frozen=True)
class _ControlRoom:
    """What the first component of a project returns for all of them."""

    peers: tuple[StreamTopologyComponent, ...]
    cluster: StreamClusterDefinitions
    schedules: tuple[dg.ScheduleDefinition, ...]
