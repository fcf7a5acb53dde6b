// Line-oriented JSON driver for the stock Apache Kafka Java client.
//
// Usage: java -cp <kafka-clients + runtime deps>:<classes> Harness <bootstrap>
//
// Reads one JSON object per line on stdin, writes exactly one JSON object per
// line on stdout.  Every response carries "ok" (true/false); failures carry
// "error" ("ExceptionClass: message"), "error_class" (full class name) and,
// when the exception has causes, "causes" (["ExceptionClass: message", ...]).
// All logging goes to stderr (System.out is redirected to stderr so nothing
// but protocol lines can reach the real stdout).
//
// The same source compiles against kafka-clients 3.9.0 and 4.3.0, so only
// APIs present in both are used.
//
// Byte payloads travel as base64 strings ("key_b64", "value_b64", header
// values); null stays null.  Client defaults: request/api timeouts 10 s,
// delivery.timeout.ms 15 s, max.block.ms 10 s; "config" objects override
// (a null value removes a default).  Logging level: HARNESS_LOG_LEVEL.
// HARNESS_CLIENT_CONFIG: a JSON object of client properties given to every
// client the harness creates (admin, producers, consumers) over its defaults,
// e.g. security.protocol, sasl.mechanism, sasl.jaas.config, ssl.truststore.*;
// a command's "config" still overrides them.
//
// Commands ("op"):
//   version | exit | selftest_codec {codec}   (codec round trip, no broker)
//   create_topic {topic, partitions?, replication_factor?, configs?, validate_only?}
//   delete_topic {topic}            list_topics {internal?} -> topics
//   describe_topic {topic} -> partitions [{partition, leader, replicas, isr}]
//   describe_configs {topic} -> configs {name: value}, sources {name: source}
//   create_partitions {topic, count}
//   delete_records {topic, partition, before_offset} -> low_watermark
//   alter_config {topic, key, value|null, operation?}  (incremental; null = DELETE)
//   describe_cluster -> cluster_id, controller, nodes
//   list_offsets {topic, partition, spec: earliest|latest|max_timestamp|<ms>,
//                 isolation?} -> offset, timestamp, leader_epoch   (Admin)
//   consumer_offsets {topic, partitions, config?} -> offsets [{partition,
//                 beginning, end}]   (KafkaConsumer beginningOffsets/endOffsets)
//   list_groups | describe_group {group} | group_offsets {group} | delete_group {group}
//   describe_log_dirs -> dirs [{broker, path, error, total_bytes, usable_bytes,
//       replicas: [{topic, partition, size, offset_lag, future}]}]      (every broker)
//   list_reassignments {partitions?: [[topic, partition]]} -> reassignments
//       [{topic, partition, replicas, adding, removing}]
//   alter_reassignments {reassignments: [[topic, partition, [broker ids] | null]]}
//       -> results [[topic, partition, error | null]]  (null replicas = cancel)
//   describe_client_quotas {user?} -> entries [{entity: {type: name}, values: {key: value}}]
//       (no user: every entity; a user: that user's quotas)
//   describe_metadata_quorum -> leader, high_watermark, voters [{id, log_end_offset}], observers [ids]
//   alter_replica_log_dirs {moves: [[topic, partition, broker, path]]} -> results [[topic, partition, error | null]]
//   create_delegation_token -> error (the exception's simple name, or null)
//   produce {topic, records, config?, txn?: commit|abort, handle?}
//       records: [{partition|null, key_b64, value_b64, headers: [[k, v_b64]], timestamp|null}]
//       -> offsets [[partition, offset]] (record order), timestamps; on failure
//       ok=false, error (first), errors (per record, null = delivered).
//       A producer is created and closed per command unless "handle" names
//       one to keep (close_producer {handle?}).  transactional.id in config
//       -> initTransactions(); with "txn" the records go in one transaction.
//       Without "txn", records sent through a kept producer whose
//       transaction was opened by begin_txn join that transaction.
//   init_producer {handle, config?}   a kept producer (initTransactions()
//       when config has transactional.id); "handle" must be new.
//   begin_txn {handle} | commit_txn {handle} | abort_txn {handle}
//       beginTransaction / commitTransaction / abortTransaction on a kept
//       producer (the transaction's records: produce {handle, ...}).
//   send {handle, topic, records}   send() on a kept producer without
//       waiting (no flush): what an application does right before
//       abortTransaction(), which then drops the batches not yet sent.
//   send_offsets_to_txn {handle, consumer?, offsets?: [[topic, partition, offset, metadata?]]}
//       sendOffsetsToTransaction(offsets, consumer.groupMetadata()) with the
//       group consumer "consumer" (default "default"); offsets default to
//       that consumer's positions on its assignment.  -> offsets [[topic,
//       partition, offset]], group, generation_id, member_id.
//   consume {topic, partition|partitions, offset: N|earliest|latest, count,
//            timeout_ms, config?, until_end?}  assign()+seek(), no group;
//       auto.offset.reset defaults to "none" (out of range = error).
//       -> records, position, timed_out.  Records: {topic, partition,
//       offset, key_b64, value_b64, headers, timestamp, timestamp_type,
//       leader_epoch}.  With until_end the command also stops once every
//       position has reached the endOffsets() taken after the seek (the
//       consumer's isolation level: LSO for read_committed) and returns
//       them as end_offsets [[partition, end]].
//   subscribe {topic|topics, group, config?, handle?}   (kept open; group
//       consumers default to auto.offset.reset=earliest, no auto commit)
//   poll {timeout_ms, max?, handle?} -> records, assignment, events
//       (rebalance callbacks since the last poll).  With max, polls until max
//       records or timeout and seeks back over records not returned.
//   assignment | commit {offsets?: [[topic, partition, offset, metadata?]]}
//   positions {handle?} -> positions [[topic, partition, position]] (assignment)
//   committed {topic, partitions, group?} -> [[partition, offset|null, metadata]]
//   close_consumer {handle?}

import java.io.BufferedReader;
import java.io.ByteArrayOutputStream;
import java.io.FileDescriptor;
import java.io.FileOutputStream;
import java.io.InputStream;
import java.io.InputStreamReader;
import java.io.OutputStream;
import java.io.PrintStream;
import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.*;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.Future;
import java.util.concurrent.TimeUnit;

import org.apache.kafka.clients.admin.*;
import org.apache.kafka.clients.consumer.ConsumerRebalanceListener;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.ConsumerRecords;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.consumer.OffsetAndMetadata;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.clients.producer.RecordMetadata;
import org.apache.kafka.common.IsolationLevel;
import org.apache.kafka.common.KafkaFuture;
import org.apache.kafka.common.Node;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.TopicPartitionInfo;
import org.apache.kafka.common.config.ConfigResource;
import org.apache.kafka.common.header.Header;
import org.apache.kafka.common.header.internals.RecordHeader;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;
import org.apache.kafka.common.serialization.ByteArraySerializer;

public class Harness {
    static final long DEFAULT_TIMEOUT_MS = 10_000;
    static final long FUTURE_SLACK_MS = 5_000;

    final String bootstrap;
    Admin admin;
    final Map<String, KafkaProducer<byte[], byte[]>> producers = new HashMap<>();
    final Map<String, GroupConsumer> consumers = new HashMap<>();

    /** HARNESS_CLIENT_CONFIG: properties every client gets (a connection's security settings). */
    final Map<String, String> clientConfig = new LinkedHashMap<>();

    Harness(String bootstrap) {
        this.bootstrap = bootstrap;
        String text = System.getenv("HARNESS_CLIENT_CONFIG");
        if (text != null && !text.trim().isEmpty()) {
            Object parsed = Json.parse(text);
            if (!(parsed instanceof Map)) throw new IllegalArgumentException("HARNESS_CLIENT_CONFIG must be a JSON object");
            for (Map.Entry<?, ?> e : ((Map<?, ?>) parsed).entrySet())
                clientConfig.put(String.valueOf(e.getKey()), Json.scalarString(e.getValue()));
        }
    }

    /** Thrown for bad commands; reported as {"ok":false,"error":"BadCommand: ..."}. */
    static class BadCommand extends RuntimeException {
        BadCommand(String m) { super(m); }
    }

    // ------------------------------------------------------------------ main

