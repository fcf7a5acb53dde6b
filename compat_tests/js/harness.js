#!/usr/bin/env node
// Line-oriented JSON driver for kafkajs 2.2.4 (same protocol as
// compat_tests/java/Harness.java).
//
// Usage: node harness.js <bootstrap>
//
// One JSON command object per stdin line -> exactly one JSON response line on
// stdout.  Every response has "ok"; failures have "error" ("ErrorName:
// message"), "error_class" (the kafkajs error name) and, for broker errors,
// "error_type" (the Kafka error code name, e.g. TOPIC_ALREADY_EXISTS).
// kafkajs logging goes to stderr (level: HARNESS_LOG_LEVEL=ERROR|WARN|INFO|
// DEBUG|NOTHING, default WARN).  Commands are executed strictly one at a time.
//
// Differences from the Java harness, forced by kafkajs:
//  * consume: kafkajs has no assign().  Default (mode "fetch"): the harness
//    does what assign()+seek()+poll() would do with kafkajs' own pieces - a
//    kafkajs Cluster (created with the wanted isolation level), Fetch
//    requests sent through kafkajs' broker client, and kafkajs' consumer
//    `Batch` class, which decodes/decompresses the record batches, drops
//    records below the fetch offset, control records and (read_committed)
//    aborted transactions.  No consumer group is involved, so a test can read
//    any partition from any offset deterministically, even on a broker
//    without group support.  kafkajs internals used (pinned 2.2.4):
//    Kafka's private createCluster symbol and src/consumer/batch.js.
//    Mode "group" ({"mode": "group"}) uses the real kafkajs consumer
//    instead: a throw-away consumer in a unique group ("trireme-harness-
//    <pid>-<n>", autoCommit off, so nothing is committed) subscribes to the
//    topic and, once `run()` has joined the group, `seek()`s each requested
//    partition (kafkajs applies a pending seek before the next fetch and
//    drops fetched data for partitions with a seek pending); it leaves the
//    group when the command ends.  In both modes `position` is the next
//    offset to read; offsets "earliest"/"latest" are resolved by ListOffsets
//    (fetch mode) or map to the special seek offsets -2/-1 (group mode).
//  * isolation: kafkajs consumers default to read_committed (kept); pass
//    config {"isolation.level": "read_uncommitted"} to change it.
//    consumer_offsets also defaults to read_committed, list_offsets to
//    read_uncommitted (like the Java admin client).
//  * list_offsets / consumer_offsets issue ListOffsets through a kafkajs
//    cluster object created with the wanted isolation level (kafkajs' admin
//    has no isolation option and drops timestamps).  "max_timestamp" is
//    not supported by kafkajs (its ListOffsets stops at v3) -> error.
//  * alter_config: kafkajs has no IncrementalAlterConfigs; we read the
//    topic's current dynamic configs (DescribeConfigs), change the one key
//    and write the whole set back with AlterConfigs.
//  * consume {..., until_end: true} (fetch mode only): the command also stops
//    once every partition's position has reached the end offset listed
//    (ListOffsets latest, the consumer's isolation level: the LSO for
//    read_committed) after the seek; those come back as end_offsets
//    [[partition, end]].
//  * transactions: kafkajs has no initTransactions(); its transactional
//    InitProducerId is sent by the producer's first transaction().
//      init_producer {handle, config?}  create + connect a kept producer
//      begin_txn {handle}               producer.transaction(), kept open
//      commit_txn {handle} | abort_txn {handle}
//    While a kept producer has a transaction opened by begin_txn, produce
//    {handle, ...} (without "txn") sends through that transaction.
//    commit_txn/abort_txn forget the transaction when they succeed.
//  * produce: compression "gzip" or "none" only (kafkajs ships only GZIP).
//    Records that all carry an explicit partition go out in one send();
//    otherwise each record is sent on its own so its partition is known.
//    Header keys are grouped (kafkajs takes headers as an object): repeated
//    keys keep their relative order, interleaving with other keys is lost.
//  * delete_records returns low_watermark: null (kafkajs does not expose it).
//  * subscribe/poll: kafkajs pushes batches; the harness hands a record to
//    the caller only while a `poll` is waiting and resolves its offset only
//    then (eachBatchAutoResolve off), so undelivered records are re-fetched
//    and `commit {}` commits exactly what `poll` returned.

'use strict'

const readline = require('readline')
const {
  Kafka,
  logLevel: LogLevel,
  CompressionTypes,
  CompressionCodecs,
  ConfigResourceTypes,
  AssignerProtocol,
  Partitioners,
} = require('kafkajs')

const KAFKAJS_VERSION = require('kafkajs/package.json').version

const bootstrap = process.argv[2]
if (!bootstrap) {
  process.stderr.write('usage: node harness.js <bootstrap-servers>\n')
  process.exit(2)
}

// Keep stdout for protocol lines only.
const stdoutWrite = process.stdout.write.bind(process.stdout)
console.log = console.info = console.debug = console.warn = (...a) =>
  process.stderr.write(a.map(String).join(' ') + '\n')

const DEFAULT_TIMEOUT_MS = 10000
const LEVELS = {
  NOTHING: LogLevel.NOTHING,
  ERROR: LogLevel.ERROR,
  WARN: LogLevel.WARN,
  INFO: LogLevel.INFO,
  DEBUG: LogLevel.DEBUG,
}
const level = LEVELS[(process.env.HARNESS_LOG_LEVEL || 'WARN').toUpperCase()] ?? LogLevel.WARN

