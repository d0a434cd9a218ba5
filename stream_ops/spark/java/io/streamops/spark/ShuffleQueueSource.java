package io.streamops.spark;

import java.io.IOException;
import java.io.Serializable;
import java.nio.file.DirectoryStream;
import java.nio.file.Files;
import java.nio.file.NoSuchFileException;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.util.ArrayList;
import java.util.Comparator;
import java.util.EnumSet;
import java.util.HashMap;
import java.util.HashSet;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.TreeMap;
import java.util.regex.Matcher;
import java.util.regex.Pattern;

import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.connector.catalog.SupportsRead;
import org.apache.spark.sql.connector.catalog.Table;
import org.apache.spark.sql.connector.catalog.TableCapability;
import org.apache.spark.sql.connector.catalog.TableProvider;
import org.apache.spark.sql.connector.expressions.Transform;
import org.apache.spark.sql.connector.read.InputPartition;
import org.apache.spark.sql.connector.read.PartitionReader;
import org.apache.spark.sql.connector.read.PartitionReaderFactory;
import org.apache.spark.sql.connector.read.Scan;
import org.apache.spark.sql.connector.read.ScanBuilder;
import org.apache.spark.sql.connector.read.streaming.MicroBatchStream;
import org.apache.spark.sql.connector.read.streaming.Offset;
import org.apache.spark.sql.connector.read.streaming.ReadLimit;
import org.apache.spark.sql.connector.read.streaming.ReadMaxFiles;
import org.apache.spark.sql.connector.read.streaming.SupportsAdmissionControl;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.util.CaseInsensitiveStringMap;

/**
 * A stream_ops shuffle queue as a Spark micro-batch source whose offset is small and bounded.
 *
 * <p>Every file of a shuffle queue is named {@code t<task>-x<txid>-e<epoch>.<suffix>}, and each
 * upstream task publishes its files in txid order (a batch's files only after its commit, the
 * next batch only after that). So "what has been read" is, per upstream task, the highest txid
 * read: the offset is that map, e.g. {@code {"queueTxids":{"3":17,"4":12}}}, and a batch's files
 * are those whose txid lies above its start offset and at or below its end offset. Unlike
 * Spark's file source, which logs every file it ever read and rewrites that log every ten
 * batches, nothing here grows with the files read, so the reader may delete consumed files.
 *
 * <p>A task with time-based windows or triggers writes tick files into its own queue
 * ({@code tick-t<task>-<nanoseconds>.jsonl}) so that a batch runs although no data arrives;
 * they count as one more "task", key {@code -1}, whose "txid" is the tick's stamp.
 *
 * <p>The source only plans offsets: it yields no rows ({@code planInputPartitions} is empty).
 * The query's {@code foreachBatch} callback reads the batch's files itself, found from the
 * offsets Spark logged for the batch and the one before ({@code stream_ops.spark.shuffle_queue}).
 * Options: {@code path} (the queue directory), {@code suffix} (the files' extension without its
 * dot), {@code maxFilesPerTrigger} (at most that many files a batch, oldest first; 0: all), and
 * {@code producers} with {@code roundWaitMillis} (both 0 by default: no wait).
 *
 * <p>Round wait. With {@code producers} upstream tasks, a batch that would read files of only
 * some of them (an incomplete round of upstream batches) is held back until the rest lands or
 * until its oldest file has been seen for {@code roundWaitMillis}, whichever comes first, as
 * Kafka Streams' {@code max.task.idle.ms} waits for every input partition. One batch per round
 * then reads all of it: a task that starts while one upstream task has published and another
 * is still computing runs one batch, not two. Holding only moves the end offset Spark logs, so
 * what a batch reads and how it replays are unchanged. A tick file, or a backlog larger than
 * the file limit, is never held. The time is this source's own (when a listing first showed the
 * file, not the file's modification time, which a network file system's clock may skew), so a
 * restarted query waits at most once more.
 */
public final class ShuffleQueueSource implements TableProvider {
  /** The batch-file names of {@code stream_ops.topics.file_topic.batch_file_name}. */
  private static final Pattern BATCH_FILE = Pattern.compile("t(\\d+)-x(\\d+)-e\\d+\\.([a-z]+)");
  /** The tick files of {@code stream_ops.spark.shuffle_queue.tick_file_name}: JSON lines only. */
  private static final Pattern TICK_FILE = Pattern.compile("tick-t\\d+-(\\d+)\\.jsonl");
  /** The key of tick files in the offset map (task ids are never negative). */
  static final long TICKS = -1L;