    public static void main(String[] args) throws Exception {
        PrintStream out = new PrintStream(new FileOutputStream(FileDescriptor.out), true, "UTF-8");
        System.setOut(System.err);
        if (args.length < 1) {
            System.err.println("usage: Harness <bootstrap-servers>");
            System.exit(2);
        }
        Harness h = new Harness(args[0]);
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        String line;
        boolean exit = false;
        while (!exit && (line = in.readLine()) != null) {
            if (line.trim().isEmpty()) continue;
            Map<String, Object> resp;
            try {
                Object parsed = Json.parse(line);
                if (!(parsed instanceof Map)) throw new BadCommand("command must be a JSON object");
                @SuppressWarnings("unchecked")
                Map<String, Object> cmd = (Map<String, Object>) parsed;
                String op = str(cmd, "op", null);
                if (op == null) throw new BadCommand("missing \"op\"");
                if (op.equals("exit")) exit = true;
                resp = h.dispatch(op, cmd);
                if (!resp.containsKey("ok")) {
                    Map<String, Object> r = new LinkedHashMap<>();
                    r.put("ok", true);
                    r.putAll(resp);
                    resp = r;
                }
            } catch (Throwable t) {
                resp = error(t);
            }
            String text;
            try {
                text = Json.write(resp);
            } catch (Throwable t) {
                text = Json.write(error(t));
            }
            out.println(text);
            out.flush();
        }
        h.closeAll();
        out.flush();
        System.exit(0);
    }

    static Map<String, Object> error(Throwable t) {
        Throwable c = unwrap(t);
        if (!(c instanceof BadCommand) && !(c instanceof org.apache.kafka.common.KafkaException)) {
            c.printStackTrace(System.err);
        }
        Map<String, Object> r = new LinkedHashMap<>();
        r.put("ok", false);
        String name = c instanceof BadCommand ? "BadCommand" : c.getClass().getSimpleName();
        r.put("error", name + ": " + c.getMessage());
        r.put("error_class", c.getClass().getName());
        List<Object> causes = new ArrayList<>();
        for (Throwable x = c.getCause(); x != null && x != c && causes.size() < 8; x = x.getCause())
            causes.add(x.getClass().getSimpleName() + ": " + x.getMessage());
        if (!causes.isEmpty()) r.put("causes", causes);
        return r;
    }

    static Throwable unwrap(Throwable t) {
        while ((t instanceof ExecutionException || t instanceof java.util.concurrent.CompletionException)
                && t.getCause() != null) {
            t = t.getCause();
        }
        return t;
    }

    Map<String, Object> dispatch(String op, Map<String, Object> c) throws Exception {
        switch (op) {
            case "exit": return obj("ok", true);
            case "version": return obj("client", "java", "version",
                    org.apache.kafka.common.utils.AppInfoParser.getVersion());
            case "selftest_codec": return selftestCodec(c);
            case "create_topic": return createTopic(c);
            case "delete_topic": return deleteTopic(c);
            case "list_topics": return listTopics(c);
            case "describe_topic": return describeTopic(c);
            case "describe_configs": return describeConfigs(c);
            case "create_partitions": return createPartitions(c);
            case "delete_records": return deleteRecords(c);
            case "alter_config": return alterConfig(c);
            case "describe_cluster": return describeCluster(c);
            case "list_offsets": return listOffsets(c);
            case "consumer_offsets": return consumerOffsets(c);
            case "list_groups": return listGroups(c);
            case "describe_group": return describeGroup(c);
            case "group_offsets": return groupOffsets(c);
            case "delete_group": return deleteGroup(c);
            case "list_transactions": return listTransactions(c);
            case "describe_transactions": return describeTransactions(c);
            case "describe_producers": return describeProducers(c);
            case "abort_transaction": return abortTransaction(c);
            case "describe_features": return describeFeatures(c);
            case "update_features": return updateFeatures(c);
            case "bench_produce": return benchProduce(c);
            case "describe_log_dirs": return describeLogDirs(c);
            case "list_reassignments": return listReassignments(c);
            case "alter_reassignments": return alterReassignments(c);
            case "describe_client_quotas": return describeClientQuotas(c);
            case "describe_metadata_quorum": return describeMetadataQuorum(c);
            case "alter_replica_log_dirs": return alterReplicaLogDirs(c);
            case "create_delegation_token": return createDelegationToken(c);
            case "produce": return produce(c);
            case "close_producer": return closeProducer(c);
            case "init_producer": return initProducer(c);
            case "begin_txn": keptProducer(c).beginTransaction(); return obj("ok", true);
            case "commit_txn": keptProducer(c).commitTransaction(); return obj("ok", true);
            case "abort_txn": keptProducer(c).abortTransaction(); return obj("ok", true);
            case "send": return send(c);
            case "send_offsets_to_txn": return sendOffsetsToTxn(c);
            case "positions": return positions(c);
            case "consume": return consume(c);
            case "subscribe": return subscribe(c);
            case "poll": return poll(c);
            case "assignment": return assignment(c);
            case "commit": return commit(c);
            case "committed": return committed(c);
            case "close_consumer": return closeConsumer(c);
            default: throw new BadCommand("unknown op " + op);
        }
    }

    void closeAll() {
        for (GroupConsumer g : consumers.values()) {
            try { g.consumer.close(Duration.ofSeconds(5)); } catch (Throwable t) { /* ignore */ }
        }
        consumers.clear();
        for (KafkaProducer<byte[], byte[]> p : producers.values()) {
            try { p.close(Duration.ofSeconds(5)); } catch (Throwable t) { /* ignore */ }
        }
        producers.clear();
        if (admin != null) {
            try { admin.close(Duration.ofSeconds(5)); } catch (Throwable t) { /* ignore */ }
            admin = null;
        }
    }

    // ---------------------------------------------------------------- config

    static Properties props(Map<String, Object> c, Map<String, String> defaults, String key) {
        Properties p = new Properties();
        p.putAll(defaults);
        Object cfg = c.get(key);
        if (cfg != null) {
            if (!(cfg instanceof Map)) throw new BadCommand("\"" + key + "\" must be an object");
            for (Map.Entry<?, ?> e : ((Map<?, ?>) cfg).entrySet()) {
                if (e.getValue() == null) p.remove(e.getKey());
                else p.put(String.valueOf(e.getKey()), Json.scalarString(e.getValue()));
            }
        }
        return p;
    }

    Map<String, String> commonDefaults() {
        Map<String, String> d = new LinkedHashMap<>();
        d.put("bootstrap.servers", bootstrap);
        d.put("request.timeout.ms", String.valueOf(DEFAULT_TIMEOUT_MS));
        d.put("default.api.timeout.ms", String.valueOf(DEFAULT_TIMEOUT_MS));
        d.put("reconnect.backoff.max.ms", "1000");
        d.put("retry.backoff.max.ms", "1000");
        d.putAll(clientConfig);
        return d;
    }

    Map<String, String> producerDefaults() {
        Map<String, String> d = new LinkedHashMap<>();
        d.put("bootstrap.servers", bootstrap);
        d.put("request.timeout.ms", String.valueOf(DEFAULT_TIMEOUT_MS));
        d.put("delivery.timeout.ms", String.valueOf(DEFAULT_TIMEOUT_MS + 5_000));
        d.put("max.block.ms", String.valueOf(DEFAULT_TIMEOUT_MS));
        d.put("reconnect.backoff.max.ms", "1000");
        d.put("key.serializer", ByteArraySerializer.class.getName());
        d.put("value.serializer", ByteArraySerializer.class.getName());
        d.putAll(clientConfig);
        return d;
    }

    Map<String, String> consumerDefaults() {
        Map<String, String> d = commonDefaults();
        d.put("key.deserializer", ByteArrayDeserializer.class.getName());
        d.put("value.deserializer", ByteArrayDeserializer.class.getName());
        d.put("enable.auto.commit", "false");
        d.put("auto.offset.reset", "none");
        return d;
    }

    Admin admin() {
        if (admin == null) {
            Properties p = new Properties();
            p.putAll(commonDefaults());
            admin = Admin.create(p);
        }
        return admin;
    }

    static <T> T get(KafkaFuture<T> f) throws Exception {
        return f.get(DEFAULT_TIMEOUT_MS + FUTURE_SLACK_MS, TimeUnit.MILLISECONDS);
    }

    // ----------------------------------------------------------------- admin

    Map<String, Object> createTopic(Map<String, Object> c) throws Exception {
        String topic = str(c, "topic", null);
        if (topic == null) throw new BadCommand("missing topic");
        Optional<Integer> parts = c.get("partitions") == null ? Optional.empty()
                : Optional.of((int) lng(c, "partitions", 1));
        Optional<Short> rf = c.get("replication_factor") == null ? Optional.empty()
                : Optional.of((short) lng(c, "replication_factor", 1));
        NewTopic nt = new NewTopic(topic, parts, rf);
        Object cfg = c.get("configs");
        if (cfg instanceof Map) {
            Map<String, String> m = new HashMap<>();
            for (Map.Entry<?, ?> e : ((Map<?, ?>) cfg).entrySet())
                m.put(String.valueOf(e.getKey()), e.getValue() == null ? null : Json.scalarString(e.getValue()));
            nt.configs(m);
        }
        CreateTopicsOptions opts = new CreateTopicsOptions();
        if (bool(c, "validate_only", false)) opts.validateOnly(true);
        CreateTopicsResult r = admin().createTopics(Collections.singleton(nt), opts);
        get(r.all());
        Map<String, Object> res = obj("ok", true);
        try {
            res.put("partitions", get(r.numPartitions(topic)));
        } catch (Exception e) { /* older brokers may not return it */ }
        return res;
    }

