package stream_ops.peers;

import java.io.BufferedReader;
import java.io.IOException;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.Arrays;
import java.util.List;
import java.util.Properties;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.common.utils.Bytes;
import org.apache.kafka.streams.KafkaStreams;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.StreamsConfig;
import org.apache.kafka.streams.errors.StreamsUncaughtExceptionHandler;
import org.apache.kafka.streams.kstream.Consumed;
import org.apache.kafka.streams.kstream.Grouped;
import org.apache.kafka.streams.kstream.Materialized;
import org.apache.kafka.streams.kstream.Produced;
import org.apache.kafka.streams.state.KeyValueStore;

/**
 * The Kafka Streams peer of bench/kafka.py: an exactly-once (exactly_once_v2) word count from an
 * input topic of {"sentence": "..."} JSON values to an output topic of word -> {"count": n}, with
 * the counts in a RocksDB state store (changelogged) and a repartition topic by word between the
 * split and the count, as the Kafka Streams DSL builds it.
 *
 * <p>One JVM serves a whole benchmark: it reads commands on stdin, one per line, and answers on
 * stdout, so its JIT is warm after the benchmark's warm-up run like the other engines':
 *
 * <pre>
 *   start APPLICATION_ID INPUT_TOPIC OUTPUT_TOPIC STATE_DIR  ->  started
 *   stop                                                      ->  stopped
 * </pre>
 *
 * <p>A failed application prints "failed: ..." and the JVM exits 1. End of stdin ends the JVM.
 *
 * <p>Arguments: BOOTSTRAP_SERVERS STREAM_THREADS COMMIT_INTERVAL_MS.
 */
public final class WordCount {
  private WordCount() {}

  public static void main(String[] args) throws IOException {
    if (args.length != 3) {
      System.err.println("usage: WordCount BOOTSTRAP_SERVERS STREAM_THREADS COMMIT_INTERVAL_MS");
      System.exit(2);
    }
    String bootstrap = args[0];
    int threads = Integer.parseInt(args[1]);
    long commitMs = Long.parseLong(args[2]);
    BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
    KafkaStreams running = null;
    String line;
    while ((line = in.readLine()) != null) {
      String[] command = line.trim().split(" ");
      if (command[0].equals("start") && command.length == 5 && running == null) {
        running = start(bootstrap, threads, commitMs, command[1], command[2], command[3], command[4]);
        answer("started");
      } else if (command[0].equals("stop") && running != null) {
        running.close(Duration.ofSeconds(30));
        running.cleanUp();
        running = null;
        answer("stopped");
      } else {
        answer("failed: unknown or out-of-order command: " + line);
        System.exit(1);
      }
    }
    if (running != null) {
      running.close(Duration.ofSeconds(30));
    }
  }

  private static void answer(String text) {
    System.out.println(text);
    System.out.flush();
  }

  static KafkaStreams start(
      String bootstrap,
      int threads,
      long commitMs,
      String applicationId,
      String inputTopic,
      String outputTopic,
      String stateDir) {
    StreamsBuilder builder = new StreamsBuilder();
    builder.stream(inputTopic, Consumed.with(Serdes.ByteArray(), Serdes.String()))
        .flatMapValues(value -> words(sentence(value)))
        .groupBy((key, word) -> word, Grouped.with("by-word", Serdes.String(), Serdes.String()))
        .count(
            Materialized.<String, Long, KeyValueStore<Bytes, byte[]>>as("counts")
                .withKeySerde(Serdes.String())
                .withValueSerde(Serdes.Long()))
        .toStream()
        .mapValues(count -> "{\"count\": " + count + "}")
        .to(outputTopic, Produced.with(Serdes.String(), Serdes.String()));

    Properties props = new Properties();
    props.put(StreamsConfig.APPLICATION_ID_CONFIG, applicationId);
    props.put(StreamsConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
    props.put(StreamsConfig.PROCESSING_GUARANTEE_CONFIG, StreamsConfig.EXACTLY_ONCE_V2);
    props.put(StreamsConfig.COMMIT_INTERVAL_MS_CONFIG, commitMs);
    props.put(StreamsConfig.NUM_STREAM_THREADS_CONFIG, threads);
    props.put(StreamsConfig.STATE_DIR_CONFIG, stateDir);
    props.put(StreamsConfig.REPLICATION_FACTOR_CONFIG, 1);
    props.put(StreamsConfig.consumerPrefix("auto.offset.reset"), "earliest");

    KafkaStreams streams = new KafkaStreams(builder.build(), props);
    streams.setUncaughtExceptionHandler(
        error -> {
          answer("failed: " + error);
          error.printStackTrace();
          Runtime.getRuntime().halt(1);
          return StreamsUncaughtExceptionHandler.StreamThreadExceptionResponse.SHUTDOWN_CLIENT;
        });
    streams.start();
    return streams;
  }

  static List<String> words(String sentence) {
    return Arrays.asList(sentence.split(" "));
  }

  /** The "sentence" string of a {"sentence": "..."} JSON object (JSON string escapes decoded). */
  static String sentence(String json) {
    int key = json.indexOf("\"sentence\"");
    if (key < 0) {
      throw new IllegalArgumentException("no \"sentence\" in " + json);
    }
    int open = json.indexOf('"', json.indexOf(':', key + 10) + 1);
    StringBuilder out = new StringBuilder();
    for (int i = open + 1; i < json.length(); i++) {
      char c = json.charAt(i);
      if (c == '"') {
        return out.toString();
      }
      if (c != '\\') {
        out.append(c);
        continue;
      }
      char e = json.charAt(++i);
      switch (e) {
        case 'n' -> out.append('\n');
        case 't' -> out.append('\t');
        case 'r' -> out.append('\r');
        case 'b' -> out.append('\b');
        case 'f' -> out.append('\f');
        case 'u' -> {
          out.append((char) Integer.parseInt(json.substring(i + 1, i + 5), 16));
          i += 4;
        }
        default -> out.append(e); // \" \\ \/
      }
    }
    throw new IllegalArgumentException("unterminated sentence in " + json);
  }
}