  private static final String OFFSET_KEY = "queueTxids";
  private static final Pattern OFFSET_JSON = Pattern.compile("\\{\"" + OFFSET_KEY + "\":\\{(.*)\\}\\}");
  private static final Pattern OFFSET_ENTRY = Pattern.compile("\"(-?\\d+)\":(-?\\d+)");

  @Override
  public StructType inferSchema(CaseInsensitiveStringMap options) {
    throw new IllegalArgumentException("a shuffle queue has no schema of its own: give it with .schema(...)");
  }

  @Override
  public boolean supportsExternalMetadata() {
    return true;
  }

  @Override
  public Table getTable(StructType schema, Transform[] partitioning, Map<String, String> properties) {
    return new QueueTable(schema);
  }

  /** The queue as a table that can only be read as a micro-batch stream. */
  static final class QueueTable implements Table, SupportsRead {
    private final StructType schema;

    QueueTable(StructType schema) {
      this.schema = schema;
    }

    @Override
    public String name() {
      return "stream_ops shuffle queue";
    }

    @Override
    public StructType schema() {
      return schema;
    }

    @Override
    public Set<TableCapability> capabilities() {
      return EnumSet.of(TableCapability.MICRO_BATCH_READ);
    }

    @Override
    public ScanBuilder newScanBuilder(CaseInsensitiveStringMap options) {
      String path = options.get("path");
      if (path == null || path.isEmpty()) {
        throw new IllegalArgumentException("a shuffle queue needs its directory: .option(\"path\", ...)");
      }
      String suffix = options.getOrDefault("suffix", "parquet");
      int maxFiles = options.getInt("maxFilesPerTrigger", 0);
      RoundWait wait = new RoundWait(options.getInt("producers", 0), options.getLong("roundWaitMillis", 0L));
      return () -> new QueueScan(schema, Paths.get(path), suffix, maxFiles, wait);
    }
  }

  /** How long an incomplete round of {@code producers} upstream tasks' batches is held back. */
  record RoundWait(int producers, long millis) {}

  static final class QueueScan implements Scan {
    private final StructType schema;
    private final Path directory;
    private final String suffix;
    private final int maxFiles;
    private final RoundWait wait;

    QueueScan(StructType schema, Path directory, String suffix, int maxFiles, RoundWait wait) {
      this.schema = schema;
      this.directory = directory;
      this.suffix = suffix;
      this.maxFiles = maxFiles;
      this.wait = wait;
    }

    @Override
    public StructType readSchema() {
      return schema;
    }

    @Override
    public MicroBatchStream toMicroBatchStream(String checkpointLocation) {
      return new QueueStream(directory, suffix, maxFiles, wait);
    }
  }

  /** One published batch file of an upstream task. */
  private record BatchFile(long task, long txid, Path path) {}

  static final class QueueStream implements MicroBatchStream, SupportsAdmissionControl {
    private final Path directory;
    private final String suffix;
    private final int maxFiles;
    private final RoundWait wait;
    /** When a listing first showed each unread file (System.nanoTime), for the round wait. */
    private final Map<Path, Long> firstSeen = new HashMap<>();

    QueueStream(Path directory, String suffix, int maxFiles, RoundWait wait) {
      this.directory = directory;
      this.suffix = suffix;
      this.maxFiles = maxFiles;
      this.wait = wait;
    }

    @Override
    public Offset initialOffset() {
      return new QueueOffset(new TreeMap<>());
    }

    @Override
    public Offset deserializeOffset(String json) {
      return QueueOffset.parse(json);
    }

    @Override
    public ReadLimit getDefaultReadLimit() {
      return maxFiles > 0 ? ReadLimit.maxFiles(maxFiles) : ReadLimit.allAvailable();
    }

    @Override
    public Offset latestOffset() {
      throw new UnsupportedOperationException("latestOffset(Offset, ReadLimit) is the one Spark calls on this source");
    }

    /**
     * The end offset of the next batch: every file above {@code start}, or with a file limit the
     * oldest ones (by modification time; per task still a run of consecutive txids, since a
     * task publishes in txid order). {@code start} itself when nothing new landed or the
     * round wait holds what did, or null before anything was read at all (an offset there
     * would make Spark run an empty first batch).
     */
    @Override
    public Offset latestOffset(Offset start, ReadLimit limit) {
      Map<Long, Long> from = ((QueueOffset) start).txids;
      List<BatchFile> unread = new ArrayList<>();
      for (BatchFile file : list()) {
        Long read = from.get(file.task());
        if (read == null || file.txid() > read) {
          unread.add(file);
        }
      }
      int cap = limit instanceof ReadMaxFiles max ? max.maxFiles() : Integer.MAX_VALUE;
      if (unread.isEmpty() || holdsRound(unread, cap)) {
        return from.isEmpty() ? null : start;
      }
      if (unread.size() > cap) {
        unread.sort(Comparator.comparingLong(QueueStream::modified)
            .thenComparingLong(BatchFile::task)
            .thenComparingLong(BatchFile::txid));
        unread = unread.subList(0, cap);
      }
      TreeMap<Long, Long> end = new TreeMap<>(from);
      for (BatchFile file : unread) {
        end.merge(file.task(), file.txid(), Math::max);
      }
      return new QueueOffset(end);
    }