    Map<String, Object> deleteTopic(Map<String, Object> c) throws Exception {
        get(admin().deleteTopics(Collections.singleton(str(c, "topic", null))).all());
        return obj("ok", true);
    }

    Map<String, Object> listTopics(Map<String, Object> c) throws Exception {
        ListTopicsOptions o = new ListTopicsOptions().listInternal(bool(c, "internal", false));
        List<String> names = new ArrayList<>(get(admin().listTopics(o).names()));
        Collections.sort(names);
        return obj("ok", true, "topics", names);
    }

    static Object nodeId(Node n) {
        return n == null || n.isEmpty() ? null : (Object) n.id();
    }

    Map<String, Object> describeTopic(Map<String, Object> c) throws Exception {
        String topic = str(c, "topic", null);
        Map<String, TopicDescription> m = get(admin().describeTopics(Collections.singleton(topic)).allTopicNames());
        TopicDescription d = m.get(topic);
        List<Object> parts = new ArrayList<>();
        for (TopicPartitionInfo p : d.partitions()) {
            List<Object> replicas = new ArrayList<>();
            for (Node n : p.replicas()) replicas.add(n.id());
            List<Object> isr = new ArrayList<>();
            for (Node n : p.isr()) isr.add(n.id());
            parts.add(obj("partition", p.partition(), "leader", nodeId(p.leader()),
                    "replicas", replicas, "isr", isr));
        }
        return obj("ok", true, "topic", d.name(), "internal", d.isInternal(),
                "topic_id", d.topicId() == null ? null : d.topicId().toString(), "partitions", parts);
    }

    Map<String, Object> describeConfigs(Map<String, Object> c) throws Exception {
        ConfigResource res = new ConfigResource(ConfigResource.Type.TOPIC, str(c, "topic", null));
        Map<ConfigResource, Config> m = get(admin().describeConfigs(Collections.singleton(res)).all());
        Map<String, Object> configs = new TreeMap<>();
        Map<String, Object> sources = new TreeMap<>();
        for (ConfigEntry e : m.get(res).entries()) {
            configs.put(e.name(), e.value());
            sources.put(e.name(), e.source() == null ? null : e.source().name());
        }
        return obj("ok", true, "configs", configs, "sources", sources);
    }

    Map<String, Object> createPartitions(Map<String, Object> c) throws Exception {
        Map<String, NewPartitions> m = Collections.singletonMap(str(c, "topic", null),
                NewPartitions.increaseTo((int) lng(c, "count", -1)));
        get(admin().createPartitions(m).all());
        return obj("ok", true);
    }

    Map<String, Object> deleteRecords(Map<String, Object> c) throws Exception {
        TopicPartition tp = new TopicPartition(str(c, "topic", null), (int) lng(c, "partition", 0));
        DeleteRecordsResult r = admin().deleteRecords(
                Collections.singletonMap(tp, RecordsToDelete.beforeOffset(lng(c, "before_offset", -1))));
        DeletedRecords d = get(r.lowWatermarks().get(tp));
        return obj("ok", true, "low_watermark", d.lowWatermark());
    }

    Map<String, Object> alterConfig(Map<String, Object> c) throws Exception {
        ConfigResource res = new ConfigResource(ConfigResource.Type.TOPIC, str(c, "topic", null));
        Object v = c.get("value");
        String opName = str(c, "operation", v == null ? "DELETE" : "SET").toUpperCase(Locale.ROOT);
        AlterConfigOp.OpType type = AlterConfigOp.OpType.valueOf(opName);
        AlterConfigOp op = new AlterConfigOp(new ConfigEntry(str(c, "key", null),
                v == null ? null : Json.scalarString(v)), type);
        Map<ConfigResource, Collection<AlterConfigOp>> m =
                Collections.singletonMap(res, Collections.singletonList(op));
        get(admin().incrementalAlterConfigs(m).all());
        return obj("ok", true);
    }

    Map<String, Object> describeCluster(Map<String, Object> c) throws Exception {
        DescribeClusterResult r = admin().describeCluster();
        List<Object> nodes = new ArrayList<>();
        for (Node n : get(r.nodes()))
            nodes.add(obj("id", n.id(), "host", n.host(), "port", n.port(), "rack", n.rack()));
        return obj("ok", true, "cluster_id", get(r.clusterId()), "controller", nodeId(get(r.controller())),
                "nodes", nodes);
    }

    static IsolationLevel isolation(Map<String, Object> c) {
        String iso = str(c, "isolation", "read_uncommitted");
        return IsolationLevel.valueOf(iso.toUpperCase(Locale.ROOT));
    }

    Map<String, Object> listOffsets(Map<String, Object> c) throws Exception {
        TopicPartition tp = new TopicPartition(str(c, "topic", null), (int) lng(c, "partition", 0));
        Object spec = c.get("spec");
        OffsetSpec os;
        if (spec == null || "latest".equals(spec)) os = OffsetSpec.latest();
        else if ("earliest".equals(spec)) os = OffsetSpec.earliest();
        else if ("max_timestamp".equals(spec)) os = OffsetSpec.maxTimestamp();
        else if (spec instanceof Number) os = OffsetSpec.forTimestamp(((Number) spec).longValue());
        else if (spec instanceof String && ((String) spec).matches("-?[0-9]+"))
            os = OffsetSpec.forTimestamp(Long.parseLong((String) spec));
        else throw new BadCommand("bad spec " + spec);
        ListOffsetsResult r = admin().listOffsets(Collections.singletonMap(tp, os),
                new ListOffsetsOptions(isolation(c)));
        ListOffsetsResult.ListOffsetsResultInfo info = get(r.partitionResult(tp));
        return obj("ok", true, "offset", info.offset(), "timestamp", info.timestamp(),
                "leader_epoch", info.leaderEpoch().orElse(null));
    }

    List<TopicPartition> partitionsArg(Map<String, Object> c, String topic) {
        List<TopicPartition> tps = new ArrayList<>();
        Object ps = c.get("partitions");
        if (ps instanceof List) {
            for (Object p : (List<?>) ps) tps.add(new TopicPartition(topic, ((Number) p).intValue()));
        } else if (ps instanceof Number) {
            // "partitions": N means partitions 0..N-1
            for (int i = 0; i < ((Number) ps).intValue(); i++) tps.add(new TopicPartition(topic, i));
        } else {
            tps.add(new TopicPartition(topic, (int) lng(c, "partition", 0)));
        }
        return tps;
    }

    Map<String, Object> consumerOffsets(Map<String, Object> c) throws Exception {
        String topic = str(c, "topic", null);
        List<TopicPartition> tps = partitionsArg(c, topic);
        Properties p = props(c, consumerDefaults(), "config");
        try (KafkaConsumer<byte[], byte[]> consumer = new KafkaConsumer<>(p)) {
            Duration t = Duration.ofMillis(lng(c, "timeout_ms", DEFAULT_TIMEOUT_MS));
            Map<TopicPartition, Long> b = consumer.beginningOffsets(tps, t);
            Map<TopicPartition, Long> e = consumer.endOffsets(tps, t);
            List<Object> rows = new ArrayList<>();
            for (TopicPartition tp : tps)
                rows.add(obj("partition", tp.partition(), "beginning", b.get(tp), "end", e.get(tp)));
            return obj("ok", true, "offsets", rows);
        }
    }

    Map<String, Object> listGroups(Map<String, Object> c) throws Exception {
        @SuppressWarnings("deprecation")
        Collection<ConsumerGroupListing> all = get(admin().listConsumerGroups().all());
        List<String> names = new ArrayList<>();
        for (ConsumerGroupListing l : all) names.add(l.groupId());
        Collections.sort(names);
        return obj("ok", true, "groups", names);
    }

    @SuppressWarnings("deprecation")
    Map<String, Object> describeGroup(Map<String, Object> c) throws Exception {
        String g = str(c, "group", null);
        ConsumerGroupDescription d = get(admin().describeConsumerGroups(Collections.singleton(g)).all()).get(g);
        List<Object> members = new ArrayList<>();
        for (MemberDescription m : d.members()) {
            List<Object> asg = new ArrayList<>();
            for (TopicPartition tp : m.assignment().topicPartitions()) asg.add(Arrays.asList(tp.topic(), tp.partition()));
            members.add(obj("member_id", m.consumerId(), "client_id", m.clientId(), "host", m.host(),
                    "group_instance_id", m.groupInstanceId().orElse(null), "assignment", asg));
        }
        return obj("ok", true, "group", d.groupId(), "state", String.valueOf(d.state()),
                "protocol", d.partitionAssignor(), "coordinator", nodeId(d.coordinator()), "members", members);
    }

