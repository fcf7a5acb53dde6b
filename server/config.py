"""Broker configuration under Kafka's own property names, read from a flat TOML or a server.properties file.

Defaults are Apache Kafka's unless noted.  Keys starting with ``trireme.`` are ours: they cover
what Kafka has no name for (fsync policy, shutdown grace).

One rule for every source (--config, --set, the test fixture): a property in PROPERTIES is checked and used; a
name Kafka's broker defines (kafka_broker_properties.py) is accepted and reported once at start-up as having no
effect here; any other name, or a value out of its type or range, refuses to start with one line naming the
source, the property and what is allowed (docs/operations.md, "Configuration").
"""
from __future__ import annotations

import dataclasses
import difflib
import json
import logging
import re
import tomllib
from typing import Any

from trireme.state.topics import validate_config

from .kafka_broker_properties import KAFKA_BROKER_PREFIXES, KAFKA_BROKER_PROPERTIES

# topic config → the broker property that sets its default
TOPIC_DEFAULT_PROPERTIES = {
    "retention.ms": "log.retention.ms",
    "retention.bytes": "log.retention.bytes",
    "segment.bytes": "log.segment.bytes",
    "segment.ms": "log.roll.ms",
    "segment.jitter.ms": "log.roll.jitter.ms",
    "min.cleanable.dirty.ratio": "log.cleaner.min.cleanable.ratio",
    "delete.retention.ms": "log.cleaner.delete.retention.ms",
    "min.compaction.lag.ms": "log.cleaner.min.compaction.lag.ms",
    "max.compaction.lag.ms": "log.cleaner.max.compaction.lag.ms",
    "cleanup.policy": "log.cleanup.policy",
    "max.message.bytes": "message.max.bytes",
    "message.timestamp.type": "log.message.timestamp.type",
    "compression.type": "compression.type",
}

log = logging.getLogger("trireme.config")

