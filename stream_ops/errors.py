"""Every exception stream_ops raises, in one place.

All derive from :class:`StreamOpsError`. Errors a caller may retry (a lost connection, a
contended compare-and-set) derive from :class:`TransientError` as well; everything else is
fatal for the operation that raised it. Messages say what to do about the problem.
"""

from __future__ import annotations


class StreamOpsError(Exception):
    """Root of every stream_ops error."""


class TransientError(StreamOpsError):
    """The operation may succeed if retried (connection loss, contention)."""


# --- definition time -------------------------------------------------------------------


class TopologyDefinitionError(StreamOpsError):
    """A topology definition is invalid (unknown field, bad operator order, ...)."""


class TopologyLoadError(StreamOpsError):
    """An import string such as ``pkg.module:topology`` could not be loaded."""


class AggregatorInputError(StreamOpsError, ValueError):
    """A record's field cannot be aggregated (null, or not a number for Sum); the record goes
    to the dead letters with this message."""


# --- state -----------------------------------------------------------------------------


class StateError(StreamOpsError):
    """Keyed state could not be read or written."""


class TxidOrderError(StateError):
    """A batch txid is older than the txid already stored for a value (never applied)."""


class ReplayError(StateError):
    """A state topic could not be replayed (corrupt entry, impossible ordering)."""


class StateNotReadyError(StateError, TransientError):
    """A task refused a state query rather than risk answering values older than its committed
    txid: a batch's commit or its write into the local store is taking longer than
    ``commit_wait_s``, that write failed and the store is being caught up from the state topic
    (or could not be, and the task is failing), the worker is not connected to ZooKeeper, or it
    lost the task to a newer owner. Ask again shortly (the query server answers 503)."""


class StateStoreBehindError(StateError):
    """A task's local store could not be brought to the committed txid after writing a committed
    batch into it failed (the write and the catch-up from the state topic kept failing, or the
    tail it needed was compacted meanwhile). The task stops; its next start catches the store up
    from the state topic or rebuilds it."""


# --- topics ----------------------------------------------------------------------------


class TopicError(StreamOpsError):
    """A FileTopic could not be read or written."""


class CommittedBatchLostError(StreamOpsError):
    """Files a committed batch wrote are missing or cut short (lost to an OS crash on storage
    that did not honour fsync, or deleted by hand); the task stops instead of skipping them."""


# --- coordination ----------------------------------------------------------------------


class CoordinationError(StreamOpsError):
    """ZooKeeper refused or failed an operation."""


class ZooKeeperUnavailableError(CoordinationError, TransientError):
    """No ZooKeeper server answered in time."""


class ConcurrentUpdateError(CoordinationError, TransientError):
    """A compare-and-set lost against another writer too many times."""


class ZnodeExistsError(CoordinationError):
    """A znode to create already exists (e.g. another worker holds an ownership node)."""


class ZnodeNotFoundError(CoordinationError):
    """A znode to read, update or delete does not exist."""


class ZooKeeperTreeNotOwnedError(CoordinationError):
    """With digest credentials, the chroot or a top-level znode does not carry exactly the
    cluster's ACL: another client created it (or it predates ``auth_digest``), so whoever that
    ACL lets in could replace topologies, workers or assignments. Nothing was started.

    Attributes:
        mismatches: ``(path, actual ACL, expected ACL)`` of every offending node, paths absolute
            (chroot included).
    """

    def __init__(self, message: str, *, mismatches: list[tuple[str, str, str]]) -> None:
        super().__init__(message)
        self.mismatches = mismatches


class ZooKeeperAuthRequiredError(CoordinationError):
    """A worker, nimbus or supervisor was asked to run on a ZooKeeper tree without digest
    credentials (anyone who can reach ZooKeeper could then choose the code it runs) and was not
    started with an explicit ``--insecure`` / ``ZooKeeperConfig.insecure``."""


class TransactionFailedError(CoordinationError):
    """A multi-operation ZooKeeper transaction was rolled back; nothing was applied.

    Attributes:
        index: Position of the operation that failed (0-based).
        operation: Kind of that operation: ``create``, ``delete``, ``set_data`` or ``check``.
        path: Znode path of that operation (relative to the chroot).
        reason: ZooKeeper's reason, e.g. ``BadVersionError`` or ``NoNodeError``.
    """

    def __init__(self, message: str, *, index: int, operation: str, path: str, reason: str) -> None:
        super().__init__(message)
        self.index = index
        self.operation = operation
        self.path = path
        self.reason = reason


class TaskBusyError(TransientError):
    """Another worker still holds the task's ``/owners`` node (it may be dying)."""


class OwnershipLostError(CoordinationError):
    """This worker no longer owns the task; it must stop without writing."""


class TaskStoppingError(StreamOpsError):
    """A batch reached its commit while its task was stopping; it is left for replay."""


class InputMismatchError(StreamOpsError):
    """Spark planned different input for a batch id than the batch ZooKeeper committed under
    that txid (the Spark checkpoint fell behind or was replaced); the task stops."""


class ZooKeeperServerError(CoordinationError):
    """The embedded ZooKeeper server could not be started or stopped."""


class JavaNotFoundError(ZooKeeperServerError):
    """No Java runtime was found to run the embedded ZooKeeper."""