    Map<String, Object> groupOffsets(Map<String, Object> c) throws Exception {
        Map<TopicPartition, OffsetAndMetadata> m =
                get(admin().listConsumerGroupOffsets(str(c, "group", null)).partitionsToOffsetAndMetadata());
        List<Object> rows = new ArrayList<>();
        List<TopicPartition> keys = new ArrayList<>(m.keySet());
        keys.sort(Comparator.comparing(TopicPartition::topic).thenComparingInt(TopicPartition::partition));
        for (TopicPartition tp : keys) {
            OffsetAndMetadata om = m.get(tp);
            rows.add(Arrays.asList(tp.topic(), tp.partition(), om == null ? null : om.offset(),
                    om == null ? null : om.metadata()));
        }
        return obj("ok", true, "offsets", rows);
    }

    Map<String, Object> deleteGroup(Map<String, Object> c) throws Exception {
        get(admin().deleteConsumerGroups(Collections.singleton(str(c, "group", null))).all());
        return obj("ok", true);
    }

    // ------------------------------------------- transactions (KIP-664), features

    @SuppressWarnings("unchecked")
    static List<String> strs(Map<String, Object> c, String k) {
        Object v = c.get(k);
        if (v == null) return new ArrayList<>();
        if (!(v instanceof List)) throw new BadCommand("\"" + k + "\" must be a list");
        return (List<String>) v;
    }

    Map<String, Object> listTransactions(Map<String, Object> c) throws Exception {
        ListTransactionsOptions o = new ListTransactionsOptions();
        List<TransactionState> states = new ArrayList<>();
        for (String st : strs(c, "states")) states.add(TransactionState.parse(st));
        if (!states.isEmpty()) o.filterStates(states);
        List<Object> out = new ArrayList<>();
        for (TransactionListing l : get(admin().listTransactions(o).all()))
            out.add(obj("transactional_id", l.transactionalId(), "producer_id", l.producerId(),
                    "state", l.state().toString()));
        return obj("ok", true, "transactions", out);
    }

    Map<String, Object> describeTransactions(Map<String, Object> c) throws Exception {
        Map<String, Object> out = new LinkedHashMap<>();
        for (Map.Entry<String, TransactionDescription> e :
                get(admin().describeTransactions(strs(c, "ids")).all()).entrySet()) {
            TransactionDescription d = e.getValue();
            List<Object> tps = new ArrayList<>();
            for (TopicPartition tp : d.topicPartitions()) tps.add(Arrays.asList(tp.topic(), tp.partition()));
            out.put(e.getKey(), obj("state", d.state().toString(), "producer_id", d.producerId(),
                    "producer_epoch", (int) d.producerEpoch(), "timeout_ms", d.transactionTimeoutMs(),
                    "start_time_ms", d.transactionStartTimeMs().isPresent() ? d.transactionStartTimeMs().getAsLong() : null,
                    "coordinator", d.coordinatorId(), "partitions", tps));
        }
        return obj("ok", true, "transactions", out);
    }

    Map<String, Object> describeProducers(Map<String, Object> c) throws Exception {
        TopicPartition tp = new TopicPartition(str(c, "topic", null), (int) lng(c, "partition", 0));
        DescribeProducersResult.PartitionProducerState st = get(admin().describeProducers(Collections.singleton(tp)).all()).get(tp);
        List<Object> out = new ArrayList<>();
        for (ProducerState p : st.activeProducers())
            out.add(obj("producer_id", p.producerId(), "producer_epoch", p.producerEpoch(),
                    "last_sequence", p.lastSequence(), "last_timestamp", p.lastTimestamp(),
                    "coordinator_epoch", p.coordinatorEpoch().isPresent() ? p.coordinatorEpoch().getAsInt() : null,
                    "txn_start_offset", p.currentTransactionStartOffset().isPresent()
                            ? p.currentTransactionStartOffset().getAsLong() : null));
        return obj("ok", true, "producers", out);
    }

    Map<String, Object> abortTransaction(Map<String, Object> c) throws Exception {
        TopicPartition tp = new TopicPartition(str(c, "topic", null), (int) lng(c, "partition", 0));
        get(admin().abortTransaction(new AbortTransactionSpec(tp, lng(c, "producer_id", -1),
                (short) lng(c, "producer_epoch", -1), (int) lng(c, "coordinator_epoch", -1))).all());
        return obj("ok", true);
    }

    Map<String, Object> describeFeatures(Map<String, Object> c) throws Exception {
        FeatureMetadata m = get(admin().describeFeatures().featureMetadata());
        Map<String, Object> fin = new LinkedHashMap<>();
        for (Map.Entry<String, FinalizedVersionRange> e : m.finalizedFeatures().entrySet())
            fin.put(e.getKey(), (int) e.getValue().maxVersionLevel());
        Map<String, Object> sup = new LinkedHashMap<>();
        for (Map.Entry<String, SupportedVersionRange> e : m.supportedFeatures().entrySet())
            sup.put(e.getKey(), Arrays.asList((int) e.getValue().minVersion(), (int) e.getValue().maxVersion()));
        return obj("ok", true, "finalized", fin, "supported", sup,
                "epoch", m.finalizedFeaturesEpoch().isPresent() ? m.finalizedFeaturesEpoch().get() : null);
    }

    Map<String, Object> updateFeatures(Map<String, Object> c) throws Exception {
        FeatureUpdate.UpgradeType type = FeatureUpdate.UpgradeType.valueOf(str(c, "upgrade_type", "UPGRADE"));
        Map<String, FeatureUpdate> updates = Collections.singletonMap(str(c, "feature", null),
                new FeatureUpdate((short) lng(c, "level", 0), type));
        get(admin().updateFeatures(updates, new UpdateFeaturesOptions().validateOnly(bool(c, "validate_only", false))).all());
        return obj("ok", true);
    }

    static List<Object> ints(Collection<Integer> xs) {
        return new ArrayList<>(xs);
    }

    static Comparator<TopicPartition> TP_ORDER =
            Comparator.comparing(TopicPartition::topic).thenComparingInt(TopicPartition::partition);

    Map<String, Object> describeLogDirs(Map<String, Object> c) throws Exception {
        List<Integer> brokers = new ArrayList<>();
        for (Node n : get(admin().describeCluster().nodes())) brokers.add(n.id());
        Map<Integer, Map<String, LogDirDescription>> all = get(admin().describeLogDirs(brokers).allDescriptions());
        List<Object> dirs = new ArrayList<>();
        for (Map.Entry<Integer, Map<String, LogDirDescription>> b : all.entrySet()) {
            for (Map.Entry<String, LogDirDescription> d : b.getValue().entrySet()) {
                LogDirDescription desc = d.getValue();
                List<TopicPartition> tps = new ArrayList<>(desc.replicaInfos().keySet());
                tps.sort(TP_ORDER);
                List<Object> replicas = new ArrayList<>();
                for (TopicPartition tp : tps) {
                    ReplicaInfo ri = desc.replicaInfos().get(tp);
                    replicas.add(obj("topic", tp.topic(), "partition", tp.partition(), "size", ri.size(),
                            "offset_lag", ri.offsetLag(), "future", ri.isFuture()));
                }
                dirs.add(obj("broker", b.getKey(), "path", d.getKey(),
                        "error", desc.error() == null ? null : desc.error().getClass().getSimpleName(),
                        "total_bytes", desc.totalBytes().isPresent() ? (Object) desc.totalBytes().getAsLong() : null,
                        "usable_bytes", desc.usableBytes().isPresent() ? (Object) desc.usableBytes().getAsLong() : null,
                        "replicas", replicas));
            }
        }
        return obj("ok", true, "dirs", dirs);
    }

    Map<String, Object> listReassignments(Map<String, Object> c) throws Exception {
        ListPartitionReassignmentsResult r;
        Object ps = c.get("partitions");
        if (ps instanceof List) {
            Set<TopicPartition> tps = new HashSet<>();
            for (Object o : (List<?>) ps) {
                List<?> tp = (List<?>) o;
                tps.add(new TopicPartition((String) tp.get(0), ((Number) tp.get(1)).intValue()));
            }
            r = admin().listPartitionReassignments(tps);
        } else {
            r = admin().listPartitionReassignments();
        }
        Map<TopicPartition, PartitionReassignment> m = get(r.reassignments());
        List<TopicPartition> keys = new ArrayList<>(m.keySet());
        keys.sort(TP_ORDER);
        List<Object> rows = new ArrayList<>();
        for (TopicPartition tp : keys) {
            PartitionReassignment pr = m.get(tp);
            rows.add(obj("topic", tp.topic(), "partition", tp.partition(), "replicas", ints(pr.replicas()),
                    "adding", ints(pr.addingReplicas()), "removing", ints(pr.removingReplicas())));
        }
        return obj("ok", true, "reassignments", rows);
    }