# name → (default, description)
PROPERTIES: dict[str, tuple[Any, str]] = {
    "node.id": (1, "This broker's id."),
    "num.partitions": (1, "Partitions of an auto-created topic, or of CreateTopics with -1."),
    "default.replication.factor": (1, "Replication factor of auto-created topics and of CreateTopics with -1; at "
                                      "most the number of live brokers when a topic is created."),
    "auto.create.topics.enable": (True, "Create unknown topics on Metadata/Produce requests."),
    "delete.topic.enable": (True, "Allow DeleteTopics."),
    "log.retention.ms": (604800000, "Default retention.ms of topics (Kafka: 168 hours); wins over "
                                    "log.retention.minutes and log.retention.hours.  -1: no time limit."),
    "log.retention.minutes": (None, "Default retention of topics in minutes, when log.retention.ms is unset "
                                    "(-1: no time limit)."),
    "log.retention.hours": (168, "Default retention of topics in hours, when log.retention.ms and "
                                 "log.retention.minutes are unset (-1: no time limit)."),
    "log.retention.bytes": (-1, "Default retention.bytes of topics (-1: no size limit)."),
    "log.segment.bytes": (1073741824, "Default segment.bytes of topics."),
    "log.roll.ms": (604800000, "Default segment.ms of topics (Kafka: 168 hours): an append rolls the active segment "
                               "once it is older than this, so a quiet compacted topic becomes cleanable; wins "
                               "over log.roll.hours."),
    "log.roll.hours": (168, "Default segment.ms of topics in hours, when log.roll.ms is unset."),
    "log.roll.jitter.ms": (0, "Default segment.jitter.ms of topics: a random share of it, per segment, is taken off "
                              "segment.ms so that segments do not all roll at once; wins over log.roll.jitter.hours."),
    "log.roll.jitter.hours": (0, "Default segment.jitter.ms of topics in hours, when log.roll.jitter.ms is unset."),
    "log.retention.check.interval.ms": (300000, "How often retention runs."),
    "log.message.timestamp.type": ("CreateTime", "Default message.timestamp.type of topics."),
    "log.cleanup.policy": ("delete", "Default cleanup.policy of topics."),
    "message.max.bytes": (1048588, "Default max.message.bytes of topics (largest record batch)."),
    "compression.type": ("producer", "Default compression.type of topics."),
    "socket.request.max.bytes": (104857600, "Largest request frame; larger ones close the connection."),
    "fetch.max.bytes": (57671680, "Upper bound on a Fetch response's size."),
    "queued.max.request.bytes": (
        268435456, "Request bytes the broker holds at once, received or being handled (Kafka: -1, unbounded); "
                   "when reached, connections stop reading until requests finish.  -1: no limit."),
    "trireme.queued.max.request.bytes.per.connection": (
        16777216, "Request bytes one connection may hold before it stops reading new requests until its "
                  "earlier ones are answered (one request of any size up to socket.request.max.bytes goes "
                  "through)."),
    "trireme.request.receive.timeout.ms": (
        60000, "A request frame must arrive whole within this time of its size prefix, else the connection "
               "is closed."),
    "trireme.queued.max.response.bytes": (
        268435456, "Response bytes waiting to be written, broker-wide; when reached, connections with "
                   "unwritten responses stop reading new requests.  -1: no limit."),
    "trireme.queued.max.response.bytes.per.connection": (
        16777216, "Unwritten response bytes after which a connection stops reading new requests until the "
                  "client reads (Kafka mutes the channel)."),
    "trireme.response.send.timeout.ms": (
        60000, "A client that reads nothing of a pending response for this long is disconnected."),
    "connections.max.idle.ms": (600000, "Close connections with no request in progress and no traffic for this long."),
    "max.connections": (4096, "Connections at once (also kept below the open files limit, leaving room for logs); "
                              "further ones are closed at once (Kafka: 2147483647)."),
    "max.connections.per.ip": (2048, "Connections at once from one IP address (Kafka: 2147483647)."),
    "max.connections.per.ip.overrides": ("", "Per-IP exceptions: HOST:COUNT,HOST:COUNT."),
    "max.connection.creation.rate": (
        1000, "New connections accepted per second; faster ones wait in the listen backlog (Kafka: 2147483647)."),
    "trireme.max.partitions": (
        20000, "Partitions of all topics together; CreateTopics/CreatePartitions/auto-creation beyond it are "
               "refused with POLICY_VIOLATION."),
    "trireme.log.max.open.files": (
        4096, "Segment files the logs keep open at once (least recently used closed first, reopened on "
              "demand); at most half the open files limit."),
    "producer.id.expiration.ms": (86400000, "Idempotent producer state expires after this idle time."),
    "transactional.id.expiration.ms": (604800000, "Transactional id expiry."),
    "transaction.max.timeout.ms": (900000, "Largest transaction timeout a producer may ask for."),
    "transaction.abort.timed.out.transaction.cleanup.interval.ms": (
        10000, "How often open transactions past their timeout are looked for and aborted."),
    "transaction.remove.expired.transaction.cleanup.interval.ms": (
        3600000, "How often transactional ids past transactional.id.expiration.ms are removed."),
    "transaction.version": (
        2, "Level of the transaction.version feature finalized when the data directory is new (as Kafka's "
           "`kafka-storage format --feature`): 0 classic, 1 flexible transaction-log records, 2 transactions "
           "V2 (KIP-890).  Later changes go through UpdateFeatures."),
    "transaction.two.phase.commit.enable": (False, "Allow two-phase-commit transactions (KIP-939)."),
    "unstable.api.versions.enable": (
        False, "Also serve and advertise the versions Kafka's definitions mark unstable (latestVersionUnstable: "
               "InitProducerId v6, KIP-939 two-phase commit), as Kafka's internal property does."),
    "group.initial.rebalance.delay.ms": (3000, "Delay before the first rebalance of an empty group."),
    "group.min.session.timeout.ms": (6000, "Smallest session timeout a consumer may ask for."),
    "group.max.session.timeout.ms": (1800000, "Largest session timeout a consumer may ask for."),
    "offsets.retention.minutes": (10080, "Committed offsets of empty groups expire after this."),
    "offsets.retention.check.interval.ms": (600000, "How often expired committed offsets are removed."),
    "log.flush.interval.messages": (
        9223372036854775807, "Opt in to Kafka's flush policy: acknowledge after the write and fsync once this "
                             "many messages are unflushed (also at segment rolls and shutdown).  Unset: fsync "
                             "before every acknowledgement."),
    "log.flush.interval.ms": (
        9223372036854775807, "Opt in to Kafka's flush policy: acknowledge after the write and fsync every this "
                             "many ms.  Unset: fsync before every acknowledgement."),
    "listeners": ("", "Kafka's listener list: NAME://HOST:PORT,... one per listener name (an empty host binds "
                      "every interface; port 0 picks a free port).  --listen sets the PLAINTEXT listener's address "
                      "(adding one in front when the list has none)."),
    "advertised.listeners": ("", "NAME://HOST:PORT,... clients are told to connect to, per listener name (a listener "
                                 "not named here advertises its own address); --advertised sets the PLAINTEXT one."),
    # --- TLS and listeners (security protocols, certificates, principal mapping)
    "listener.security.protocol.map": (
        "PLAINTEXT:PLAINTEXT, SSL:SSL, SASL_PLAINTEXT:SASL_PLAINTEXT, SASL_SSL:SASL_SSL",
        "LISTENER_NAME:SECURITY_PROTOCOL pairs: the security protocol of each listener name."),
    "controller.listener.names": ("", "Listener names of the KRaft controller: left out of `listeners` here (a single "
                                      "node has no separate controller listener)."),
    "inter.broker.listener.name": ("", "The listener brokers use to talk to each other (the broker's own identity for "
                                       "a cluster); must be a listener in `listeners`.  Unset: the listener named "
                                       "after security.inter.broker.protocol, else the first listener."),
    "security.inter.broker.protocol": ("PLAINTEXT", "Security protocol between brokers, when "
                                                    "inter.broker.listener.name is unset (not both)."),
    "sasl.mechanism.inter.broker.protocol": (
        "GSSAPI", "The SASL mechanism a broker authenticates with to another broker's inter-broker listener when it "
                  "is SASL_PLAINTEXT/SASL_SSL: PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512, with the username and password "
                  "options of that listener's <mechanism>.sasl.jaas.config (Kafka's default GSSAPI is not supported)."),
    "ssl.endpoint.identification.algorithm": (
        "https", "How a broker checks another broker's certificate on an SSL/SASL_SSL inter-broker listener: https "
                 "(its name must match the host connected to) or empty (any certificate the trust store signed)."),
    "request.timeout.ms": (30000, "How long a broker waits for another broker's answer to a broker-to-broker "
                                  "request (transaction markers, transaction verification) before giving up on it "
                                  "(a retriable REQUEST_TIMED_OUT) and reconnecting."),
    "ssl.protocol": ("TLSv1.3", "TLS protocol of the SSL context (TLSv1.2 or TLSv1.3)."),
    "ssl.enabled.protocols": ("TLSv1.2,TLSv1.3", "TLS versions accepted (TLSv1.2 and/or TLSv1.3; older ones are "
                                                 "refused at start-up)."),
    "ssl.cipher.suites": ("", "TLS 1.2 cipher suites (OpenSSL or IANA names), comma-separated; empty: OpenSSL's "
                              "defaults.  TLS 1.3 suites are OpenSSL's."),
    "ssl.keystore.type": ("PEM", "Format of the key material: PEM only (Kafka: JKS; JKS and PKCS12 are refused at "
                                 "start-up)."),
    "ssl.keystore.location": ("", "PEM file holding the private key (PKCS#8) followed by the certificate chain."),
    "ssl.keystore.key": ("", "The private key inline (PEM, PKCS#8), with ssl.keystore.certificate.chain."),
    "ssl.keystore.certificate.chain": ("", "The certificate chain inline (PEM), with ssl.keystore.key."),
    "ssl.key.password": ("", "Password of an encrypted private key."),
    "ssl.truststore.type": ("PEM", "Format of the trusted certificates: PEM only (Kafka: JKS)."),
    "ssl.truststore.location": ("", "PEM file of the CA certificates client certificates are checked against."),
    "ssl.truststore.certificates": ("", "The trusted CA certificates inline (PEM)."),
    "ssl.client.auth": ("none", "Client certificates on SSL listeners: none, requested or required (mTLS)."),
    "ssl.principal.mapping.rules": ("DEFAULT", "Kafka's rules (RULE:pattern/replacement/[LU], DEFAULT) from a client "
                                               "certificate's subject DN to the principal name."),
    "ssl.allow.dn.changes": (False, "Let a certificate reload (AlterConfigs) change the certificate's subject."),
    "ssl.allow.san.changes": (False, "Let a certificate reload change the certificate's subject alternative names."),
    "trireme.ssl.handshake.timeout.ms": (
        10000, "A TLS handshake must finish within this time of the connection's accept, else the connection is "
               "closed (the Kafka clients' socket.connection.setup.timeout.ms default)."),
    # --- SASL (mechanisms, JAAS, re-authentication, failed logins)
    "sasl.enabled.mechanisms": (
        "GSSAPI", "SASL mechanisms a SASL_PLAINTEXT/SASL_SSL listener offers, a comma list of PLAIN, SCRAM-SHA-256, "
                  "SCRAM-SHA-512, OAUTHBEARER (Kafka's default GSSAPI is not supported: set this on a SASL listener); "
                  "per listener: listener.name.<listener>.sasl.enabled.mechanisms."),
    "sasl.server.max.receive.size": (524288, "Largest frame a client may send before it is authenticated."),
    "connections.max.reauth.ms": (
        0, "KIP-368: a SASL session lasts at most this long (also bounded by its token's expiry); the client "
           "re-authenticates on the same connection, and one that does not is closed at its next request.  0: no "
           "limit."),
    "connection.failed.authentication.delay.ms": (
        100, "A failed authentication is answered, and its connection closed, after this delay."),
    "sasl.oauthbearer.jwks.endpoint.url": (
        "", "OAUTHBEARER: validate JWTs with the keys of this JWKS (file:// or https://); empty: Kafka's unsecured "
            "validator (alg none tokens, for development)."),
    "sasl.oauthbearer.jwks.endpoint.refresh.ms": (3600000, "How long fetched JWKS keys are used before a refresh."),
    "sasl.oauthbearer.expected.issuer": ("", "OAUTHBEARER/JWKS: the iss a token must have (empty: not checked)."),
    "sasl.oauthbearer.expected.audience": (
        "", "OAUTHBEARER/JWKS: a comma list; a token's aud must hold one of them (empty: not checked)."),
    "sasl.oauthbearer.sub.claim.name": ("sub", "OAUTHBEARER/JWKS: the claim naming the principal."),
    "sasl.oauthbearer.clock.skew.seconds": (30, "OAUTHBEARER/JWKS: clock difference allowed for exp and iat."),
    "trireme.sasl.plain.credentials.file": (
        "", "PLAIN users from this file of salted PBKDF2 hashes (docs/security.md, SASL), besides the user_NAME "
            "options of plain.sasl.jaas.config; read again when it changes."),
    "trireme.sasl.failed.authentications.per.minute": (
        30, "Failed SASL authentications allowed per client address in a minute; an address over it is refused "
            "without its credentials being checked until a minute after its oldest failure.  0: no limit."),
    "trireme.debug.transaction.marker.delay.ms": (
        0, "Fault injection for crash tests: wait this long before each WriteTxnMarkers request the "
           "coordinator sends, and send one partition per request.  0 (off) in production."),
    "trireme.debug.transaction.marker.refuse": (
        "", "Fault injection for tests of stuck transactions: the coordinator's own markers for these partitions "
            "(a comma list of TOPIC-PARTITION) are answered TRANSACTION_COORDINATOR_FENCED instead of being sent; "
            "an operator's `trireme transactions complete` is not affected.  Empty (off) in production."),
    # --- authorizer (ACLs, super users, the first SCRAM user)
    "authorizer.class.name": (
        "", "Turns the authorizer on: Kafka's org.apache.kafka.metadata.authorizer.StandardAuthorizer (or Kafka 3's "
            "kafka.security.authorizer.AclAuthorizer, or trireme) enforce ACLs with Kafka's semantics.  Empty: no "
            "authorizer, every request allowed, the ACL APIs answer SECURITY_DISABLED."),
    "super.users": ("", "Principals allowed everything whatever the ACLs say, separated by semicolons "
                        "(User:admin;User:broker)."),
    "allow.everyone.if.no.acl.found": (
        False, "With the authorizer on: allow a request on a resource no ACL at all applies to."),
    "trireme.max.acls": (
        100000, "ACLs this broker keeps; CreateAcls beyond it answers POLICY_VIOLATION per binding (Kafka: no "
                "limit)."),
    "trireme.storage.add.scram": (
        "", "SCRAM users created when the data directory is new (no ACL, user or quota stored yet), in kafka-storage "
            "format --add-scram's form (SCRAM-SHA-512=[name=admin,password=...]), several separated by ';'.  Ignored "
            "afterwards."),
    "broker.heartbeat.interval.ms": (
        2000, "With trireme.storage=postgresql: how often this broker renews its lease in the cluster's database."),
    "broker.session.timeout.ms": (
        9000, "With trireme.storage=postgresql: how long a broker's lease lasts; a broker that has not renewed it for "
              "this long is no longer live, and its partitions move to the others."),
    "trireme.cluster.metadata.poll.ms": (
        500, "With trireme.storage=postgresql: how often this broker reads the cluster's brokers and partition leaders "
             "from the database (and, as the controller, assigns leaders)."),
    "broker.rack": ("", "This broker's rack, as Metadata and DescribeCluster list it (empty: none)."),
    "trireme.storage": (
        "local", "Where partition logs are durable: local (segments in the data directory, fsynced) or postgresql "
                 "(rows in the database trireme.storage.postgresql.dsn names; the data directory holds a cache).  "
                 "See docs/operations.md."),
    "trireme.storage.postgresql.dsn": (
        "", "With trireme.storage=postgresql: the database, as a libpq connection string or "
            "postgresql://user:password@host:port/dbname URL."),
    "trireme.fsync.enable": (True, "fsync before answering acks=1/all produce requests. false trades "
                                   "crash safety of acknowledged data for speed (Kafka's own default)."),
    "trireme.fsync.threads": (4, "How many partitions a group commit fsyncs at once (1-64; 1: one after "
                                 "another).  More make a round as long as its slowest fsync, not their sum, "
                                 "for some CPU per round."),
    # --- log cleaner
    "log.cleaner.enable": (True, "Run the log cleaner, which compacts topics whose cleanup.policy includes compact "
                                 "(and the internal topics).  false: compacted topics grow without bound."),
    "log.cleaner.threads": (1, "How many partitions are cleaned at once (each in a worker process)."),
    "log.cleaner.io.max.bytes.per.second": (
        1.7976931348623157e308, "The cleaners' I/O throttle: bytes read plus written per second, all cleaners "
                                "together (Kafka's default: no limit)."),
    "log.cleaner.dedupe.buffer.size": (
        134217728, "Memory for the cleaners' key-to-offset maps, all cleaners together: a cleaning covers at most "
                   "the dirty records whose keys fit in its share (about 24 bytes a key)."),
    "log.cleaner.backoff.ms": (15000, "How long the cleaner sleeps when no partition is cleanable."),
    "log.cleaner.min.cleanable.ratio": (0.5, "Default min.cleanable.dirty.ratio of topics."),
    "log.cleaner.delete.retention.ms": (86400000, "Default delete.retention.ms of topics."),
    "log.cleaner.min.compaction.lag.ms": (0, "Default min.compaction.lag.ms of topics."),
    "log.cleaner.max.compaction.lag.ms": (9223372036854775807, "Default max.compaction.lag.ms of topics."),
    "offsets.topic.segment.bytes": (104857600, "Segment size of __consumer_offsets: the cleaner compacts its rolled "
                                                "segments."),
    "transaction.state.log.segment.bytes": (104857600, "Segment size of __transaction_state: the cleaner compacts "
                                                        "its rolled segments."),
    "trireme.metrics.log.cleaner.max.partitions": (
        100, "trireme_log_cleaner_dirty_ratio reports the compacted partitions with the highest dirty ratio, at most "
             "this many."),
    # --- client quotas
    "quota.window.num": (11, "How many samples a client quota's rate is measured over (Kafka's)."),
    "quota.window.size.seconds": (1, "How long each of those samples lasts, in seconds; a request-quota throttle "
                                     "is at most one (Kafka's)."),
    "trireme.max.client.quota.entities": (
        100000, "How many users / client ids (and their defaults) may have client quotas: past it, AlterClientQuotas "
                "answers POLICY_VIOLATION for an entry that would add one (Kafka has no bound)."),
    "trireme.shutdown.grace.ms": (5000, "On SIGTERM, how long in-flight requests may take to finish."),
    "trireme.log.level": ("INFO", "Log level of the structured logs on stderr."),
    "trireme.metrics.listen": ("", "HOST:PORT for a Prometheus endpoint (GET /metrics); :PORT binds 127.0.0.1; "
                                   "empty: off."),
    "trireme.metrics.group.lag.max.groups": (
        100, "trireme_group_lag reports the consumer groups with the largest lag, at most this many."),
    "trireme.metrics.security.max.series": (
        100, "The security metrics labelled by principal, resource or client (denied requests, throttled clients) "
             "report the series with the largest counts, at most this many per metric."),
    "trireme.status.listen": ("", "HOST:PORT for the status page (open http://HOST:PORT/ in a browser); :PORT "
                                  "binds 127.0.0.1; the same address as trireme.metrics.listen serves both; "
                                  "empty: off."),
    "trireme.status.actions.enable": (
        False, "Let the status page abort transactions (POST with the page's per-process token)."),
}