const stderrLogCreator = () => ({ namespace, level: lvl, label, log }) => {
  const { message, timestamp, logger, ...extra } = log
  process.stderr.write(
    `[${timestamp}] ${label} ${namespace}: ${message} ${JSON.stringify(extra)}\n`
  )
}

// HARNESS_KAFKAJS_SECURITY: a JSON object {ssl?: {ca?, cert?, key?} (PEM file paths), sasl?: {mechanism,
// username, password}} given to every kafkajs client the harness creates (kafkajs' own `ssl` and `sasl`
// options; the files are read here).  Unset: PLAINTEXT.
function securityOptions() {
  const text = process.env.HARNESS_KAFKAJS_SECURITY
  if (!text) return {}
  const fs = require('fs')
  const given = JSON.parse(text)
  const out = {}
  if (given.ssl) {
    out.ssl = {}
    for (const k of ['ca', 'cert', 'key']) {
      if (given.ssl[k]) out.ssl[k] = fs.readFileSync(given.ssl[k], 'utf8')
    }
  }
  if (given.sasl) out.sasl = given.sasl
  return out
}
const SECURITY = securityOptions()

function makeKafka(clientId = 'trireme-harness') {
  return new Kafka({
    clientId,
    brokers: bootstrap.split(','),
    connectionTimeout: 3000,
    requestTimeout: DEFAULT_TIMEOUT_MS,
    retry: { retries: 3, initialRetryTime: 200, maxRetryTime: 2000 },
    logLevel: level,
    logCreator: stderrLogCreator,
    ...SECURITY,
  })
}

const kafka = makeKafka()
let admin = null
let adminConnected = false
const producers = new Map()
const openTxns = new Map() // producer handle -> kafkajs transaction (begin_txn)
const consumers = new Map()
let seq = 0

class BadCommand extends Error {
  constructor(msg) {
    super(msg)
    this.name = 'BadCommand'
  }
}

const sleep = ms => new Promise(r => setTimeout(r, ms))

function withTimeout(promise, ms, what) {
  let t
  return Promise.race([
    promise,
    new Promise((_, reject) => {
      t = setTimeout(() => {
        const e = new Error(`${what} timed out after ${ms} ms`)
        e.name = 'TimeoutException'
        reject(e)
      }, ms)
    }),
  ]).finally(() => clearTimeout(t))
}

async function getAdmin() {
  if (!admin) admin = kafka.admin()
  if (!adminConnected) {
    await admin.connect()
    adminConnected = true
  }
  return admin
}

const b64d = s => (s == null ? null : Buffer.from(s, 'base64'))
const b64e = b => (b == null ? null : Buffer.from(b).toString('base64'))
const num = v => (v == null ? null : Number(v))

function req(c, key) {
  if (c[key] == null) throw new BadCommand(`missing "${key}"`)
  return c[key]
}

function partitionsArg(c) {
  if (Array.isArray(c.partitions)) return c.partitions
  if (typeof c.partitions === 'number') return [...Array(c.partitions).keys()]
  return [c.partition ?? 0]
}

// ----------------------------------------------------------------- config

function takeConfig(cfg, mapping, what) {
  const out = {}
  for (const [k, v] of Object.entries(cfg || {})) {
    if (!(k in mapping)) throw new BadCommand(`unsupported ${what} config key "${k}" for kafkajs`)
    if (v == null) continue
    mapping[k](out, v)
  }
  return out
}

const asBool = v => v === true || v === 'true'

const PRODUCER_CFG = {
  acks: (o, v) => (o.acks = v === 'all' ? -1 : Number(v)),
  'compression.type': (o, v) => (o.compression = v),
  compression: (o, v) => (o.compression = v),
  'enable.idempotence': (o, v) => (o.idempotent = asBool(v)),
  idempotent: (o, v) => (o.idempotent = asBool(v)),
  'transactional.id': (o, v) => (o.transactionalId = String(v)),
  transactionalId: (o, v) => (o.transactionalId = String(v)),
  'transaction.timeout.ms': (o, v) => (o.transactionTimeout = Number(v)),
  'max.in.flight.requests.per.connection': (o, v) => (o.maxInFlightRequests = Number(v)),
  'request.timeout.ms': (o, v) => (o.timeout = Number(v)),
  'client.id': (o, v) => (o.clientId = String(v)),
  'allow.auto.create.topics': (o, v) => (o.allowAutoTopicCreation = asBool(v)),
}

const CONSUMER_CFG = {
  'isolation.level': (o, v) => (o.readUncommitted = v === 'read_uncommitted'),
  readUncommitted: (o, v) => (o.readUncommitted = asBool(v)),
  'session.timeout.ms': (o, v) => (o.sessionTimeout = Number(v)),
  'heartbeat.interval.ms': (o, v) => (o.heartbeatInterval = Number(v)),
  'rebalance.timeout.ms': (o, v) => (o.rebalanceTimeout = Number(v)),
  'max.poll.interval.ms': (o, v) => (o.rebalanceTimeout = Number(v)),
  'fetch.max.wait.ms': (o, v) => (o.maxWaitTimeInMs = Number(v)),
  'fetch.min.bytes': (o, v) => (o.minBytes = Number(v)),
  'fetch.max.bytes': (o, v) => (o.maxBytes = Number(v)),
  'max.partition.fetch.bytes': (o, v) => (o.maxBytesPerPartition = Number(v)),
  'auto.offset.reset': (o, v) => (o.fromBeginning = v === 'earliest'),
  'client.id': (o, v) => (o.clientId = String(v)),
  'allow.auto.create.topics': (o, v) => (o.allowAutoTopicCreation = asBool(v)),
  'enable.auto.commit': (o, v) => {
    if (asBool(v)) throw new BadCommand('enable.auto.commit=true is not supported by the harness')
  },
  'group.id': (o, v) => (o.groupId = String(v)),
}