    Map<String, Object> alterReassignments(Map<String, Object> c) throws Exception {
        Map<TopicPartition, Optional<NewPartitionReassignment>> m = new LinkedHashMap<>();
        Object rs = c.get("reassignments");
        if (!(rs instanceof List)) throw new BadCommand("missing reassignments");
        for (Object o : (List<?>) rs) {
            List<?> row = (List<?>) o;
            TopicPartition tp = new TopicPartition((String) row.get(0), ((Number) row.get(1)).intValue());
            if (row.get(2) == null) {
                m.put(tp, Optional.empty());
            } else {
                List<Integer> target = new ArrayList<>();
                for (Object id : (List<?>) row.get(2)) target.add(((Number) id).intValue());
                m.put(tp, Optional.of(new NewPartitionReassignment(target)));
            }
        }
        Map<TopicPartition, KafkaFuture<Void>> futures = admin().alterPartitionReassignments(m).values();
        List<Object> results = new ArrayList<>();
        for (TopicPartition tp : m.keySet()) {
            String error = null;
            try {
                get(futures.get(tp));
            } catch (ExecutionException e) {
                error = unwrap(e).getClass().getSimpleName();
            }
            results.add(Arrays.asList(tp.topic(), tp.partition(), error));
        }
        return obj("ok", true, "results", results);
    }

    Map<String, Object> describeClientQuotas(Map<String, Object> c) throws Exception {
        String user = str(c, "user", null);
        org.apache.kafka.common.quota.ClientQuotaFilter filter = user == null
                ? org.apache.kafka.common.quota.ClientQuotaFilter.all()
                : org.apache.kafka.common.quota.ClientQuotaFilter.contains(Collections.singletonList(
                        org.apache.kafka.common.quota.ClientQuotaFilterComponent.ofEntity(
                                org.apache.kafka.common.quota.ClientQuotaEntity.USER, user)));
        Map<org.apache.kafka.common.quota.ClientQuotaEntity, Map<String, Double>> m =
                get(admin().describeClientQuotas(filter).entities());
        List<Object> entries = new ArrayList<>();
        for (Map.Entry<org.apache.kafka.common.quota.ClientQuotaEntity, Map<String, Double>> e : m.entrySet())
            entries.add(obj("entity", new TreeMap<>(e.getKey().entries()), "values", new TreeMap<>(e.getValue())));
        return obj("ok", true, "entries", entries);
    }

    Map<String, Object> describeMetadataQuorum(Map<String, Object> c) throws Exception {
        QuorumInfo q = get(admin().describeMetadataQuorum().quorumInfo());
        List<Object> voters = new ArrayList<>();
        for (QuorumInfo.ReplicaState r : q.voters())
            voters.add(obj("id", r.replicaId(), "log_end_offset", r.logEndOffset()));
        List<Object> observers = new ArrayList<>();
        for (QuorumInfo.ReplicaState r : q.observers()) observers.add(r.replicaId());
        return obj("ok", true, "leader", q.leaderId(), "high_watermark", q.highWatermark(), "voters", voters,
                "observers", observers);
    }

    Map<String, Object> alterReplicaLogDirs(Map<String, Object> c) throws Exception {
        Map<org.apache.kafka.common.TopicPartitionReplica, String> moves = new LinkedHashMap<>();
        for (Object o : (List<?>) c.get("moves")) {
            List<?> row = (List<?>) o;
            moves.put(new org.apache.kafka.common.TopicPartitionReplica((String) row.get(0),
                    ((Number) row.get(1)).intValue(), ((Number) row.get(2)).intValue()), (String) row.get(3));
        }
        Map<org.apache.kafka.common.TopicPartitionReplica, KafkaFuture<Void>> futures =
                admin().alterReplicaLogDirs(moves).values();
        List<Object> results = new ArrayList<>();
        for (org.apache.kafka.common.TopicPartitionReplica r : moves.keySet()) {
            String error = null;
            try {
                get(futures.get(r));
            } catch (ExecutionException e) {
                error = unwrap(e).getClass().getSimpleName();
            }
            results.add(Arrays.asList(r.topic(), r.partition(), error));
        }
        return obj("ok", true, "results", results);
    }

    Map<String, Object> createDelegationToken(Map<String, Object> c) throws Exception {
        String error = null;
        try {
            get(admin().createDelegationToken().delegationToken());
        } catch (ExecutionException e) {
            error = unwrap(e).getClass().getSimpleName();
        }
        return obj("ok", true, "error", error);
    }

    // -------------------------------------------------------------- produce

    Map<String, Object> produce(Map<String, Object> c) throws Exception {
        String topic = str(c, "topic", null);
        String handle = str(c, "handle", null);
        KafkaProducer<byte[], byte[]> producer = handle == null ? null : producers.get(handle);
        if (producer == null) {
            producer = newProducer(c);
            if (handle != null) producers.put(handle, producer);
        }
        String txn = str(c, "txn", null);   // null | "commit" | "abort"
        List<?> records = (List<?>) c.get("records");
        if (records == null) throw new BadCommand("missing records");
        List<Future<RecordMetadata>> futures = new ArrayList<>();
        try {
            if (txn != null) producer.beginTransaction();
            for (Object o : records) {
                @SuppressWarnings("unchecked")
                Map<String, Object> r = (Map<String, Object>) o;
                Integer partition = r.get("partition") == null ? null : ((Number) r.get("partition")).intValue();
                Long ts = r.get("timestamp") == null ? null : ((Number) r.get("timestamp")).longValue();
                List<Header> headers = new ArrayList<>();
                Object hs = r.get("headers");
                if (hs instanceof List) {
                    for (Object h : (List<?>) hs) {
                        List<?> kv = (List<?>) h;
                        headers.add(new RecordHeader((String) kv.get(0), b64d((String) kv.get(1))));
                    }
                }
                ProducerRecord<byte[], byte[]> pr = new ProducerRecord<>(topic, partition, ts,
                        b64d((String) r.get("key_b64")), b64d((String) r.get("value_b64")), headers);
                try {
                    futures.add(producer.send(pr));
                } catch (Throwable t) {
                    futures.add(new FailedFuture(t));
                }
            }
            producer.flush();
            List<Object> offsets = new ArrayList<>();
            List<Object> errors = new ArrayList<>();
            List<Object> timestamps = new ArrayList<>();
            String firstError = null;
            for (Future<RecordMetadata> f : futures) {
                try {
                    RecordMetadata md = f.get(DEFAULT_TIMEOUT_MS + FUTURE_SLACK_MS, TimeUnit.MILLISECONDS);
                    offsets.add(Arrays.asList(md.partition(), md.hasOffset() ? md.offset() : null));
                    timestamps.add(md.hasTimestamp() ? md.timestamp() : null);
                    errors.add(null);
                } catch (Throwable t) {
                    String e = (String) error(t).get("error");
                    if (firstError == null) firstError = e;
                    offsets.add(null);
                    timestamps.add(null);
                    errors.add(e);
                }
            }
            if (txn != null) {
                if (txn.equals("abort") || firstError != null) producer.abortTransaction();
                else producer.commitTransaction();
            }
            Map<String, Object> res = obj("ok", firstError == null, "offsets", offsets, "timestamps", timestamps);
            if (firstError != null) {
                res.put("error", firstError);
                res.put("errors", errors);
            }
            return res;
        } finally {
            if (handle == null) producer.close(Duration.ofSeconds(5));
        }
    }

    /** A producer from the command's "config"; initTransactions() when transactional. */
    KafkaProducer<byte[], byte[]> newProducer(Map<String, Object> c) {
        Properties p = props(c, producerDefaults(), "config");
        KafkaProducer<byte[], byte[]> producer = new KafkaProducer<>(p);
        if (p.getProperty("transactional.id") != null) {
            try {
                producer.initTransactions();
            } catch (Throwable t) {
                producer.close(Duration.ofSeconds(1));
                throw t;
            }
        }
        return producer;
    }