INT_MAX = 2**31 - 1
SECURITY_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
LONG_MAX = 2**63 - 1
# Integer properties that only make sense within a range: (lowest, highest) (Kafka's validators where it has one);
# other integers are Java longs.
RANGES = {
    "quota.window.num": (1, INT_MAX),
    "quota.window.size.seconds": (1, INT_MAX),
    "trireme.max.client.quota.entities": (0, INT_MAX),
    "trireme.fsync.threads": (1, 64),
    "node.id": (0, INT_MAX),
    "broker.heartbeat.interval.ms": (1, INT_MAX),
    "broker.session.timeout.ms": (1, INT_MAX),
    "trireme.cluster.metadata.poll.ms": (1, INT_MAX),
    "num.partitions": (1, INT_MAX),
    "default.replication.factor": (1, INT_MAX),
    "log.retention.minutes": (-1, INT_MAX),
    "log.retention.hours": (-1, INT_MAX),
    "log.retention.check.interval.ms": (1, LONG_MAX),
    "log.roll.ms": (1, LONG_MAX),
    "log.roll.hours": (1, INT_MAX),
    "log.roll.jitter.ms": (0, LONG_MAX),
    "log.roll.jitter.hours": (0, INT_MAX),
    # --- log cleaner
    "log.cleaner.threads": (0, INT_MAX),
    "log.cleaner.dedupe.buffer.size": (1, LONG_MAX),
    "log.cleaner.backoff.ms": (0, LONG_MAX),
    "log.cleaner.delete.retention.ms": (0, LONG_MAX),
    "log.cleaner.min.compaction.lag.ms": (0, LONG_MAX),
    "log.cleaner.max.compaction.lag.ms": (1, LONG_MAX),
    "trireme.metrics.log.cleaner.max.partitions": (0, INT_MAX),
    "offsets.topic.segment.bytes": (1, INT_MAX),
    "transaction.state.log.segment.bytes": (1, INT_MAX),
    "socket.request.max.bytes": (1, INT_MAX),
    "fetch.max.bytes": (1024, INT_MAX),
    "max.connections": (0, INT_MAX),
    "max.connections.per.ip": (0, INT_MAX),
    "max.connection.creation.rate": (0, INT_MAX),
    "connections.max.idle.ms": (1, LONG_MAX),
    "request.timeout.ms": (1, INT_MAX),
    "trireme.max.partitions": (1, INT_MAX),
    "trireme.log.max.open.files": (1, INT_MAX),
    "producer.id.expiration.ms": (1, INT_MAX),
    "transactional.id.expiration.ms": (1, INT_MAX),
    "transaction.max.timeout.ms": (1, INT_MAX),
    "transaction.abort.timed.out.transaction.cleanup.interval.ms": (1, INT_MAX),
    "transaction.remove.expired.transaction.cleanup.interval.ms": (1, INT_MAX),
    "transaction.version": (0, 2),
    "group.initial.rebalance.delay.ms": (0, INT_MAX),
    "group.min.session.timeout.ms": (0, INT_MAX),
    "group.max.session.timeout.ms": (0, INT_MAX),
    "offsets.retention.minutes": (1, INT_MAX),
    "offsets.retention.check.interval.ms": (1, LONG_MAX),
    "log.flush.interval.messages": (1, LONG_MAX),
    "log.flush.interval.ms": (0, LONG_MAX),
    "trireme.request.receive.timeout.ms": (1, LONG_MAX),
    "trireme.response.send.timeout.ms": (1, LONG_MAX),
    "trireme.shutdown.grace.ms": (0, LONG_MAX),
    "trireme.metrics.group.lag.max.groups": (0, INT_MAX),
    "trireme.metrics.security.max.series": (0, INT_MAX),
    # --- TLS and listeners (security protocols, certificates, principal mapping)
    "trireme.ssl.handshake.timeout.ms": (1, LONG_MAX),
    # --- SASL (mechanisms, JAAS, re-authentication, failed logins)
    "sasl.server.max.receive.size": (1, INT_MAX),
    "connections.max.reauth.ms": (0, LONG_MAX),
    "connection.failed.authentication.delay.ms": (0, INT_MAX),
    "sasl.oauthbearer.jwks.endpoint.refresh.ms": (1, LONG_MAX),
    "sasl.oauthbearer.clock.skew.seconds": (0, INT_MAX),
    "trireme.sasl.failed.authentications.per.minute": (0, INT_MAX),
    "trireme.debug.transaction.marker.delay.ms": (0, LONG_MAX),
    # --- authorizer
    "trireme.max.acls": (0, INT_MAX),
}
# Number (Kafka's DOUBLE) properties' ranges.
FLOAT_RANGES = {"log.cleaner.io.max.bytes.per.second": (1.0, float("inf")),
                "log.cleaner.min.cleanable.ratio": (0.0, 1.0)}