    /** Whether the round wait holds back {@code unread} (see the class text); notes first sightings. */
    private boolean holdsRound(List<BatchFile> unread, int cap) {
      if (wait.producers() <= 0 || wait.millis() <= 0) {
        return false;
      }
      long now = System.nanoTime();
      long oldest = now;
      Set<Long> tasks = new HashSet<>();
      Map<Path, Long> seen = new HashMap<>();
      for (BatchFile file : unread) {
        long first = firstSeen.getOrDefault(file.path(), now);
        seen.put(file.path(), first);
        oldest = Math.min(oldest, first);
        tasks.add(file.task());
      }
      firstSeen.clear(); // files read or deleted since are forgotten
      firstSeen.putAll(seen);
      return !tasks.contains(TICKS)
          && unread.size() <= cap
          && tasks.size() < wait.producers()
          && now - oldest < wait.millis() * 1_000_000L;
    }

    private List<BatchFile> list() {
      List<BatchFile> files = new ArrayList<>();
      try (DirectoryStream<Path> entries = Files.newDirectoryStream(directory)) {
        for (Path entry : entries) {
          String name = entry.getFileName().toString();
          Matcher m = BATCH_FILE.matcher(name);
          if (m.matches() && m.group(3).equals(suffix)) {
            files.add(new BatchFile(Long.parseLong(m.group(1)), Long.parseLong(m.group(2)), entry));
            continue;
          }
          Matcher tick = TICK_FILE.matcher(name);
          if (tick.matches() && suffix.equals("jsonl")) {
            files.add(new BatchFile(TICKS, Long.parseLong(tick.group(1)), entry));
          }
        }
      } catch (NoSuchFileException e) {
        return files; // no upstream task has published yet
      } catch (IOException e) {
        throw new IllegalStateException("cannot list the shuffle queue " + directory + ": " + e, e);
      }
      return files;
    }

    private static long modified(BatchFile file) {
      try {
        return Files.getLastModifiedTime(file.path()).toMillis();
      } catch (IOException e) {
        return Long.MAX_VALUE; // deleted meanwhile (consumed): order it last
      }
    }

    @Override
    public InputPartition[] planInputPartitions(Offset start, Offset end) {
      return new InputPartition[0];
    }

    @Override
    public PartitionReaderFactory createReaderFactory() {
      return new NoRows();
    }

    @Override
    public void commit(Offset end) {}

    @Override
    public void stop() {}
  }

  /** The reader factory of a source that plans no partitions: never asked for a reader. */
  static final class NoRows implements PartitionReaderFactory, Serializable {
    @Override
    public PartitionReader<InternalRow> createReader(InputPartition partition) {
      throw new UnsupportedOperationException("a shuffle queue's batches are read by the query's foreachBatch callback");
    }
  }

  /** Per upstream task, the highest txid read; its JSON is what Spark logs and compares. */
  static final class QueueOffset extends Offset {
    private final TreeMap<Long, Long> txids;

    QueueOffset(TreeMap<Long, Long> txids) {
      this.txids = txids;
    }

    static QueueOffset parse(String json) {
      Matcher whole = OFFSET_JSON.matcher(json.strip());
      if (!whole.matches()) {
        throw new IllegalArgumentException("not a shuffle queue offset: " + json);
      }
      TreeMap<Long, Long> txids = new TreeMap<>();
      Matcher entry = OFFSET_ENTRY.matcher(whole.group(1));
      while (entry.find()) {
        txids.put(Long.parseLong(entry.group(1)), Long.parseLong(entry.group(2)));
      }
      return new QueueOffset(txids);
    }

    @Override
    public String json() {
      StringBuilder text = new StringBuilder("{\"").append(OFFSET_KEY).append("\":{");
      boolean first = true;
      for (Map.Entry<Long, Long> e : txids.entrySet()) {
        if (!first) {
          text.append(',');
        }
        text.append('"').append(e.getKey()).append("\":").append(e.getValue());
        first = false;
      }
      return text.append("}}").toString();
    }
  }
}