function consumerOptions(c, groupId) {
  const o = takeConfig(c.config, CONSUMER_CFG, 'consumer')
  const { fromBeginning = true, clientId, ...rest } = o
  return {
    kafkaClient: clientId ? makeKafka(clientId) : kafka,
    fromBeginning,
    options: { maxWaitTimeInMs: 500, retry: { retries: 3 }, ...rest, groupId: rest.groupId || groupId },
  }
}

// ------------------------------------------------------------ list offsets

const ISOLATION = { read_uncommitted: 0, read_committed: 1 }

function privateCreateCluster(k) {
  const sym = Object.getOwnPropertySymbols(k).find(
    s => s.description === 'private:Kafka:createCluster'
  )
  if (!sym) throw new Error('kafkajs internals changed: createCluster not found')
  return k[sym]
}

// Runs ListOffsets with an explicit isolation level; returns
// {partition: {offset, timestamp}} for the requested partitions.
async function listOffsetsRaw(topic, partitions, timestamp, isolationLevel) {
  const cluster = privateCreateCluster(kafka)({ allowAutoTopicCreation: false, isolationLevel })
  await cluster.connect()
  try {
    await cluster.addTargetTopic(topic)
    await cluster.refreshMetadata()
    const byLeader = cluster.findLeaderForPartitions(topic, partitions)
    const out = {}
    for (const [nodeId, parts] of Object.entries(byLeader)) {
      const broker = await cluster.findBroker({ nodeId })
      const { responses } = await broker.listOffsets({
        replicaId: -1,
        isolationLevel,
        topics: [{ topic, partitions: parts.map(partition => ({ partition, timestamp })) }],
      })
      for (const r of responses)
        for (const p of r.partitions)
          out[p.partition] = {
            offset: num(p.offset),
            timestamp: p.timestamp == null ? null : num(p.timestamp),
          }
    }
    for (const p of partitions)
      if (!(p in out)) throw new BadCommand(`no leader known for ${topic}-${p}`)
    return out
  } finally {
    await cluster.disconnect().catch(() => {})
  }
}

function specTimestamp(spec) {
  if (spec == null || spec === 'latest') return -1
  if (spec === 'earliest') return -2
  if (spec === 'max_timestamp') {
    const e = new Error('kafkajs does not support OffsetSpec max_timestamp (ListOffsets <= v3)')
    e.name = 'UnsupportedVersionException'
    throw e
  }
  if (typeof spec === 'number' || /^-?[0-9]+$/.test(String(spec))) return Number(spec)
  throw new BadCommand(`bad spec ${spec}`)
}

// --------------------------------------------------------------- records

function headersOut(h) {
  const out = []
  for (const [k, v] of Object.entries(h || {})) {
    if (Array.isArray(v)) v.forEach(x => out.push([k, b64e(x)]))
    else out.push([k, b64e(v)])
  }
  return out
}

function headersIn(list) {
  const h = {}
  for (const [k, v] of list || []) {
    const val = b64d(v)
    if (!(k in h)) h[k] = val
    else if (Array.isArray(h[k])) h[k].push(val)
    else h[k] = [h[k], val]
  }
  return h
}

function recordOut(topic, partition, m) {
  const tsType = m.batchContext && m.batchContext.timestampType === 1 ? 'LogAppendTime' : 'CreateTime'
  return {
    topic,
    partition,
    offset: num(m.offset),
    key_b64: b64e(m.key),
    value_b64: b64e(m.value),
    headers: headersOut(m.headers),
    timestamp: num(m.timestamp),
    timestamp_type: tsType,
    leader_epoch:
      m.batchContext && m.batchContext.partitionLeaderEpoch != null
        ? m.batchContext.partitionLeaderEpoch
        : null,
  }
}

// ---------------------------------------------------------------- consume

const Batch = require('kafkajs/src/consumer/batch')

async function consumeFetch(c, topic, parts, count, timeoutMs) {
  const cfg = takeConfig(c.config, CONSUMER_CFG, 'consumer')
  const iso = cfg.readUncommitted ? 0 : 1
  const deadline = Date.now() + timeoutMs
  const cluster = privateCreateCluster(kafka)({ allowAutoTopicCreation: false, isolationLevel: iso })
  const out = []
  const next = {}
  const ends = {}
  await cluster.connect()
  try {
    await cluster.addTargetTopic(topic)
    await cluster.refreshMetadata()
    const off = c.offset
    if (typeof off === 'number') for (const p of parts) next[p] = off
    else {
      const spec = off === 'latest' || off === 'end' ? -1 : -2
      const r = await listOffsetsRaw(topic, parts, spec, iso)
      for (const p of parts) next[p] = r[p].offset
    }
    if (c.until_end) {
      const r = await listOffsetsRaw(topic, parts, -1, iso)
      for (const p of parts) ends[p] = r[p].offset
    }
    while (out.length < count) {
      if (c.until_end && parts.every(p => next[p] >= ends[p])) break
      const left = deadline - Date.now()
      if (left <= 0) break
      const byLeader = cluster.findLeaderForPartitions(topic, parts)
      for (const [nodeId, leaderParts] of Object.entries(byLeader)) {
        const broker = await cluster.findBroker({ nodeId })
        const { responses } = await broker.fetch({
          replicaId: -1,
          isolationLevel: iso,
          maxWaitTime: Math.min(500, Math.max(0, left)),
          minBytes: cfg.minBytes ?? 1,
          maxBytes: cfg.maxBytes ?? 52428800,
          topics: [
            {
              topic,
              partitions: leaderParts.map(partition => ({
                partition,
                fetchOffset: String(next[partition]),
                maxBytes: cfg.maxBytesPerPartition ?? 1048576,
              })),
            },
          ],
        })
        for (const r of responses)
          for (const pd of r.partitions) {
            const batch = new Batch(topic, String(next[pd.partition]), pd)
            for (const m of batch.messages) {
              if (out.length >= count) break
              out.push(recordOut(topic, pd.partition, m))
              next[pd.partition] = Number(m.offset) + 1
            }
            if (batch.isEmpty() && batch.isEmptyDueToFiltering())
              next[pd.partition] = Number(batch.lastOffset()) + 1
          }
      }
    }
  } finally {
    await cluster.disconnect().catch(() => {})
  }
  return { out, next, ends: c.until_end ? ends : null }
}