# String properties with a fixed set of values (any case; kept upper case).
CHOICES = {"trireme.log.level": ("DEBUG", "INFO", "WARNING", "WARN", "ERROR", "CRITICAL"),
           "trireme.storage": ("LOCAL", "POSTGRESQL"),
           "ssl.client.auth": ("NONE", "REQUESTED", "REQUIRED"),
           "security.inter.broker.protocol": SECURITY_PROTOCOLS}
# Kafka's other forms of a property in other units, most precise first: (name, factor to the property's unit).
# Kafka's precedence: the most precise form set wins; a negative value means no limit (-1).
UNIT_FORMS = {"log.retention.ms": (("log.retention.ms", 1), ("log.retention.minutes", 60_000),
                                   ("log.retention.hours", 3_600_000)),
              "log.roll.ms": (("log.roll.ms", 1), ("log.roll.hours", 3_600_000)),
              "log.roll.jitter.ms": (("log.roll.jitter.ms", 1), ("log.roll.jitter.hours", 3_600_000))}
# Kafka properties accepted without effect that concern security: said in a warning of their own, since a user
# may believe them in force.
SECURITY_PREFIXES = ("ssl.", "sasl.", "listener.name.", "authorizer.", "super.users", "allow.everyone.",
                     "principal.builder.", "security.", "delegation.token.", "password.encoder.")