    /** For bench/produce_consume.py: send "count" records of "size" bytes as fast as the producer takes them (in
     *  transactions of "txn_size" records when > 0, every "abort_every"-th aborted); time from the first send to the
     *  last acknowledgement, with send-to-ack latency percentiles and time spent in send vs commit. */
    Map<String, Object> benchProduce(Map<String, Object> c) throws Exception {
        String topic = str(c, "topic", null);
        long count = lng(c, "count", 0);
        int size = (int) lng(c, "size", 1024);
        long txnSize = lng(c, "txn_size", 0);
        long abortEvery = lng(c, "abort_every", 0);
        byte[][] payloads = new byte[64][];
        Random rnd = new Random(42);
        for (int i = 0; i < payloads.length; i++) { payloads[i] = new byte[size]; rnd.nextBytes(payloads[i]); }
        long[] latencies = new long[(int) count];
        long[] failed = {0};
        String[] firstError = {null};
        try (KafkaProducer<byte[], byte[]> producer = newProducer(c)) {
            producer.partitionsFor(topic);
            long started = System.nanoTime(), sending = 0, committing = 0, txns = 0, aborted = 0, txnStart = 0;
            for (long i = 0; i < count; i++) {
                if (txnSize > 0 && i % txnSize == 0) { producer.beginTransaction(); txnStart = System.nanoTime(); }
                final int idx = (int) i;
                final long sent = System.nanoTime();
                producer.send(new ProducerRecord<>(topic, payloads[idx & 63]), (md, e) -> {
                    if (e != null) { failed[0]++; if (firstError[0] == null) firstError[0] = e.toString(); }
                    else latencies[idx] = System.nanoTime() - sent;
                });
                if (txnSize > 0 && (i % txnSize == txnSize - 1 || i == count - 1)) {
                    long ended = System.nanoTime();
                    sending += ended - txnStart;
                    txns++;
                    if (abortEvery > 0 && txns % abortEvery == 0) { producer.flush(); producer.abortTransaction(); aborted++; }
                    else producer.commitTransaction();
                    committing += System.nanoTime() - ended;
                }
            }
            producer.flush();
            long elapsed = System.nanoTime() - started;
            long[] ok = Arrays.stream(latencies).filter(x -> x > 0).sorted().toArray();
            java.util.function.IntFunction<Double> pct = q -> ok.length == 0 ? null : ok[Math.min(ok.length - 1, (int) (ok.length * q / 1000.0))] / 1e6;
            return obj("ok", true, "seconds", elapsed / 1e9, "records", (long) ok.length, "failed", failed[0],
                    "first_error", firstError[0], "p50_ms", pct.apply(500), "p99_ms", pct.apply(990),
                    "p999_ms", pct.apply(999), "max_ms", ok.length == 0 ? null : ok[ok.length - 1] / 1e6,
                    "transactions", txns, "aborted", aborted, "send_ms_per_txn", txns == 0 ? null : sending / 1e6 / txns,
                    "commit_ms_per_txn", txns == 0 ? null : committing / 1e6 / txns);
        }
    }

    Map<String, Object> initProducer(Map<String, Object> c) {
        String handle = str(c, "handle", null);
        if (handle == null) throw new BadCommand("missing handle");
        if (producers.containsKey(handle)) throw new BadCommand("producer \"" + handle + "\" already exists");
        producers.put(handle, newProducer(c));
        return obj("ok", true);
    }

    Map<String, Object> send(Map<String, Object> c) {
        KafkaProducer<byte[], byte[]> producer = keptProducer(c);
        List<?> records = (List<?>) c.get("records");
        if (records == null) throw new BadCommand("missing records");
        for (Object o : records) {
            @SuppressWarnings("unchecked")
            Map<String, Object> r = (Map<String, Object>) o;
            Integer partition = r.get("partition") == null ? null : ((Number) r.get("partition")).intValue();
            producer.send(new ProducerRecord<>(str(c, "topic", null), partition,
                    b64d((String) r.get("key_b64")), b64d((String) r.get("value_b64"))));
        }
        return obj("ok", true, "sent", records.size());
    }

    KafkaProducer<byte[], byte[]> keptProducer(Map<String, Object> c) {
        String handle = str(c, "handle", null);
        KafkaProducer<byte[], byte[]> p = handle == null ? null : producers.get(handle);
        if (p == null) throw new BadCommand("no producer \"" + handle + "\" (use init_producer first)");
        return p;
    }

    Map<String, Object> sendOffsetsToTxn(Map<String, Object> c) {
        KafkaProducer<byte[], byte[]> producer = keptProducer(c);
        String ch = str(c, "consumer", "default");
        GroupConsumer g = consumers.get(ch);
        if (g == null) throw new BadCommand("no subscribed consumer \"" + ch + "\"");
        Map<TopicPartition, OffsetAndMetadata> m = new LinkedHashMap<>();
        Object offs = c.get("offsets");
        if (offs instanceof List) {
            for (Object o : (List<?>) offs) {
                List<?> l = (List<?>) o;  // [topic, partition, offset, metadata?]
                m.put(new TopicPartition((String) l.get(0), ((Number) l.get(1)).intValue()),
                        new OffsetAndMetadata(((Number) l.get(2)).longValue(),
                                l.size() > 3 && l.get(3) != null ? (String) l.get(3) : ""));
            }
        } else {
            List<TopicPartition> tps = new ArrayList<>(g.consumer.assignment());
            tps.sort(Comparator.comparing(TopicPartition::topic).thenComparingInt(TopicPartition::partition));
            for (TopicPartition tp : tps)
                m.put(tp, new OffsetAndMetadata(g.consumer.position(tp, Duration.ofMillis(DEFAULT_TIMEOUT_MS))));
        }
        org.apache.kafka.clients.consumer.ConsumerGroupMetadata md = g.consumer.groupMetadata();
        producer.sendOffsetsToTransaction(m, md);
        List<Object> rows = new ArrayList<>();
        for (Map.Entry<TopicPartition, OffsetAndMetadata> e : m.entrySet())
            rows.add(Arrays.asList(e.getKey().topic(), e.getKey().partition(), e.getValue().offset()));
        return obj("ok", true, "offsets", rows, "group", md.groupId(), "generation_id", md.generationId(),
                "member_id", md.memberId());
    }

    Map<String, Object> closeProducer(Map<String, Object> c) {
        String handle = str(c, "handle", null);
        List<String> hs = handle == null ? new ArrayList<>(producers.keySet()) : Collections.singletonList(handle);
        for (String h : hs) {
            KafkaProducer<byte[], byte[]> p = producers.remove(h);
            if (p != null) p.close(Duration.ofSeconds(5));
        }
        return obj("ok", true);
    }

    static final class FailedFuture implements Future<RecordMetadata> {
        final Throwable t;
        FailedFuture(Throwable t) { this.t = t; }
        public boolean cancel(boolean b) { return false; }
        public boolean isCancelled() { return false; }
        public boolean isDone() { return true; }
        public RecordMetadata get() throws ExecutionException { throw new ExecutionException(t); }
        public RecordMetadata get(long l, TimeUnit u) throws ExecutionException { throw new ExecutionException(t); }
    }

    // -------------------------------------------------------------- consume

    static Map<String, Object> recordJson(ConsumerRecord<byte[], byte[]> r) {
        List<Object> headers = new ArrayList<>();
        for (Header h : r.headers()) headers.add(Arrays.asList(h.key(), b64e(h.value())));
        Map<String, Object> m = obj("topic", r.topic(), "partition", r.partition(), "offset", r.offset(),
                "key_b64", b64e(r.key()), "value_b64", b64e(r.value()), "headers", headers,
                "timestamp", r.timestamp(), "timestamp_type", r.timestampType().toString());
        m.put("leader_epoch", r.leaderEpoch().orElse(null));
        return m;
    }

    Map<String, Object> consume(Map<String, Object> c) throws Exception {
        String topic = str(c, "topic", null);
        List<TopicPartition> tps = partitionsArg(c, topic);
        long count = lng(c, "count", Long.MAX_VALUE);
        long timeoutMs = lng(c, "timeout_ms", DEFAULT_TIMEOUT_MS);
        Properties p = props(c, consumerDefaults(), "config");
        List<Object> out = new ArrayList<>();
        boolean timedOut = false;
        try (KafkaConsumer<byte[], byte[]> consumer = new KafkaConsumer<>(p)) {
            consumer.assign(tps);
            Object off = c.get("offset");
            if (off == null || "earliest".equals(off) || "beginning".equals(off)) consumer.seekToBeginning(tps);
            else if ("latest".equals(off) || "end".equals(off)) consumer.seekToEnd(tps);
            else if (off instanceof Number) for (TopicPartition tp : tps) consumer.seek(tp, ((Number) off).longValue());
            else throw new BadCommand("bad offset " + off);
            Map<TopicPartition, Long> ends = bool(c, "until_end", false)
                    ? consumer.endOffsets(tps, Duration.ofMillis(DEFAULT_TIMEOUT_MS)) : null;
            long deadline = System.currentTimeMillis() + timeoutMs;
            while (out.size() < count) {
                if (ends != null) {
                    boolean atEnd = true;
                    for (TopicPartition tp : tps)
                        if (consumer.position(tp, Duration.ofMillis(DEFAULT_TIMEOUT_MS)) < ends.get(tp)) atEnd = false;
                    if (atEnd) break;
                }
                long left = deadline - System.currentTimeMillis();
                if (left <= 0) { timedOut = true; break; }
                ConsumerRecords<byte[], byte[]> recs = consumer.poll(Duration.ofMillis(Math.min(left, 500)));
                Map<TopicPartition, Long> rewind = new HashMap<>();
                for (ConsumerRecord<byte[], byte[]> r : recs) {
                    TopicPartition tp = new TopicPartition(r.topic(), r.partition());
                    if (out.size() < count) out.add(recordJson(r));
                    else if (!rewind.containsKey(tp)) rewind.put(tp, r.offset());
                }
                for (Map.Entry<TopicPartition, Long> e : rewind.entrySet()) consumer.seek(e.getKey(), e.getValue());
            }
            Map<String, Object> res = obj("ok", true, "records", out, "timed_out", timedOut);
            if (ends != null) {
                List<Object> e = new ArrayList<>();
                for (TopicPartition tp : tps) e.add(Arrays.asList(tp.partition(), ends.get(tp)));
                res.put("end_offsets", e);
            }
            if (tps.size() == 1) {
                res.put("position", consumer.position(tps.get(0), Duration.ofMillis(DEFAULT_TIMEOUT_MS)));
            } else {
                List<Object> pos = new ArrayList<>();
                for (TopicPartition tp : tps)
                    pos.add(Arrays.asList(tp.partition(), consumer.position(tp, Duration.ofMillis(DEFAULT_TIMEOUT_MS))));
                res.put("position", pos);
            }
            return res;
        }
    }