async function consumeGroup(c, topic, parts, count, timeoutMs) {
  const wanted = new Set(parts)
  const off = c.offset
  let seekTo
  if (off == null || off === 'earliest' || off === 'beginning') seekTo = '-2'
  else if (off === 'latest' || off === 'end') seekTo = '-1'
  else seekTo = String(off)
  const groupId = `trireme-harness-${process.pid}-${++seq}`
  const { kafkaClient, options } = consumerOptions(c, groupId)
  const consumer = kafkaClient.consumer(options)
  const out = []
  const next = {}
  if (typeof off === 'number') for (const p of parts) next[p] = off
  let crash = null
  let finish
  const done = new Promise(r => (finish = r))
  consumer.on(consumer.events.CRASH, e => {
    crash = e.payload.error
    finish()
  })
  const deadline = Date.now() + timeoutMs
  let timer = null
  try {
    await withTimeout(consumer.connect(), timeoutMs + 5000, 'consumer connect')
    await consumer.subscribe({ topics: [topic], fromBeginning: true })
    await withTimeout(
      consumer.run({
        autoCommit: false,
        eachBatchAutoResolve: false,
        eachBatch: async ({ batch, resolveOffset, isRunning, isStale }) => {
          if (!wanted.has(batch.partition)) return
          for (const m of batch.messages) {
            if (!isRunning() || isStale() || out.length >= count) break
            out.push(recordOut(batch.topic, batch.partition, m))
            next[batch.partition] = Number(m.offset) + 1
            resolveOffset(m.offset)
          }
          if (out.length >= count) finish()
        },
      }),
      Math.max(1000, deadline - Date.now() + 5000),
      'consumer group join'
    )
    if (crash) throw crash
    for (const p of parts) consumer.seek({ topic, partition: p, offset: seekTo })
    timer = setTimeout(finish, Math.max(0, deadline - Date.now()))
    await done
  } finally {
    if (timer) clearTimeout(timer)
    await consumer.disconnect().catch(() => {})
  }
  if (crash) throw crash
  return { out: out.slice(0, count), next }
}

// ------------------------------------------------------------------- ops