# Kafka's per-listener overrides: listener.name.<listener>.<property> (Config.for_listener).
LISTENER_PREFIX = "listener.name."
# --- SASL: Kafka properties kept as given (secrets: not in PROPERTIES, so never described) that SASL reads
_SASL_MECHANISM_PREFIXES = ("plain.", "scram-sha-256.", "scram-sha-512.", "oauthbearer.")


def read_by_sasl(name: str) -> bool:
    """Whether SASL (server/authentication.py) reads ``name``: the JAAS lines (``sasl.jaas.config``, per listener and
    mechanism) and the per-listener, per-mechanism forms of the SASL properties."""
    if name == "sasl.jaas.config":
        return True
    if not name.startswith(LISTENER_PREFIX):
        return False
    prop = name[len(LISTENER_PREFIX):].partition(".")[2]
    for prefix in _SASL_MECHANISM_PREFIXES:
        if prop.startswith(prefix):
            prop = prop[len(prefix):]
            break
    return prop == "sasl.jaas.config" or (prop.startswith("sasl.") and prop in PROPERTIES)
# Properties whose values are secrets: DescribeConfigs answers them as Kafka answers its PASSWORD configs (value
# null, is_sensitive), and nothing logs them.
SENSITIVE_PROPERTIES = frozenset({"trireme.storage.add.scram", "trireme.storage.postgresql.dsn", "sasl.jaas.config", "ssl.keystore.key", "ssl.key.password",
                                  "ssl.keystore.password", "ssl.truststore.password", "ssl.keystore.certificate.chain",
                                  "ssl.truststore.certificates"})
# String properties that hold a comma list of TOPIC-PARTITION (see :func:`partition_list`).
PARTITION_LISTS = frozenset({"trireme.debug.transaction.marker.refuse"})