# --- nimbus ----------------------------------------------------------------------------


class ConfigError(StreamOpsError):
    """A configuration value (a topology's conf, a setting) is not valid."""


class TopologyEnvironmentError(ConfigError):
    """A name an operator asked to pass through to the processes that run topology code
    (``stream-ops worker --pass-env``, ``STREAM_OPS_WORKER_PASS_ENV``,
    ``StreamClusterResource.worker_pass_env``) is a secret of stream_ops, Dagster or its
    database, or not an environment variable name. Nothing was started."""


class SubmissionError(StreamOpsError):
    """A topology could not be submitted."""


class SubmissionIntegrityError(StreamOpsError):
    """A dist store entry is not what was submitted: a file differs from the integrity root
    recorded in ``/storms/{id}``, the record names another dist store than the reader's own, or
    no root was recorded. Nothing of the entry was parsed or imported."""


class TopologyNotFoundError(StreamOpsError):
    """No submitted topology has the given name or id."""


class TopologyNotRunningError(StreamOpsError):
    """A topology did not get running in the time given (:func:`stream_ops.nimbus.waiting.wait_until_running`),
    or cannot without an operator (deactivated, being killed, a task quarantined). The message
    says what is missing: no live worker, no nimbus to assign the tasks, tasks not started, no
    heartbeat or no commit yet, and what to do about each."""


class SchedulingError(StreamOpsError):
    """Tasks could not be assigned (no slots, bad arguments)."""


# --- runtime ---------------------------------------------------------------------------


class WorkerError(StreamOpsError):
    """A worker could not run its tasks."""


class RowProcessError(WorkerError):
    """A local process running a source batch's per-record operations died (killed, out of
    memory, a user function ending it) or raised: the batch fails, as a Spark job fails when
    a Python worker does."""


class ShuffleSourceUnavailableError(WorkerError):
    """A task's checkpoint was written by stream_ops' shuffle-queue source and this worker's
    JVM cannot load it (its classes are built with the JDK's ``javac``)."""


class WorkerLaunchError(WorkerError):
    """A ``stream-ops worker`` process could not be given its secrets or its clean environment
    (a pipe that does not hold one line of them, an environment that still holds a secret after
    the worker's restart without it)."""


class QueryError(StreamOpsError):
    """A state query could not be answered."""


class QueryAuthError(QueryError):
    """A worker refused a state query: no query token, or not the one it serves with."""


class QueryTLSError(QueryError):
    """TLS of the state-query port failed: unreadable certificate, key or CA, an unverifiable
    worker certificate, or a client and a worker that disagree about TLS."""


class QueryUnavailableError(QueryError, TransientError):
    """No answer to a state query for now: a worker refused it as busy (503), did not answer
    (connection refused or reset, a timeout), failed its lookup (500), or no longer runs the
    task (404 while the task moves); the task may not be assigned yet. Asking again shortly may
    succeed."""


class QueryRequestError(QueryError):
    """A worker refused the keys of a state query themselves (400: not JSON lists, nested too
    deep; 414: one key too large for a request): asking again cannot help. A ``state_query``
    dead-letters the records whose keys these are."""


class StateQueryUnavailableError(QueryUnavailableError):
    """A topology's own ``state_query`` lookup got no answer within its retries: the batch
    fails, and the worker tries the task again (backoff, then quarantine) instead of
    dead-lettering records that did nothing wrong."""


# --- sources ---------------------------------------------------------------------------


class SourceError(StreamOpsError):
    """A source could not be read as its spec says (a queue it does not have, a spec of
    another kind, options that do not fit the kind)."""


class LockTimeoutError(CoordinationError, TransientError):
    """A ZooKeeper lock was not acquired within its timeout: another process holds it (or the
    connection was lost meanwhile). Nothing was done under it; try again later."""


# --- kafka -----------------------------------------------------------------------------


class KafkaJarsError(StreamOpsError):
    """The Kafka jars (the embedded broker's classpath, Spark's Kafka connector) could not be
    fetched with Maven; the message says why (Maven missing, a repository not reachable)."""


class KafkaServerError(StreamOpsError):
    """The embedded Kafka broker could not be formatted, started or reached."""


class KafkaSinkError(StreamOpsError):
    """A Kafka sink could not deliver a committed batch (brokers unreachable, a missing topic,
    a transaction the brokers refused). The batch stays published and undelivered: the task
    stops, and the next start delivers it, once."""


class KafkaSinkFencedError(KafkaSinkError):
    """A newer producer with the same transactional id (the task's next owner) fenced this one:
    its open transaction is aborted and it can write nothing more. The new owner delivers."""


class SstLoadError(StateError):
    """The SST file beside a snapshot could not be loaded into a store; nothing was written, so
    the restore can go on from the Parquet snapshot."""


class StateTopicTruncatedError(StateError):
    """The state-topic records asked for were deleted by a compaction meanwhile (a Kafka state
    topic's partition starts at a higher offset now): read again from the newer snapshot."""


class KafkaShuffleError(KafkaSinkError):
    """A shuffle between stages kept in Kafka could not be set up or written: its topic has
    fewer partitions than the downstream stage has queues, or Kafka refused or did not answer.
    Like a sink's batch, a committed upstream batch stays published and is delivered at the
    task's next start."""