const ops = {
  async exit() {
    return { ok: true }
  },

  async version() {
    return { ok: true, client: 'kafkajs', version: KAFKAJS_VERSION }
  },

  async selftest_codec(c) {
    const name = c.codec || 'gzip'
    const type = { none: CompressionTypes.None, gzip: CompressionTypes.GZIP, snappy: CompressionTypes.Snappy, lz4: CompressionTypes.LZ4, zstd: CompressionTypes.ZSTD }[name]
    if (type == null) throw new BadCommand(`unknown codec ${name}`)
    const data = Buffer.alloc(10000)
    for (let i = 0; i < data.length; i++) data[i] = 'trireme-'.charCodeAt(i % 8)
    if (type === CompressionTypes.None) return { ok: true, codec: name, compressed_size: data.length, size: data.length }
    const codec = CompressionCodecs[type]()
    const packed = await codec.compress({ buffer: data })
    const back = await codec.decompress(packed)
    if (!data.equals(back)) throw new Error('codec round trip mismatch')
    return { ok: true, codec: name, compressed_size: packed.length, size: data.length }
  },

  // ---- admin

  async create_topic(c) {
    const a = await getAdmin()
    const configEntries = Object.entries(c.configs || {}).map(([name, value]) => ({
      name,
      value: String(value),
    }))
    const created = await a.createTopics({
      topics: [
        {
          topic: req(c, 'topic'),
          numPartitions: c.partitions ?? -1,
          replicationFactor: c.replication_factor ?? -1,
          configEntries,
        },
      ],
      validateOnly: !!c.validate_only,
      waitForLeaders: !c.validate_only,
      timeout: DEFAULT_TIMEOUT_MS,
    })
    if (!created)
      return {
        ok: false,
        error: `TopicExistsException: Topic '${c.topic}' already exists.`,
        error_class: 'KafkaJSProtocolError',
        error_type: 'TOPIC_ALREADY_EXISTS',
      }
    return { ok: true }
  },

  async delete_topic(c) {
    const a = await getAdmin()
    await a.deleteTopics({ topics: [req(c, 'topic')], timeout: DEFAULT_TIMEOUT_MS })
    return { ok: true }
  },

  async list_topics(c) {
    const a = await getAdmin()
    let topics = await a.listTopics()
    if (!c.internal) topics = topics.filter(t => !t.startsWith('__'))
    return { ok: true, topics: topics.sort() }
  },

  async describe_topic(c) {
    const a = await getAdmin()
    const topic = req(c, 'topic')
    const md = await a.fetchTopicMetadata({ topics: [topic] })
    const t = md.topics.find(x => x.name === topic)
    const partitions = t.partitions
      .map(p => ({
        partition: p.partitionId,
        leader: p.leader == null || p.leader < 0 ? null : p.leader,
        replicas: p.replicas,
        isr: p.isr,
      }))
      .sort((x, y) => x.partition - y.partition)
    return { ok: true, topic, internal: null, topic_id: null, partitions }
  },

  async describe_configs(c) {
    const a = await getAdmin()
    const entries = await describeTopicConfigEntries(a, req(c, 'topic'))
    const configs = {}
    const sources = {}
    for (const e of entries.sort((x, y) => (x.configName < y.configName ? -1 : 1))) {
      configs[e.configName] = e.configValue
      sources[e.configName] = sourceName(e)
    }
    return { ok: true, configs, sources }
  },

  async create_partitions(c) {
    const a = await getAdmin()
    await a.createPartitions({
      topicPartitions: [{ topic: req(c, 'topic'), count: req(c, 'count') }],
      timeout: DEFAULT_TIMEOUT_MS,
    })
    return { ok: true }
  },

  async delete_records(c) {
    const a = await getAdmin()
    const topic = req(c, 'topic')
    await a.fetchTopicMetadata({ topics: [topic] })
    await a.deleteTopicRecords({
      topic,
      partitions: [{ partition: c.partition ?? 0, offset: String(req(c, 'before_offset')) }],
    })
    return { ok: true, low_watermark: null }
  },

  async alter_config(c) {
    const a = await getAdmin()
    const topic = req(c, 'topic')
    const key = req(c, 'key')
    const op = (c.operation || (c.value == null ? 'DELETE' : 'SET')).toUpperCase()
    const current = {}
    for (const e of await describeTopicConfigEntries(a, topic))
      if (sourceName(e) === 'DYNAMIC_TOPIC_CONFIG' && e.configValue != null)
        current[e.configName] = e.configValue
    if (op === 'SET') current[key] = String(c.value)
    else if (op === 'DELETE') delete current[key]
    else throw new BadCommand(`operation ${op} not supported by the kafkajs harness`)
    await a.alterConfigs({
      validateOnly: false,
      resources: [
        {
          type: ConfigResourceTypes.TOPIC,
          name: topic,
          configEntries: Object.entries(current).map(([name, value]) => ({ name, value })),
        },
      ],
    })
    return { ok: true }
  },

  async describe_cluster() {
    const a = await getAdmin()
    const d = await a.describeCluster()
    return {
      ok: true,
      cluster_id: d.clusterId,
      controller: d.controller,
      nodes: d.brokers.map(b => ({ id: b.nodeId, host: b.host, port: b.port, rack: null })),
    }
  },

  async list_offsets(c) {
    const topic = req(c, 'topic')
    const partition = c.partition ?? 0
    const iso = ISOLATION[c.isolation || 'read_uncommitted']
    if (iso == null) throw new BadCommand(`bad isolation ${c.isolation}`)
    const res = await listOffsetsRaw(topic, [partition], specTimestamp(c.spec), iso)
    return { ok: true, offset: res[partition].offset, timestamp: res[partition].timestamp, leader_epoch: null }
  },

  async consumer_offsets(c) {
    const topic = req(c, 'topic')
    const parts = partitionsArg(c)
    const iso = (c.config || {})['isolation.level'] === 'read_uncommitted' ? 0 : 1
    const b = await listOffsetsRaw(topic, parts, -2, iso)
    const e = await listOffsetsRaw(topic, parts, -1, iso)
    return {
      ok: true,
      offsets: parts.map(p => ({ partition: p, beginning: b[p].offset, end: e[p].offset })),
    }
  },

  async list_groups() {
    const a = await getAdmin()
    const { groups } = await a.listGroups()
    return { ok: true, groups: groups.map(g => g.groupId).sort() }
  },

  async describe_group(c) {
    const a = await getAdmin()
    const { groups } = await a.describeGroups([req(c, 'group')])
    const g = groups[0]
    const members = g.members.map(m => {
      let assignment = []
      if (m.memberAssignment && m.memberAssignment.length) {
        const dec = AssignerProtocol.MemberAssignment.decode(m.memberAssignment)
        for (const [t, ps] of Object.entries((dec && dec.assignment) || {}))
          for (const p of ps) assignment.push([t, p])
      }
      return {
        member_id: m.memberId,
        client_id: m.clientId,
        host: m.clientHost,
        group_instance_id: null,
        assignment,
      }
    })
    return { ok: true, group: g.groupId, state: g.state, protocol: g.protocol, coordinator: null, members }
  },

  async group_offsets(c) {
    const a = await getAdmin()
    const res = await a.fetchOffsets({ groupId: req(c, 'group') })
    const rows = []
    for (const t of res)
      for (const p of t.partitions)
        if (Number(p.offset) >= 0) rows.push([t.topic, p.partition, Number(p.offset), p.metadata ?? null])
    rows.sort((x, y) => (x[0] === y[0] ? x[1] - y[1] : x[0] < y[0] ? -1 : 1))
    return { ok: true, offsets: rows }
  },

  async delete_group(c) {
    const a = await getAdmin()
    await a.deleteGroups([req(c, 'group')])
    return { ok: true }
  },

  // ---- produce

  async produce(c) {
    const topic = req(c, 'topic')
    const records = req(c, 'records')
    const o = takeConfig(c.config, PRODUCER_CFG, 'producer')
    let compression = CompressionTypes.None
    if (o.compression != null && o.compression !== 'none') {
      if (o.compression !== 'gzip') {
        const e = new Error(`kafkajs ships only gzip, not ${o.compression}`)
        e.name = 'UnsupportedCompression'
        throw e
      }
      compression = CompressionTypes.GZIP
    }
    for (const r of records)
      for (const [k, v] of r.headers || [])
        if (v == null) {
          const e = new Error(`kafkajs cannot send a null header value (header "${k}")`)
          e.name = 'UnsupportedByKafkajs'
          throw e
        }
    const handle = c.handle || null
    let producer = handle ? producers.get(handle) : null
    if (!producer) {
      producer = await newProducer(o)
      if (handle) producers.set(handle, producer)
    }
    const openTxn = handle ? openTxns.get(handle) : null
    if (openTxn && c.txn) throw new BadCommand(`producer "${handle}" has an open transaction (begin_txn)`)
    const msgs = records.map(r => {
      const m = { key: b64d(r.key_b64), value: b64d(r.value_b64), headers: headersIn(r.headers) }
      if (r.partition != null) m.partition = r.partition
      // kafkajs would use Date.now() itself; setting it here lets us report it.
      m.timestamp = String(r.timestamp != null ? r.timestamp : Date.now())
      return m
    })
    const acks = o.acks ?? -1
    const timeout = o.timeout ?? DEFAULT_TIMEOUT_MS
    const offsets = new Array(msgs.length).fill(null)
    const timestamps = new Array(msgs.length).fill(null)
    const txn = c.txn || null
    let sender = openTxn || producer
    let transaction = null
    try {
      if (txn) transaction = sender = await producer.transaction()
      const fillFromMeta = (indices, meta) => {
        // one RecordMetadata per partition; records of a partition are
        // appended in order starting at baseOffset.
        const next = {}
        for (const md of meta) next[md.partition] = { off: Number(md.baseOffset), ts: md.logAppendTime }
        for (const i of indices) {
          const p = msgs[i].partition ?? (meta.length ? meta[0].partition : null)
          const slot = next[p]
          if (!slot) {
            // acks=0: the broker sends no response, so no offsets
            offsets[i] = [p, null]
            timestamps[i] = num(msgs[i].timestamp)
            continue
          }
          offsets[i] = [p, slot.off]
          timestamps[i] =
            slot.ts != null && Number(slot.ts) >= 0 ? Number(slot.ts) : num(msgs[i].timestamp)
          slot.off += 1
        }
      }
      if (msgs.every(m => m.partition != null)) {
        const meta = await sender.send({ topic, messages: msgs, acks, timeout, compression })
        fillFromMeta(msgs.map((_, i) => i), meta)
      } else {
        for (let i = 0; i < msgs.length; i++) {
          const meta = await sender.send({ topic, messages: [msgs[i]], acks, timeout, compression })
          fillFromMeta([i], meta)
        }
      }
      if (transaction) {
        if (txn === 'abort') await transaction.abort()
        else await transaction.commit()
      }
      return { ok: true, offsets, timestamps }
    } catch (e) {
      if (transaction && transaction.isActive()) await transaction.abort().catch(() => {})
      const err = errorFields(e)
      return {
        ...err,
        offsets,
        timestamps,
        errors: offsets.map(x => (x == null ? err.error : null)),
      }
    } finally {
      if (!handle) await producer.disconnect().catch(() => {})
    }
  },

  async init_producer(c) {
    const handle = req(c, 'handle')
    if (producers.has(handle)) throw new BadCommand(`producer "${handle}" already exists`)
    producers.set(handle, await newProducer(takeConfig(c.config, PRODUCER_CFG, 'producer')))
    return { ok: true }
  },

  async begin_txn(c) {
    const handle = req(c, 'handle')
    const p = keptProducer(c)
    if (openTxns.has(handle)) throw new BadCommand(`producer "${handle}" already has an open transaction`)
    openTxns.set(handle, await p.transaction())
    return { ok: true }
  },

  async commit_txn(c) {
    const t = openTxn(c)
    await t.commit()
    openTxns.delete(c.handle)
    return { ok: true }
  },

  async abort_txn(c) {
    const t = openTxn(c)
    await t.abort()
    openTxns.delete(c.handle)
    return { ok: true }
  },

  async close_producer(c) {
    const hs = c.handle ? [c.handle] : [...producers.keys()]
    for (const h of hs) {
      const p = producers.get(h)
      producers.delete(h)
      openTxns.delete(h)
      if (p) await p.disconnect().catch(() => {})
    }
    return { ok: true }
  },

  // ---- consume (see header comment)

  async consume(c) {
    const topic = req(c, 'topic')
    const parts = partitionsArg(c)
    const count = c.count ?? Infinity
    const timeoutMs = c.timeout_ms ?? DEFAULT_TIMEOUT_MS
    const off = c.offset
    if (!(off == null || typeof off === 'number' || ['earliest', 'beginning', 'latest', 'end'].includes(off)))
      throw new BadCommand(`bad offset ${off}`)
    const mode = c.mode || 'fetch'
    if (c.until_end && mode !== 'fetch') throw new BadCommand('until_end needs mode "fetch"')
    let res
    if (mode === 'fetch') res = await consumeFetch(c, topic, parts, count, timeoutMs)
    else if (mode === 'group') res = await consumeGroup(c, topic, parts, count, timeoutMs)
    else throw new BadCommand(`bad mode ${mode}`)
    const { out, next, ends } = res
    const posOf = p => (next[p] != null ? next[p] : null)
    const atEnd = ends != null && parts.every(p => next[p] >= ends[p])
    const r = {
      ok: true,
      records: out,
      timed_out: out.length < count && !atEnd,
      position: parts.length === 1 ? posOf(parts[0]) : parts.map(p => [p, posOf(p)]),
    }
    if (ends != null) r.end_offsets = parts.map(p => [p, ends[p]])
    return r
  },

  // ---- group consumer

  async subscribe(c) {
    const handle = c.handle || 'default'
    if (consumers.has(handle)) throw new BadCommand(`consumer "${handle}" already exists`)
    const topics = c.topics || [req(c, 'topic')]
    const { kafkaClient, fromBeginning, options } = consumerOptions(c, req(c, 'group'))
    const g = new GroupConsumer(kafkaClient, options)
    await g.start(topics, fromBeginning)
    if (g.crash) {
      await g.close().catch(() => {})
      throw g.crash
    }
    consumers.set(handle, g)
    return { ok: true }
  },

  async poll(c) {
    const g = groupConsumer(c)
    const records = await g.poll(c.max ?? null, c.timeout_ms ?? 1000)
    const events = g.events
    g.events = []
    return { ok: true, records, assignment: g.assignmentList(), events }
  },

  async assignment(c) {
    return { ok: true, assignment: groupConsumer(c).assignmentList() }
  },

  async commit(c) {
    const g = groupConsumer(c)
    let offsets
    if (Array.isArray(c.offsets)) {
      offsets = c.offsets.map(([topic, partition, offset, metadata]) => ({
        topic,
        partition,
        offset: String(offset),
        ...(metadata != null ? { metadata } : {}),
      }))
    } else {
      offsets = [...g.delivered.entries()].map(([k, offset]) => {
        const i = k.lastIndexOf(':')
        return { topic: k.slice(0, i), partition: Number(k.slice(i + 1)), offset: String(offset) }
      })
    }
    if (offsets.length) await g.consumer.commitOffsets(offsets)
    return { ok: true }
  },

  async committed(c) {
    const topic = req(c, 'topic')
    const parts = partitionsArg(c)
    let groupId = c.group
    if (!groupId) groupId = groupConsumer(c).groupId
    const a = await getAdmin()
    const res = await a.fetchOffsets({ groupId, topics: [topic] })
    const t = res.find(x => x.topic === topic) || { partitions: [] }
    return {
      ok: true,
      committed: parts.map(p => {
        const e = t.partitions.find(x => x.partition === p)
        const off = e && Number(e.offset) >= 0 ? Number(e.offset) : null
        return [p, off, off == null ? null : e.metadata ?? '']
      }),
    }
  },

  async close_consumer(c) {
    const handle = c.handle || 'default'
    const g = consumers.get(handle)
    if (!g) throw new BadCommand(`no consumer "${handle}"`)
    consumers.delete(handle)
    await g.close()
    return { ok: true }
  },
}

