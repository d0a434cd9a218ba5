"""Where a submitted topology's files live under the cluster paths.

Every internal topic, checkpoint and local store path is derived here from the cluster
configuration and the topology id, so the nimbus, the workers and the Dagster layer agree.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from stream_ops.config import ClusterConfig
from stream_ops.durable_files import make_dirs
from stream_ops.sources import source_kind
from stream_ops.topics.delivery_topic import DeliveryTopic
from stream_ops.topics.file_topic import FileTopic
from stream_ops.topology.plan import StageSpec


@dataclass(frozen=True)
class TopologyLayout:
    """Paths of one submitted topology."""

    cluster: ClusterConfig
    topology_id: str

    @property
    def dist_dir(self) -> Path:
        """Dist store entry: plan.json, conf.json, code.zip."""
        return self.cluster.resolved_dist_dir() / self.topology_id

    @property
    def topics_dir(self) -> Path:
        return self.cluster.resolved_topics_root() / self.topology_id

    def shuffle_topic(self, keyed_stage: StageSpec) -> FileTopic:
        """The shuffle topic feeding a non-source stage (one queue per task of that stage)."""
        return FileTopic(
            self.topics_dir / f"shuffle-{keyed_stage.index:03d}-{keyed_stage.name}",
            keyed_stage.queues,
            durable=self.cluster.fsync,
            chained=True,  # each file names its task's previous one in the queue: a lost file is found
        )

    def shuffle_delivery_topic(self, from_stage: StageSpec, to_stage: StageSpec) -> DeliveryTopic:
        """With the shuffle kept in Kafka: the staged batches of ``from_stage``'s tasks into
        ``to_stage``, published after their commit and removed once Kafka has them (one queue
        per task of ``from_stage``; see :mod:`stream_ops.kafka.shuffle_writer`)."""
        return DeliveryTopic(
            self.topics_dir / f"kafka-shuffle-{from_stage.index:03d}-to-{to_stage.index:03d}-{to_stage.name}",
            from_stage.queues,
            durable=self.cluster.fsync,
        )

    def state_topic(self, keyed_stage: StageSpec) -> FileTopic:
        """The compacted state topic of a keyed stage (one queue per input queue)."""
        return FileTopic(
            self.topics_dir / f"state-{keyed_stage.index:03d}-{keyed_stage.name}", keyed_stage.queues, durable=self.cluster.fsync
        )

    def persist_topic(self, stage: StageSpec) -> FileTopic:
        """Staged tuples of a partition_persist stage's batches, kept until its State committed them."""
        return FileTopic(self.topics_dir / f"persist-{stage.index:03d}-{stage.name}", stage.queues, durable=self.cluster.fsync)

    def sink_delivery_topic(self, stage: StageSpec, sink: str) -> DeliveryTopic:
        """Batches of a function, Kafka or ``print`` sink: staged before the commit, published after it, and removed
        once the user function returned for them (one queue per task of the stage)."""
        return DeliveryTopic(self.topics_dir / f"sink-{stage.index:03d}-{sink}", stage.queues, durable=self.cluster.fsync)

    def snapshot_dir(self, keyed_stage: StageSpec, queue: int) -> Path:
        """Compacted snapshots of one queue of a keyed stage's state topic (shared, like the topic).

        Raises:
            TopicError: if ``queue`` is not a queue of the stage.
        """
        self.state_topic(keyed_stage).queue_path(queue)  # validates the queue number
        return self.topics_dir / f"snapshots-{keyed_stage.index:03d}-{keyed_stage.name}" / f"queue-{queue:05d}"

    def dead_letter_topic(self) -> FileTopic:
        """Records that could not be processed, one queue (files named per task and txid)."""
        return FileTopic(self.topics_dir / "dead-letters", 1, durable=self.cluster.fsync)

    def checkpoint_dir(self, task_id: int) -> Path:
        """Spark checkpoint of one task; shared so a task can move between workers."""
        return self.cluster.resolved_checkpoints_root() / self.topology_id / f"task-{task_id:05d}"

    def local_store_dir(self, worker_id: str, task_id: int) -> Path:
        """The RocksDB of one task on one worker (local, rebuilt from the state topic on a move)."""
        safe_worker = worker_id.replace(":", "_")
        return self.cluster.resolved_local_state_dir() / safe_worker / self.topology_id / f"task-{task_id:05d}"

    def input_dir(self, stage: StageSpec, queue: int) -> Path | None:
        """The directory one task of ``stage`` reads: a file source's, or its queue of the
        shuffle topic written upstream (None for a source that is not files)."""
        if stage.reads_source:
            assert stage.source is not None
            return source_kind(stage.source.kind).queue_dir(stage.source, queue)
        return self.shuffle_topic(stage).queue_path(queue)

    def create_inputs(self, stage: StageSpec) -> None:
        """Create the directories ``stage``'s tasks read (at submission)."""
        if stage.reads_source:
            for queue in range(stage.queues):
                directory = self.input_dir(stage, queue)
                if directory is not None:
                    make_dirs(directory)
        else:
            self.shuffle_topic(stage).create()