class ConfigError(ValueError):
    pass


def _coerce(name: str, value: Any) -> Any:
    default = PROPERTIES[name][0]
    if isinstance(default, bool):
        if isinstance(value, bool):
            return value
        text = str(value).strip().lower()
        if text in ("true", "false"):
            return text == "true"
        raise ConfigError(f"{name} must be true or false, not {value!r}")
    if isinstance(default, int) or default is None:
        try:
            if isinstance(value, (bool, float)):
                raise ValueError
            number = int(str(value).strip())
        except ValueError:
            raise ConfigError(f"{name} must be an integer, not {value!r}") from None
        lowest, highest = RANGES.get(name, (-LONG_MAX - 1, LONG_MAX))
        if not lowest <= number <= highest:
            raise ConfigError(f"{name} must be from {lowest} to {highest}, not {number}")
        _check_topic_default(name, str(number))
        return number
    if isinstance(default, float):          # Kafka's DOUBLE properties
        try:
            if isinstance(value, bool):
                raise ValueError
            number = float(str(value).strip())
        except ValueError:
            raise ConfigError(f"{name} must be a number, not {value!r}") from None
        lowest, highest = FLOAT_RANGES.get(name, (float("-inf"), float("inf")))
        if not lowest <= number <= highest or number != number:
            raise ConfigError(f"{name} must be from {lowest} to {highest}, not {number}")
        _check_topic_default(name, str(number))
        return number
    text = str(value).strip()
    if name in PARTITION_LISTS:
        partition_list(text, name)
    if name in CHOICES:
        if text.upper() not in CHOICES[name]:
            raise ConfigError(f"{name} must be one of {', '.join(CHOICES[name])}, not {value!r}")
        text = text.upper()
    _check_topic_default(name, text)
    return text


def _check_topic_default(name: str, text: str) -> None:
    """A broker property that is the default of a topic config is held to that config's rule."""
    for topic_key, broker_key in TOPIC_DEFAULT_PROPERTIES.items():
        if broker_key == name:
            problem = validate_config(topic_key, text)
            if problem is not None:
                raise ConfigError(f"{name} must be a valid {topic_key} ({problem}), not {text!r}")


def is_kafka_property(name: str) -> bool:
    """Whether Kafka's broker defines ``name`` (see kafka_broker_properties.py)."""
    return name in KAFKA_BROKER_PROPERTIES or name.startswith(KAFKA_BROKER_PREFIXES)


def unknown_property(name: str, value: Any, source: str) -> ConfigError:
    """The one-line refusal of a name neither Trireme nor Kafka's broker defines, with the nearest known name."""
    if isinstance(value, dict):       # TOML read `num.partitions = 3` as the table num = {partitions = 3}
        dotted, inner = name, value
        while isinstance(inner, dict) and len(inner) == 1:
            (key, inner), = inner.items()
            dotted += "." + key
        shown = "..." if isinstance(inner, dict) else json.dumps(inner)     # TOML's spelling: true, "text", 3
        return ConfigError(f"{source}: unknown property {name!r} (a TOML table): quote dotted keys in TOML: "
                           f"\"{dotted}\" = {shown}")
    known = sorted(set(PROPERTIES) | KAFKA_BROKER_PROPERTIES)
    nearest = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
    hint = f"did you mean {nearest[0]}?" if nearest else "see trireme serve --help"
    return ConfigError(f"{source}: unknown property {name!r}, neither Trireme's nor Kafka's: {hint}")


def partition_list(text: str, name: str = "value") -> frozenset[tuple[str, int]]:
    """A comma list of TOPIC-PARTITION (``orders-0,orders-3``; empty: none) → {(topic, partition)}."""
    out = set()
    for item in filter(None, (part.strip() for part in text.split(","))):
        topic, sep, index = item.rpartition("-")
        if not sep or not topic or not index.isdigit():
            raise ConfigError(f"{name} must be a comma list of TOPIC-PARTITION, not {item!r}")
        out.add((topic, int(index)))
    return frozenset(out)


def parse_properties(text: str) -> dict[str, str]:
    """Java ``.properties`` text as Kafka reads server.properties: ``key=value``, ``key: value`` or ``key value``
    lines; ``#`` and ``!`` start comment lines; a line ending in an odd number of backslashes goes on on the next line
    (its leading blanks dropped: how Kafka's docs write a JAAS line over several lines); ``\\n``, ``\\t``,
    ``\\uXXXX`` and ``\\`` before any other character are Java's escapes.  Values are stripped of surrounding
    blanks."""
    out: dict[str, str] = {}
    logical: list[str] = []
    pending: str | None = None
    for raw in text.splitlines():
        line = raw.lstrip()
        if pending is None and (not line or line[0] in "#!"):
            continue
        run = len(line) - len(line.rstrip("\\"))
        if run % 2:
            pending = (pending or "") + line[:-1]
            continue
        logical.append((pending or "") + line)
        pending = None
    if pending is not None:
        logical.append(pending)
    for line in logical:
        m = _PROPERTY_LINE.match(line.strip())
        out[_unescape_property(m.group(1))] = _unescape_property(m.group(2)).strip()
    return out


_PROPERTY_LINE = re.compile(r"((?:\\.|[^=:\s\\])*)\s*[=:\s]?\s*(.*)$", re.S)
_PROPERTY_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "f": "\f"}


def _unescape_property(text: str) -> str:
    def one(m: re.Match) -> str:
        if m.group(1):
            return chr(int(m.group(1), 16))
        return _PROPERTY_ESCAPES.get(m.group(2), m.group(2))
    return re.sub(r"\\(?:u([0-9a-fA-F]{4})|(.))", one, text, flags=re.S)


def read_config_file(path: str) -> dict[str, Any]:
    with open(path, "rb") as f:
        raw = f.read()
    if path.endswith(".toml"):
        try:
            return tomllib.loads(raw.decode("utf-8"))
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(f"{path}: {e}") from None
    return parse_properties(raw.decode("utf-8"))