async function newProducer(o) {
  const k = o.clientId ? makeKafka(o.clientId) : kafka
  const producer = k.producer({
    createPartitioner: Partitioners.DefaultPartitioner,
    idempotent: !!o.idempotent,
    transactionalId: o.transactionalId,
    transactionTimeout: o.transactionTimeout,
    maxInFlightRequests: o.idempotent ? 1 : o.maxInFlightRequests,
    allowAutoTopicCreation: o.allowAutoTopicCreation ?? true,
    retry: { retries: 3 },
  })
  await producer.connect()
  return producer
}

function keptProducer(c) {
  const handle = req(c, 'handle')
  const p = producers.get(handle)
  if (!p) throw new BadCommand(`no producer "${handle}" (use init_producer first)`)
  return p
}

function openTxn(c) {
  keptProducer(c)
  const t = openTxns.get(c.handle)
  if (!t) throw new BadCommand(`producer "${c.handle}" has no open transaction (begin_txn)`)
  return t
}

function groupConsumer(c) {
  const handle = c.handle || 'default'
  const g = consumers.get(handle)
  if (!g) throw new BadCommand(`no subscribed consumer "${handle}" (use subscribe first)`)
  return g
}

class GroupConsumer {
  constructor(kafkaClient, options) {
    this.groupId = options.groupId
    this.consumer = kafkaClient.consumer(options)
    this.assigned = {}
    this.events = []
    this.delivered = new Map() // "topic:partition" -> next offset to commit
    this.want = null // active poll: {max, records, resolve}
    this.crash = null
  }

