// The Java side of bench/spark_read.py: the Apache Kafka Java client 3.9 (the one Spark ships)
// reading a whole topic the way Spark's executors do (assign, seek to the beginning, poll up to the
// end offsets at the isolation level, no group), timed.  Run with the source launcher:
//   java -cp <kafka-clients 3.9 jars> bench/spark_java_read.java BOOTSTRAP TOPIC ISOLATION [KEY=VALUE ...]
// (KEY=VALUE: more consumer properties).
// Prints one JSON line: {"isolation", "records", "bytes", "seconds"}.
import java.time.Duration;
import java.util.*;
import org.apache.kafka.clients.consumer.*;
import org.apache.kafka.common.PartitionInfo;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;

public class SparkJavaRead {
    public static void main(String[] args) {
        Properties p = new Properties();
        p.put("bootstrap.servers", args[0]);
        p.put("isolation.level", args[2]);
        p.put("auto.offset.reset", "none");
        p.put("enable.auto.commit", "false");
        p.put("receive.buffer.bytes", "65536");      // what Spark sets for its executors
        for (int i = 3; i < args.length; i++) p.put(args[i].split("=", 2)[0], args[i].split("=", 2)[1]);
        try (KafkaConsumer<byte[], byte[]> c = new KafkaConsumer<>(p, new ByteArrayDeserializer(),
                new ByteArrayDeserializer())) {
            List<TopicPartition> tps = new ArrayList<>();
            for (PartitionInfo info : c.partitionsFor(args[1])) tps.add(new TopicPartition(args[1], info.partition()));
            c.assign(tps);
            c.seekToBeginning(tps);
            Map<TopicPartition, Long> ends = c.endOffsets(tps);
            long records = 0, bytes = 0;
            long t0 = System.nanoTime();
            while (true) {
                // A partition read to its end is paused, as if it had a consumer of its own (Spark's
                // executors do): otherwise, once the in-flight fetch names only finished
                // partitions (the others still have records buffered), the broker rightly holds it
                // for fetch.max.wait.ms.
                boolean done = true;
                for (TopicPartition tp : tps) {
                    if (c.position(tp) < ends.get(tp)) done = false;
                    else c.pause(Collections.singleton(tp));
                }
                if (done) break;
                for (ConsumerRecord<byte[], byte[]> r : c.poll(Duration.ofMillis(500))) {
                    records++;
                    bytes += r.value() == null ? 0 : r.value().length;
                }
            }
            double seconds = (System.nanoTime() - t0) / 1e9;
            System.out.printf("{\"isolation\": \"%s\", \"records\": %d, \"bytes\": %d, \"seconds\": %.3f}%n",
                    args[2], records, bytes, seconds);
        }
    }
}