@dataclasses.dataclass
class Config:
    data_dir: str
    listen_host: str = "127.0.0.1"
    listen_port: int = 9092
    advertised_host: str | None = None
    advertised_port: int | None = None
    values: dict[str, Any] = dataclasses.field(default_factory=dict)
    # Kafka properties set that have no effect here: name → (value as given, source).
    no_effect: dict[str, tuple[str, str]] = dataclasses.field(default_factory=dict)
    # Where each property in ``values`` was set (a file's path, --set, the fixture).
    sources: dict[str, str] = dataclasses.field(default_factory=dict)
    # Kafka's per-listener overrides as given: listener.name.<listener>.<property> (listener lower case) → value.
    listener_values: dict[str, str] = dataclasses.field(default_factory=dict)
    # The client listeners (resolve_listeners), the first one's address in listen_host/port above.
    listeners: list = dataclasses.field(default_factory=list)
    inter_broker_listener: str = "PLAINTEXT"

    def __getitem__(self, name: str) -> Any:
        if name in UNIT_FORMS:
            setting = self.setting(name)
            if setting is not None:
                form, value = setting
                return -1 if value < 0 else value * dict(UNIT_FORMS[name])[form]
        if name in self.values:
            return self.values[name]
        return PROPERTIES[name][0]

    def setting(self, name: str) -> tuple[str, Any] | None:
        """The explicit setting that decides ``name``, as (the name set, its value): for a property with forms in
        other units (log.retention.ms/minutes/hours) the most precise form set; None when it has its default."""
        for form, _ in UNIT_FORMS.get(name, ((name, 1),)):
            if form in self.values:
                return form, self.values[form]
        return None

    def is_set(self, name: str) -> bool:
        return self.setting(name) is not None

    def set(self, name: str, value: Any, source: str = "--set") -> None:
        """Apply one property from ``source`` (a file's path, --set, the fixture): used if Trireme has it,
        noted as without effect if only Kafka's broker has it, else refused (ConfigError, one line)."""
        if name.startswith(LISTENER_PREFIX) and not isinstance(value, dict):
            listener, sep, prop = name[len(LISTENER_PREFIX):].partition(".")
            if not sep or not listener or not prop:
                raise ConfigError(f"{source}: {name!r}: expected listener.name.<listener>.<property>")
            self.listener_values[f"{LISTENER_PREFIX}{listener.lower()}.{prop}"] = str(value)
            self.sources[name] = source
            if prop not in PROPERTIES:
                self.no_effect[name] = (str(value), source)
        elif name in PROPERTIES:
            try:
                self.values[name] = _coerce(name, value)
            except ConfigError as e:
                raise ConfigError(f"{source}: {e}") from None
            self.sources[name] = source
        elif is_kafka_property(name) and not isinstance(value, dict):
            self.no_effect[name] = (str(value), source)
        else:
            raise unknown_property(name, value, source)

    def for_listener(self, listener: str, name: str) -> Any:
        """Property ``name`` as it applies to ``listener``: Kafka's override listener.name.<listener>.<name> when
        set (a string, as given), else the broker-wide value (``self[name]`` for Trireme's properties, else the raw
        value set, else None).  For SASL, ``name`` carries the mechanism as Kafka's does:
        ``scram-sha-512.sasl.jaas.config``."""
        override = self.listener_values.get(f"{LISTENER_PREFIX}{listener.lower()}.{name}")
        if override is not None:
            return override
        if name in PROPERTIES:
            return self[name]
        raw = self.no_effect.get(name)
        return None if raw is None else raw[0]

    def update(self, mapping: dict[str, Any], source: str = "--set") -> None:
        for name, value in mapping.items():
            self.set(name, value, source)

    def report_no_effect(self) -> None:
        """Log, once at start-up, the Kafka properties that were set but mean nothing here."""
        names = sorted(n for n in self.no_effect if not read_by_sasl(n))
        secure = [n for n in names if n.startswith(SECURITY_PREFIXES)]
        other = [n for n in names if n not in secure]
        if other:
            log.info("no effect here (Kafka properties Trireme does not use): %s", ", ".join(other))
        if secure:
            log.warning("no effect here (Kafka security properties Trireme does not use; see docs/security.md): %s",
                        ", ".join(secure))

    def resolve_listeners(self, listen: tuple[str, int] | None = None,
                          advertised: tuple[str, int] | None = None) -> list["ListenerSpec"]:
        """The client listeners from ``listeners`` / ``advertised.listeners`` / ``listener.security.protocol.map``
        (the controller listeners left out), with ``listen`` (--listen, the fixture) as the PLAINTEXT listener's
        address, put first (added when ``listeners`` has none) and ``advertised`` as its advertised address.
        Sets ``self.listeners`` and the first listener's address (listen_host/port, advertised_host/port)."""
        try:
            specs = self._listener_specs(listen, advertised)
        except ConfigError as e:
            source = next((self.sources[n] for n in ("listeners", "advertised.listeners",
                                                     "listener.security.protocol.map", "inter.broker.listener.name",
                                                     "security.inter.broker.protocol") if n in self.sources), "--set")
            raise ConfigError(f"{source}: {e}") from None
        self.listeners = specs
        first = specs[0]
        self.listen_host, self.listen_port = first.host, first.port
        self.advertised_host, self.advertised_port = first.advertised_host, first.advertised_port
        return specs

    def _listener_specs(self, listen, advertised) -> list["ListenerSpec"]:
        protocols = protocol_map(self["listener.security.protocol.map"])
        controllers = {n.strip().upper() for n in self["controller.listener.names"].split(",") if n.strip()}
        specs = []
        for name, host, port in parse_listener_list("listeners", self["listeners"], controllers):
            protocol = protocols.get(name)
            if protocol is None:
                raise ConfigError(f"listeners: listener.security.protocol.map gives no security protocol for "
                                  f"listener {name}")
            specs.append(ListenerSpec(name, protocol, host or "0.0.0.0", port))   # empty: every interface
        if listen is not None:
            plain = next((s for s in specs if s.security_protocol == "PLAINTEXT"), None)
            if plain is None:
                if any(s.name == "PLAINTEXT" for s in specs):
                    raise ConfigError("listeners: --listen needs a PLAINTEXT listener, and the name PLAINTEXT is "
                                      "mapped to another security protocol")
                plain = ListenerSpec("PLAINTEXT", "PLAINTEXT", *listen)
            else:
                specs.remove(plain)
                plain.host, plain.port = listen
            specs.insert(0, plain)
        if not specs:
            specs.append(ListenerSpec("PLAINTEXT", "PLAINTEXT", self.listen_host, self.listen_port))
        by_name = {s.name: s for s in specs}
        for name, host, port in parse_listener_list("advertised.listeners", self["advertised.listeners"], controllers):
            if name not in by_name:
                raise ConfigError(f"advertised.listeners: listener {name} is not in listeners (advertised listener "
                                  f"names must be listeners' names)")
            if not host or host == "0.0.0.0":
                raise ConfigError(f"advertised.listeners: {name}://{host}:{port} needs a host clients can connect to")
            by_name[name].advertised_host, by_name[name].advertised_port = host, port
        if advertised is not None:
            specs[0].advertised_host, specs[0].advertised_port = advertised
        self.inter_broker_listener = self._inter_broker_listener(by_name, specs)
        return specs

    def _inter_broker_listener(self, by_name: dict[str, "ListenerSpec"], specs: list["ListenerSpec"]) -> str:
        """Kafka's inter.broker.listener.name / security.inter.broker.protocol (not both), checked against the
        listeners; unset, the listener named after the protocol, else the first (Kafka would refuse to start)."""
        name = self["inter.broker.listener.name"].strip().upper()
        if name:
            if self.is_set("security.inter.broker.protocol"):
                raise ConfigError("Only one of inter.broker.listener.name and security.inter.broker.protocol "
                                  "should be set.")
            if name not in by_name:
                raise ConfigError(f"inter.broker.listener.name must be a listener name defined in listeners, "
                                  f"not {name}")
            return name
        protocol = self["security.inter.broker.protocol"]
        if protocol in by_name and by_name[protocol].security_protocol == protocol:
            return protocol
        if self.is_set("security.inter.broker.protocol"):
            raise ConfigError(f"security.inter.broker.protocol={protocol} needs a listener named {protocol} in "
                              f"listeners")
        return specs[0].name


