package io.streamops.spark;

import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.atomic.AtomicReference;

import org.apache.spark.sql.Dataset;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.SQLContext;
import org.apache.spark.sql.classic.ClassicConversions$;
import org.apache.spark.sql.execution.streaming.Sink;
import org.apache.spark.sql.execution.streaming.sources.ForeachBatchSink;
import org.apache.spark.sql.execution.streaming.sources.PythonForeachBatchFunction;
import org.apache.spark.sql.sources.StreamSinkProvider;
import org.apache.spark.sql.streaming.OutputMode;

import scala.Option;
import scala.collection.immutable.Map;
import scala.collection.immutable.Seq;
import scala.runtime.BoxedUnit;

/**
 * A streaming sink that hands each micro-batch to a Python callback as it comes, unplanned.
 *
 * <p>Spark's {@code foreachBatch} sink first turns the batch into a batch Dataset over its
 * physical plan's RDD, which plans and code-generates the whole scan (20-50 ms a batch on two
 * cores) before the callback runs. A stream_ops task often never needs that plan: a source
 * batch read in Arrow from its files, or a shuffle batch whose files the callback reads itself.
 * This sink calls the callback with the streaming batch as it is; the callback asks for
 * {@link #asBatch} only when Spark computes the batch, and gets exactly what
 * {@code foreachBatch} would have given it.
 *
 * <p>Python registers its callback (a py4j proxy of Spark's {@link PythonForeachBatchFunction},
 * the interface {@code foreachBatch} uses) under an id, then starts the query with
 * {@code format("io.streamops.spark.CallbackSink").option("callback", id)}; the sink takes the
 * callback out of the registry when Spark creates it, so nothing stays registered.
 */
public final class CallbackSink implements StreamSinkProvider {
  private static final ConcurrentHashMap<String, PythonForeachBatchFunction> CALLBACKS = new ConcurrentHashMap<>();

  /** Registers {@code callback} for the query whose sink option {@code callback} is {@code id}. */
  public static void register(String id, PythonForeachBatchFunction callback) {
    CALLBACKS.put(id, callback);
  }

  /** Drops a registration no sink took (the query failed to start). */
  public static void unregister(String id) {
    CALLBACKS.remove(id);
  }

  /** How many callbacks wait for their sink (none between query starts). */
  public static int registered() {
    return CALLBACKS.size();
  }

  @Override
  public Sink createSink(SQLContext sqlContext, Map<String, String> parameters, Seq<String> partitionColumns, OutputMode outputMode) {
    Option<String> id = parameters.get("callback");
    if (id.isEmpty()) {
      throw new IllegalArgumentException("CallbackSink needs the option 'callback' (a registered callback's id)");
    }
    PythonForeachBatchFunction callback = CALLBACKS.remove(id.get());
    if (callback == null) {
      throw new IllegalArgumentException("no callback registered under id " + id.get());
    }
    return new Calling(callback, id.get());
  }

  /**
   * The micro-batch {@code data} as the batch Dataset Spark's {@code foreachBatch} sink would
   * hand its function: Spark's own sink does the conversion (plans the RDD).
   */
  public static Dataset<Row> asBatch(Dataset<Row> data, long batchId) {
    AtomicReference<Dataset<Row>> batch = new AtomicReference<>();
    scala.Function2<Dataset<Row>, Object, BoxedUnit> keep = (ds, id) -> {
      batch.set(ds);
      return BoxedUnit.UNIT;
    };
    new ForeachBatchSink<Row>(keep, ClassicConversions$.MODULE$.castToImpl(data).exprEnc()).addBatch(batchId, data);
    return batch.get();
  }

  private static final class Calling implements Sink {
    private final PythonForeachBatchFunction callback;
    private final String id;

    Calling(PythonForeachBatchFunction callback, String id) {
      this.callback = callback;
      this.id = id;
    }

    @Override
    public void addBatch(long batchId, Dataset<Row> data) {
      callback.call(data, batchId);
    }

    @Override
    public String toString() {
      return "stream_ops CallbackSink[" + id + "]";
    }
  }
}