    // ------------------------------------------------------- group consumer

    static final class GroupConsumer implements ConsumerRebalanceListener {
        final KafkaConsumer<byte[], byte[]> consumer;
        final List<Object> events = new ArrayList<>();
        GroupConsumer(KafkaConsumer<byte[], byte[]> consumer) { this.consumer = consumer; }

        static List<Object> tpList(Collection<TopicPartition> tps) {
            List<TopicPartition> l = new ArrayList<>(tps);
            l.sort(Comparator.comparing(TopicPartition::topic).thenComparingInt(TopicPartition::partition));
            List<Object> out = new ArrayList<>();
            for (TopicPartition tp : l) out.add(Arrays.asList(tp.topic(), tp.partition()));
            return out;
        }
        public void onPartitionsRevoked(Collection<TopicPartition> tps) {
            events.add(obj("type", "revoked", "partitions", tpList(tps)));
        }
        public void onPartitionsAssigned(Collection<TopicPartition> tps) {
            events.add(obj("type", "assigned", "partitions", tpList(tps)));
        }
        public void onPartitionsLost(Collection<TopicPartition> tps) {
            events.add(obj("type", "lost", "partitions", tpList(tps)));
        }
    }

    GroupConsumer groupConsumer(Map<String, Object> c) {
        String handle = str(c, "handle", "default");
        GroupConsumer g = consumers.get(handle);
        if (g == null) throw new BadCommand("no subscribed consumer \"" + handle + "\" (use subscribe first)");
        return g;
    }

    Map<String, Object> subscribe(Map<String, Object> c) {
        String handle = str(c, "handle", "default");
        if (consumers.containsKey(handle)) throw new BadCommand("consumer \"" + handle + "\" already exists");
        List<String> topics = new ArrayList<>();
        Object ts = c.get("topics");
        if (ts instanceof List) for (Object t : (List<?>) ts) topics.add((String) t);
        else topics.add(str(c, "topic", null));
        Map<String, String> d = consumerDefaults();
        d.put("auto.offset.reset", "earliest");
        d.put("group.id", str(c, "group", null));
        Properties p = props(c, d, "config");
        KafkaConsumer<byte[], byte[]> consumer = new KafkaConsumer<>(p);
        GroupConsumer g = new GroupConsumer(consumer);
        try {
            consumer.subscribe(topics, g);
        } catch (Throwable t) {
            consumer.close(Duration.ZERO);
            throw t;
        }
        consumers.put(handle, g);
        return obj("ok", true);
    }

    Map<String, Object> poll(Map<String, Object> c) {
        GroupConsumer g = groupConsumer(c);
        long timeoutMs = lng(c, "timeout_ms", 1000);
        long max = lng(c, "max", -1);
        List<Object> out = new ArrayList<>();
        long deadline = System.currentTimeMillis() + timeoutMs;
        do {
            long left = Math.max(0, deadline - System.currentTimeMillis());
            ConsumerRecords<byte[], byte[]> recs =
                    g.consumer.poll(Duration.ofMillis(max < 0 ? left : Math.min(left, 500)));
            Map<TopicPartition, Long> rewind = new HashMap<>();
            for (ConsumerRecord<byte[], byte[]> r : recs) {
                TopicPartition tp = new TopicPartition(r.topic(), r.partition());
                if (max < 0 || out.size() < max) out.add(recordJson(r));
                else if (!rewind.containsKey(tp)) rewind.put(tp, r.offset());
            }
            // Hand back what the caller did not take, so that positions (and
            // commitSync) reflect exactly the records returned.
            for (Map.Entry<TopicPartition, Long> e : rewind.entrySet()) g.consumer.seek(e.getKey(), e.getValue());
        } while (max >= 0 && out.size() < max && System.currentTimeMillis() < deadline);
        List<Object> events = new ArrayList<>(g.events);
        g.events.clear();
        return obj("ok", true, "records", out, "assignment", GroupConsumer.tpList(g.consumer.assignment()),
                "events", events);
    }

    Map<String, Object> assignment(Map<String, Object> c) {
        GroupConsumer g = groupConsumer(c);
        return obj("ok", true, "assignment", GroupConsumer.tpList(g.consumer.assignment()));
    }

    Map<String, Object> commit(Map<String, Object> c) {
        GroupConsumer g = groupConsumer(c);
        Object offs = c.get("offsets");
        if (offs instanceof List) {
            Map<TopicPartition, OffsetAndMetadata> m = new HashMap<>();
            for (Object o : (List<?>) offs) {
                List<?> l = (List<?>) o;  // [topic, partition, offset, metadata?]
                m.put(new TopicPartition((String) l.get(0), ((Number) l.get(1)).intValue()),
                        new OffsetAndMetadata(((Number) l.get(2)).longValue(),
                                l.size() > 3 && l.get(3) != null ? (String) l.get(3) : ""));
            }
            g.consumer.commitSync(m, Duration.ofMillis(DEFAULT_TIMEOUT_MS));
        } else {
            g.consumer.commitSync(Duration.ofMillis(DEFAULT_TIMEOUT_MS));
        }
        return obj("ok", true);
    }

    Map<String, Object> positions(Map<String, Object> c) {
        GroupConsumer g = groupConsumer(c);
        List<TopicPartition> tps = new ArrayList<>(g.consumer.assignment());
        tps.sort(Comparator.comparing(TopicPartition::topic).thenComparingInt(TopicPartition::partition));
        List<Object> rows = new ArrayList<>();
        for (TopicPartition tp : tps)
            rows.add(Arrays.asList(tp.topic(), tp.partition(),
                    g.consumer.position(tp, Duration.ofMillis(DEFAULT_TIMEOUT_MS))));
        return obj("ok", true, "positions", rows);
    }

    Map<String, Object> committed(Map<String, Object> c) {
        String topic = str(c, "topic", null);
        Set<TopicPartition> tps = new LinkedHashSet<>(partitionsArg(c, topic));
        String group = str(c, "group", null);
        KafkaConsumer<byte[], byte[]> consumer;
        boolean temp = false;
        if (group != null && !consumers.containsKey(str(c, "handle", "default"))) {
            Map<String, String> d = consumerDefaults();
            d.put("group.id", group);
            consumer = new KafkaConsumer<>(props(c, d, "config"));
            temp = true;
        } else {
            consumer = groupConsumer(c).consumer;
        }
        try {
            Map<TopicPartition, OffsetAndMetadata> m = consumer.committed(tps, Duration.ofMillis(DEFAULT_TIMEOUT_MS));
            List<Object> rows = new ArrayList<>();
            for (TopicPartition tp : tps) {
                OffsetAndMetadata om = m.get(tp);
                rows.add(Arrays.asList(tp.partition(), om == null ? null : om.offset(),
                        om == null ? null : om.metadata()));
            }
            return obj("ok", true, "committed", rows);
        } finally {
            if (temp) consumer.close(Duration.ofSeconds(5));
        }
    }

    Map<String, Object> closeConsumer(Map<String, Object> c) {
        String handle = str(c, "handle", "default");
        GroupConsumer g = consumers.remove(handle);
        if (g == null) throw new BadCommand("no consumer \"" + handle + "\"");
        g.consumer.close(Duration.ofMillis(lng(c, "timeout_ms", DEFAULT_TIMEOUT_MS)));
        return obj("ok", true);
    }

    // ------------------------------------------------------------- selftest