  async start(topics, fromBeginning) {
    const ev = this.consumer.events
    this.consumer.on(ev.GROUP_JOIN, e => {
      const prev = this.assignmentList()
      if (prev.length) this.events.push({ type: 'revoked', partitions: prev })
      this.assigned = e.payload.memberAssignment || {}
      this.events.push({ type: 'assigned', partitions: this.assignmentList() })
    })
    this.consumer.on(ev.CRASH, e => {
      this.crash = e.payload.error
      if (this.want) this.want.resolve()
    })
    await this.consumer.connect()
    await this.consumer.subscribe({ topics, fromBeginning })
    await this.consumer.run({
      autoCommit: false,
      eachBatchAutoResolve: false,
      eachBatch: async ({ batch, resolveOffset, heartbeat, isRunning, isStale }) => {
        let lastBeat = Date.now()
        for (const m of batch.messages) {
          // Wait until a poll asks for records.
          while (!this.want || this.want.records.length >= this.want.max) {
            if (!isRunning() || isStale()) return
            if (Date.now() - lastBeat > 1000) {
              await heartbeat()
              lastBeat = Date.now()
            }
            await sleep(20)
          }
          if (!isRunning() || isStale()) return
          this.want.records.push(recordOut(batch.topic, batch.partition, m))
          this.delivered.set(`${batch.topic}:${batch.partition}`, Number(m.offset) + 1)
          resolveOffset(m.offset)
          if (this.want.records.length >= this.want.max) this.want.resolve()
        }
        // Without "max", a poll returns after the first non-empty batch.
        if (this.want && this.want.max === Infinity && this.want.records.length) this.want.resolve()
        await heartbeat()
      },
    })
  }