@dataclasses.dataclass
class ListenerSpec:
    """One client listener as configured: Kafka's EndPoint (listener name, security protocol, address) with the
    address advertised for it (None: its own)."""
    name: str
    security_protocol: str
    host: str
    port: int
    advertised_host: str | None = None
    advertised_port: int | None = None


def protocol_map(text: str) -> dict[str, str]:
    """listener.security.protocol.map (NAME:PROTOCOL,...) → {listener name: security protocol}, checked."""
    out = {}
    for pair in filter(None, (p.strip() for p in text.split(","))):
        name, sep, protocol = pair.partition(":")
        name, protocol = name.strip().upper(), protocol.strip().upper()
        if not sep or not name:
            raise ConfigError(f"listener.security.protocol.map: expected LISTENER_NAME:SECURITY_PROTOCOL, got {pair!r}")
        if protocol not in SECURITY_PROTOCOLS:
            raise ConfigError(f"listener.security.protocol.map: {pair!r}: the security protocol must be one of "
                              f"{', '.join(SECURITY_PROTOCOLS)}")
        out[name] = protocol
    return out


def parse_listener_list(prop: str, value: str, controllers=frozenset()) -> list[tuple[str, str, int]]:
    """Kafka's ``listeners`` / ``advertised.listeners`` value → [(listener name, host, port)], the ``controllers``
    (listener names, upper case) left out; each name once, as Kafka requires.  An empty host stays empty."""
    out: list[tuple[str, str, int]] = []
    for entry in (e.strip() for e in value.split(",") if e.strip()):
        scheme, sep, address = entry.partition("://")
        name = scheme.strip().upper()
        if not sep or not name or not re.fullmatch(r"[A-Z0-9_.-]+", name):
            raise ConfigError(f"{prop}: expected NAME://HOST:PORT, got {entry!r}")
        if name in controllers:
            continue
        if any(n == name for n, _, _ in out):
            raise ConfigError(f"{prop}: each listener must have a different name, {name} is there twice")
        host, port = parse_host_port(address, default_host="")
        out.append((name, host, port))
    ports = [p for _, _, p in out if p]
    if prop == "listeners" and len(set(ports)) != len(ports):
        raise ConfigError(f"{prop}: each listener must have a different port, got {value!r}")
    return out


def parse_host_port(text: str, default_host: str = "0.0.0.0") -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit():
        raise ConfigError(f"expected HOST:PORT, got {text!r}")
    if int(port) > 65535:
        raise ConfigError(f"port out of range (0-65535) in {text!r}")
    return host.strip("[]") or default_host, int(port)


def parse_topic_spec(text: str) -> tuple[str, int, dict[str, str]]:
    """``NAME[:PARTITIONS[:KEY=VALUE,KEY=VALUE...]]`` (``trireme serve --topic``) → (name, partitions, configs).
    Partitions default to -1 (num.partitions); a comma inside a value (``cleanup.policy=compact,delete``) is kept."""
    name, _, rest = text.partition(":")
    count, _, settings = rest.partition(":")
    try:
        partitions = int(count) if count else -1
    except ValueError:
        raise ConfigError(f"--topic {text!r}: partitions must be an integer") from None
    configs: dict[str, str] = {}
    key = None
    for piece in settings.split(",") if settings else ():
        if "=" in piece:
            key, _, value = piece.partition("=")
            configs[key.strip()] = value.strip()
        elif key is None:
            raise ConfigError(f"--topic {text!r}: expected KEY=VALUE, got {piece!r}")
        else:
            configs[key.strip()] += "," + piece.strip()
    if not name:
        raise ConfigError(f"--topic {text!r}: a topic name is needed")
    return name, partitions, configs
