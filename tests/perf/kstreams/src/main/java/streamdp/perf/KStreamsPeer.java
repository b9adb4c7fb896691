package streamdp.perf;

import java.nio.file.Files;
import java.time.Duration;
import java.util.HashMap;
import java.util.Map;
import java.util.Properties;
import java.util.concurrent.atomic.AtomicLong;
import java.util.concurrent.atomic.AtomicReference;

import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.streams.KafkaStreams;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.StreamsConfig;
import org.apache.kafka.streams.kstream.Consumed;
import org.apache.kafka.streams.kstream.Grouped;
import org.apache.kafka.streams.errors.StreamsUncaughtExceptionHandler;
import org.apache.kafka.streams.kstream.TimeWindows;

/**
 * The Kafka Streams peer of the ingest stage, built the obvious Kafka Streams way.
 *
 * <pre>java -jar target/kstreams-peer.jar --bootstrap HOST:PORT --topic T --app-id ID --stop-after N</pre>
 *
 * <p>One stream thread (the default), default settings otherwise: a tumbling one-minute window of
 * event time (the record timestamps, 5 s grace as the worker's allowed lateness) counting records per
 * record key (the unit id), in Kafka Streams' default RocksDB window store with its changelog topic. The
 * values are not decoded: less work than stream-dp does per event (no JSON, no bound, no sum, no close,
 * budget or noise), which favours Kafka Streams in the comparison.
 *
 * <p>Progress goes to stdout as {@code progress <unix time> <events>} lines every {@code --report-every}
 * events and {@code done} after {@code --stop-after}; the harness (bench_peers.py) takes the rate from
 * them. The peer then closes its streams and exits.
 */
public final class KStreamsPeer {
    private KStreamsPeer() {}

    public static void main(String[] argv) throws Exception {
        Map<String, String> args = new HashMap<>();
        for (int i = 0; i + 1 < argv.length; i += 2) {
            if (!argv[i].startsWith("--")) {
                throw new IllegalArgumentException("expected --name value pairs, got " + argv[i]);
            }
            args.put(argv[i].substring(2), argv[i + 1]);
        }
        String topic = require(args, "topic");
        long stopAfter = Long.parseLong(require(args, "stop-after"));
        long reportEvery = Long.parseLong(args.getOrDefault("report-every", String.valueOf(Math.max(1_000, stopAfter / 20))));

        Properties props = new Properties();
        props.put(StreamsConfig.APPLICATION_ID_CONFIG, require(args, "app-id"));
        props.put(StreamsConfig.BOOTSTRAP_SERVERS_CONFIG, require(args, "bootstrap"));
        props.put(StreamsConfig.STATE_DIR_CONFIG,
                args.getOrDefault("state-dir", Files.createTempDirectory("kstreams-peer-").toString()));
        // The topic is pre-produced: read it from the start (the default would wait for new records).
        props.put(StreamsConfig.consumerPrefix(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG), "earliest");

        AtomicLong counted = new AtomicLong();
        StreamsBuilder builder = new StreamsBuilder();
        builder.stream(topic, Consumed.with(Serdes.Bytes(), Serdes.Bytes()))
                .peek((key, value) -> counted.incrementAndGet())
                .groupByKey(Grouped.with(Serdes.Bytes(), Serdes.Bytes()))
                .windowedBy(TimeWindows.ofSizeAndGrace(Duration.ofMinutes(1), Duration.ofSeconds(5)))
                .count();

        KafkaStreams streams = new KafkaStreams(builder.build(), props);
        AtomicReference<Throwable> failed = new AtomicReference<>();
        streams.setUncaughtExceptionHandler(exception -> {
            failed.set(exception);
            return StreamsUncaughtExceptionHandler.StreamThreadExceptionResponse.SHUTDOWN_CLIENT;
        });
        streams.start();
        long nextReport = 1;
        try {
            while (true) {
                long n = counted.get();
                if (n >= nextReport) {
                    System.out.printf("progress %.6f %d%n", System.currentTimeMillis() / 1000.0, n);
                    System.out.flush();
                    nextReport = (n / reportEvery + 1) * reportEvery;
                }
                if (failed.get() != null) {
                    System.err.println("the stream thread failed after " + n + " events: " + failed.get());
                    failed.get().printStackTrace();
                    System.exit(2);
                }
                if (n >= stopAfter) {
                    System.out.println("done");
                    System.out.flush();
                    break;
                }
                Thread.sleep(1);
            }
        } finally {
            streams.close(Duration.ofSeconds(30));
            streams.cleanUp();
        }
    }

    private static String require(Map<String, String> args, String name) {
        String value = args.get(name);
        if (value == null) {
            throw new IllegalArgumentException("--" + name + " is required");
        }
        return value;
    }
}