    /** Round-trips a payload through the client's own codec implementation
     *  (no broker needed): proves the compression jars and native libs load. */
    Map<String, Object> selftestCodec(Map<String, Object> c) throws Exception {
        String name = str(c, "codec", "gzip");
        byte[] data = new byte[10_000];
        for (int i = 0; i < data.length; i++) data[i] = (byte) ("trireme-" + (i % 97)).charAt(i % 8);
        org.apache.kafka.common.compress.Compression comp =
                org.apache.kafka.common.compress.Compression.of(name).build();
        org.apache.kafka.common.utils.ByteBufferOutputStream bbos =
                new org.apache.kafka.common.utils.ByteBufferOutputStream(1024);
        try (OutputStream os = comp.wrapForOutput(bbos, (byte) 2)) {
            os.write(data);
        }
        ByteBuffer buf = bbos.buffer();
        buf.flip();
        int compressed = buf.remaining();
        ByteArrayOutputStream back = new ByteArrayOutputStream();
        try (InputStream is = comp.wrapForInput(buf, (byte) 2,
                org.apache.kafka.common.utils.BufferSupplier.create())) {
            byte[] chunk = new byte[4096];
            int n;
            while ((n = is.read(chunk)) > 0) back.write(chunk, 0, n);
        }
        if (!Arrays.equals(back.toByteArray(), data)) throw new IllegalStateException("codec round trip mismatch");
        return obj("ok", true, "codec", name, "compressed_size", compressed, "size", data.length);
    }

    // --------------------------------------------------------------- helpers

    static Map<String, Object> obj(Object... kv) {
        Map<String, Object> m = new LinkedHashMap<>();
        for (int i = 0; i < kv.length; i += 2) m.put((String) kv[i], kv[i + 1]);
        return m;
    }

    static String str(Map<String, Object> c, String k, String dflt) {
        Object v = c.get(k);
        if (v == null) return dflt;
        if (!(v instanceof String)) throw new BadCommand("\"" + k + "\" must be a string");
        return (String) v;
    }

    static long lng(Map<String, Object> c, String k, long dflt) {
        Object v = c.get(k);
        if (v == null) return dflt;
        if (!(v instanceof Number)) throw new BadCommand("\"" + k + "\" must be a number");
        return ((Number) v).longValue();
    }

    static boolean bool(Map<String, Object> c, String k, boolean dflt) {
        Object v = c.get(k);
        if (v == null) return dflt;
        if (!(v instanceof Boolean)) throw new BadCommand("\"" + k + "\" must be a boolean");
        return (Boolean) v;
    }

    static byte[] b64d(String s) { return s == null ? null : Base64.getDecoder().decode(s); }

    static String b64e(byte[] b) { return b == null ? null : Base64.getEncoder().encodeToString(b); }

    // ------------------------------------------------------------------ JSON

    /** Minimal JSON: objects -> LinkedHashMap, arrays -> ArrayList, integers ->
     *  Long, other numbers -> Double, plus String/Boolean/null. */
    static final class Json {
        private final String s;
        private int i;

        private Json(String s) { this.s = s; }

        static Object parse(String text) {
            Json p = new Json(text);
            p.ws();
            Object v = p.value();
            p.ws();
            if (p.i != p.s.length()) throw p.err("trailing characters");
            return v;
        }

        private BadCommand err(String m) { return new BadCommand("invalid JSON: " + m + " at " + i); }

        private void ws() {
            while (i < s.length() && " \t\r\n".indexOf(s.charAt(i)) >= 0) i++;
        }

        private Object value() {
            if (i >= s.length()) throw err("unexpected end");
            char ch = s.charAt(i);
            switch (ch) {
                case '{': return object();
                case '[': return array();
                case '"': return string();
                case 't': return lit("true", Boolean.TRUE);
                case 'f': return lit("false", Boolean.FALSE);
                case 'n': return lit("null", null);
                default:
                    if (ch == '-' || (ch >= '0' && ch <= '9')) return number();
                    throw err("unexpected '" + ch + "'");
            }
        }

        private Object lit(String word, Object v) {
            if (!s.startsWith(word, i)) throw err("bad literal");
            i += word.length();
            return v;
        }

        private Map<String, Object> object() {
            Map<String, Object> m = new LinkedHashMap<>();
            i++;
            ws();
            if (i < s.length() && s.charAt(i) == '}') { i++; return m; }
            while (true) {
                ws();
                if (i >= s.length() || s.charAt(i) != '"') throw err("expected key");
                String k = string();
                ws();
                if (i >= s.length() || s.charAt(i) != ':') throw err("expected ':'");
                i++;
                ws();
                m.put(k, value());
                ws();
                if (i >= s.length()) throw err("unexpected end");
                char ch = s.charAt(i++);
                if (ch == '}') return m;
                if (ch != ',') throw err("expected ',' or '}'");
            }
        }

        private List<Object> array() {
            List<Object> l = new ArrayList<>();
            i++;
            ws();
            if (i < s.length() && s.charAt(i) == ']') { i++; return l; }
            while (true) {
                ws();
                l.add(value());
                ws();
                if (i >= s.length()) throw err("unexpected end");
                char ch = s.charAt(i++);
                if (ch == ']') return l;
                if (ch != ',') throw err("expected ',' or ']'");
            }
        }

        private String string() {
            StringBuilder b = new StringBuilder();
            i++;
            while (true) {
                if (i >= s.length()) throw err("unterminated string");
                char ch = s.charAt(i++);
                if (ch == '"') return b.toString();
                if (ch != '\\') { b.append(ch); continue; }
                if (i >= s.length()) throw err("bad escape");
                char e = s.charAt(i++);
                switch (e) {
                    case '"': b.append('"'); break;
                    case '\\': b.append('\\'); break;
                    case '/': b.append('/'); break;
                    case 'b': b.append('\b'); break;
                    case 'f': b.append('\f'); break;
                    case 'n': b.append('\n'); break;
                    case 'r': b.append('\r'); break;
                    case 't': b.append('\t'); break;
                    case 'u':
                        if (i + 4 > s.length()) throw err("bad \\u escape");
                        try {
                            b.append((char) Integer.parseInt(s.substring(i, i + 4), 16));
                        } catch (NumberFormatException ex) {
                            throw err("bad \\u escape");
                        }
                        i += 4;
                        break;
                    default: throw err("bad escape");
                }
            }
        }

        private Object number() {
            int start = i;
            if (s.charAt(i) == '-') i++;
            boolean frac = false;
            while (i < s.length()) {
                char ch = s.charAt(i);
                if (ch >= '0' && ch <= '9') i++;
                else if (ch == '.' || ch == 'e' || ch == 'E' || ch == '+' || ch == '-') { frac = true; i++; }
                else break;
            }
            String t = s.substring(start, i);
            try {
                if (!frac) return Long.parseLong(t);
                return Double.parseDouble(t);
            } catch (NumberFormatException ex) {
                throw err("bad number " + t);
            }
        }

        /** Value as a plain string for Kafka config maps (no quotes). */
        static String scalarString(Object v) {
            if (v instanceof Double) {
                double d = (Double) v;
                if (d == Math.rint(d) && !Double.isInfinite(d)) return String.valueOf((long) d);
            }
            if (v instanceof List) {
                StringBuilder b = new StringBuilder();
                for (Object o : (List<?>) v) {
                    if (b.length() > 0) b.append(',');
                    b.append(scalarString(o));
                }
                return b.toString();
            }
            return String.valueOf(v);
        }

        static String write(Object v) {
            StringBuilder b = new StringBuilder();
            write(b, v);
            return b.toString();
        }

        private static void write(StringBuilder b, Object v) {
            if (v == null) b.append("null");
            else if (v instanceof String) quote(b, (String) v);
            else if (v instanceof Boolean || v instanceof Integer || v instanceof Long || v instanceof Short)
                b.append(v);
            else if (v instanceof Number) {
                double d = ((Number) v).doubleValue();
                if (Double.isNaN(d) || Double.isInfinite(d)) b.append("null");
                else b.append(v);
            } else if (v instanceof Map) {
                b.append('{');
                boolean first = true;
                for (Map.Entry<?, ?> e : ((Map<?, ?>) v).entrySet()) {
                    if (!first) b.append(',');
                    first = false;
                    quote(b, String.valueOf(e.getKey()));
                    b.append(':');
                    write(b, e.getValue());
                }
                b.append('}');
            } else if (v instanceof Collection) {
                b.append('[');
                boolean first = true;
                for (Object o : (Collection<?>) v) {
                    if (!first) b.append(',');
                    first = false;
                    write(b, o);
                }
                b.append(']');
            } else quote(b, v.toString());
        }

        private static void quote(StringBuilder b, String s) {
            b.append('"');
            for (int k = 0; k < s.length(); k++) {
                char ch = s.charAt(k);
                switch (ch) {
                    case '"': b.append("\\\""); break;
                    case '\\': b.append("\\\\"); break;
                    case '\n': b.append("\\n"); break;
                    case '\r': b.append("\\r"); break;
                    case '\t': b.append("\\t"); break;
                    default:
                        if (ch < 0x20 || ch == 0x2028 || ch == 0x2029) b.append(String.format("\\u%04x", (int) ch));
                        else b.append(ch);
                }
            }
            b.append('"');
        }
    }
}