  assignmentList() {
    const out = []
    for (const t of Object.keys(this.assigned).sort())
      for (const p of [...this.assigned[t]].sort((a, b) => a - b)) out.push([t, p])
    return out
  }

  async poll(max, timeoutMs) {
    if (this.crash) throw this.crash
    const want = { max: max == null ? Infinity : max, records: [] }
    const done = new Promise(r => (want.resolve = r))
    this.want = want
    const t = setTimeout(want.resolve, timeoutMs)
    await done
    clearTimeout(t)
    this.want = null
    if (this.crash && !want.records.length) throw this.crash
    return want.records
  }

  async close() {
    await this.consumer.disconnect()
  }
}

const SOURCES = {
  0: 'UNKNOWN',
  1: 'DYNAMIC_TOPIC_CONFIG',
  2: 'DYNAMIC_BROKER_CONFIG',
  3: 'DYNAMIC_DEFAULT_BROKER_CONFIG',
  4: 'STATIC_BROKER_CONFIG',
  5: 'DEFAULT_CONFIG',
  6: 'DYNAMIC_BROKER_LOGGER_CONFIG',
}

function sourceName(e) {
  if (e.configSource != null) return SOURCES[e.configSource] || String(e.configSource)
  return e.isDefault ? 'DEFAULT_CONFIG' : 'DYNAMIC_TOPIC_CONFIG'
}

async function describeTopicConfigEntries(a, topic) {
  const res = await a.describeConfigs({
    resources: [{ type: ConfigResourceTypes.TOPIC, name: topic }],
    includeSynonyms: false,
  })
  const r = res.resources[0]
  if (r.errorCode) {
    const e = new Error(r.errorMessage || `error code ${r.errorCode}`)
    e.name = 'KafkaJSProtocolError'
    throw e
  }
  return r.configEntries
}

function errorFields(e) {
  let err = e
  // Unwrap retries / aggregate errors to the broker's error where possible.
  while (err && err.originalError) err = err.originalError
  if (err && err.name === 'KafkaJSAggregateError' && err.errors && err.errors.length)
    err = err.errors[0]
  if (err && err.name === 'KafkaJSCreateTopicError' && err.originalError) err = err.originalError
  const name = (err && err.name) || 'Error'
  const out = {
    ok: false,
    error: `${name}: ${(err && err.message) || String(err)}`,
    error_class: name,
  }
  if (err && err.type) out.error_type = err.type
  if (err !== e) out.error_outer = `${e.name}: ${e.message}`
  if (!(e instanceof BadCommand) && process.env.HARNESS_LOG_LEVEL === 'DEBUG')
    process.stderr.write(`${e.stack}\n`)
  return out
}

// ------------------------------------------------------------------ main

async function handle(line) {
  let cmd
  try {
    cmd = JSON.parse(line)
  } catch (e) {
    return { ok: false, error: `BadCommand: invalid JSON: ${e.message}`, error_class: 'BadCommand' }
  }
  try {
    if (cmd == null || typeof cmd !== 'object' || Array.isArray(cmd))
      throw new BadCommand('command must be a JSON object')
    const fn = Object.prototype.hasOwnProperty.call(ops, cmd.op) ? ops[cmd.op] : null
    if (!fn) throw new BadCommand(cmd.op == null ? 'missing "op"' : `unknown op ${cmd.op}`)
    const res = await fn(cmd)
    return 'ok' in res ? res : { ok: true, ...res }
  } catch (e) {
    return errorFields(e)
  }
}

async function shutdown() {
  for (const g of consumers.values()) await g.close().catch(() => {})
  for (const p of producers.values()) await p.disconnect().catch(() => {})
  if (admin && adminConnected) await admin.disconnect().catch(() => {})
}

async function main() {
  const rl = readline.createInterface({ input: process.stdin, terminal: false })
  for await (const line of rl) {
    if (!line.trim()) continue
    const res = await handle(line)
    let text
    try {
      text = JSON.stringify(res)
    } catch (e) {
      text = JSON.stringify(errorFields(e))
    }
    await new Promise(r => stdoutWrite(text + '\n', r))
    let op = null
    try {
      op = JSON.parse(line).op
    } catch (_) {}
    if (op === 'exit') break
  }
  await shutdown()
  process.exit(0)
}

process.on('unhandledRejection', e => {
  process.stderr.write(`unhandled rejection: ${e && e.stack ? e.stack : e}\n`)
})

main()
