package io.streamops.spark;

import java.io.IOException;
import java.lang.reflect.Field;
import java.lang.reflect.Method;
import java.nio.file.DirectoryStream;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.nio.file.attribute.FileTime;
import java.util.HashMap;
import java.util.Map;
import java.util.regex.Matcher;
import java.util.regex.Pattern;

import org.apache.spark.util.Clock;

/**
 * The clock of a shuffle-reading query's processing-time trigger that ends the wait for the
 * next trigger as soon as a round of upstream batches has landed in the query's input
 * directory, instead of at the next multiple of the interval.
 *
 * <p>A round is complete when every upstream task has published a batch file newer than what
 * it had published when the last round completed, and at least one of those files was not yet
 * read. When a timed trigger read part of a round (it fired between two upstream tasks'
 * publications), the rest of the round ends the next wait as soon as it lands. An upstream
 * task that publishes nothing for this queue leaves the query on its trigger, as without this
 * clock.
 *
 * <p>Only the wait between triggers changes: Spark's file source still lists the directory
 * and logs each batch's files, so what a batch reads, and its replay, are as before. The
 * directory's modification time is checked every {@code pollMillis}; the directory is read
 * only when it changed. Batch files are named {@code t<task>-x<txid>-e<epoch>.<suffix>}
 * (hidden temp files start with a dot and do not match).
 */
public final class InputWakeClock implements Clock {
  /** The batch-file names of {@code stream_ops.topics.file_topic.batch_file_name}. */
  private static final Pattern BATCH_FILE = Pattern.compile("t(\\d+)-x(\\d+)-e\\d+\\.[a-z]+");

  private final Path directory;
  private final int producers;
  private final long pollMillis;
  /** Each upstream task's newest txid when the last round completed. */
  private Map<Long, Long> roundStart;
  /** Each upstream task's newest txid when the last wait ended: what the trigger after it read. */
  private Map<Long, Long> read;
  private FileTime seenModified;
  private Map<Long, Long> seen;
  private volatile long wakes;

  /**
   * @param directory the query's input directory
   * @param producers the upstream tasks that publish into it
   * @param pollMillis how often the directory's modification time is checked
   */
  public InputWakeClock(String directory, int producers, long pollMillis) {
    this.directory = Paths.get(directory);
    this.producers = Math.max(1, producers);
    this.pollMillis = Math.max(1L, pollMillis);
    // Nothing counts as read yet: files already there when the query starts may still be
    // unread (the queue source holds an incomplete round back), so they count towards the
    // first round. Where they were read, that round's wake finds nothing new: one listing.
    this.read = new HashMap<>();
    this.roundStart = read;
  }

  @Override
  public long getTimeMillis() {
    return System.currentTimeMillis();
  }

  @Override
  public long nanoTime() {
    return System.nanoTime();
  }

  /** Waits until {@code targetTime} or until a round of upstream batches landed; returns the time. */
  @Override
  public long waitTillTime(long targetTime) {
    while (true) {
      long now = System.currentTimeMillis();
      Map<Long, Long> current = newest();
      boolean roundComplete = newer(current, roundStart) >= producers;
      if (roundComplete && newer(current, read) > 0) {
        roundStart = current;
        read = current;
        wakes++;
        return now;
      }
      if (now >= targetTime) {
        if (roundComplete) {
          roundStart = current;
        }
        read = current;
        return now;
      }
      try {
        Thread.sleep(Math.min(pollMillis, targetTime - now));
      } catch (InterruptedException e) {
        // The query is stopping: Spark's own clock lets the interrupt out of this call, and the
        // query's thread expects it (Clock declares no exceptions: Scala has no checked ones).
        throw InputWakeClock.<RuntimeException>rethrow(e);
      }
    }
  }

  @SuppressWarnings("unchecked")
  private static <E extends Throwable> E rethrow(Throwable e) throws E {
    throw (E) e;
  }

  /** How many waits ended early because the input advanced. */
  public long wakes() {
    return wakes;
  }

  /** How many upstream tasks have a newer file in {@code current} than in {@code than}. */
  private static int newer(Map<Long, Long> current, Map<Long, Long> than) {
    int count = 0;
    for (Map.Entry<Long, Long> entry : current.entrySet()) {
      Long before = than.get(entry.getKey());
      if (before == null || entry.getValue() > before) {
        count++;
      }
    }
    return count;
  }

  /** Each upstream task's newest txid in the directory (the last listing while it is unchanged). */
  private Map<Long, Long> newest() {
    FileTime modified;
    try {
      modified = Files.getLastModifiedTime(directory);
    } catch (IOException e) {
      return seen == null ? new HashMap<>() : seen;
    }
    if (seen != null && modified.equals(seenModified)) {
      return seen;
    }
    Map<Long, Long> found = new HashMap<>();
    try (DirectoryStream<Path> entries = Files.newDirectoryStream(directory)) {
      for (Path entry : entries) {
        Matcher m = BATCH_FILE.matcher(entry.getFileName().toString());
        if (m.matches()) {
          found.merge(Long.parseLong(m.group(1)), Long.parseLong(m.group(2)), Math::max);
        }
      }
    } catch (IOException e) {
      return seen == null ? found : seen;
    }
    seen = found;
    seenModified = modified;
    return found;
  }

  /**
   * Makes a started query's processing-time trigger wait on {@code clock}.
   *
   * <p>Spark gives no way to pass a clock to {@code DataStreamWriter.start()}, so the trigger
   * executor's {@code clock} field is set by reflection; the executor reads it at every wait.
   * The executor exists once the query's thread has planned its sources, shortly after
   * {@code start()} returns, and the first wait comes after the first batch. Returns false,
   * changing nothing, when the query is not a micro-batch query with a processing-time
   * trigger, Spark's classes differ, or the executor did not appear within
   * {@code timeoutMillis}.
   *
   * @param query the JVM side of a PySpark StreamingQuery (a StreamingQueryWrapper)
   */
  public static boolean install(Object query, InputWakeClock clock, long timeoutMillis) {
    try {
      Object execution = call(query, "streamingQuery");
      long deadline = System.currentTimeMillis() + timeoutMillis;
      Object executor = call(execution, "triggerExecutor");
      while (executor == null && System.currentTimeMillis() < deadline) {
        Thread.sleep(2);
        executor = call(execution, "triggerExecutor");
      }
      if (executor == null || !executor.getClass().getSimpleName().equals("ProcessingTimeExecutor")) {
        return false;
      }
      Field field = executor.getClass().getDeclaredField("clock");
      field.setAccessible(true);
      field.set(executor, clock);
      return field.get(executor) == clock;
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
      return false;
    } catch (ReflectiveOperationException | RuntimeException e) {
      return false;
    }
  }

  private static Object call(Object target, String name) throws ReflectiveOperationException {
    Method method = target.getClass().getMethod(name);
    return method.invoke(target);
  }
}
