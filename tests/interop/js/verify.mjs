#!/usr/bin/env node
// A second implementation of the IAC v1 wire format, written from the protocol
// description only (docs/PROTOCOL.md, proto/README.md): it shares no code with the
// Python library. It checks every vector in proto/testvectors/v1.json and makes
// one signed, dictionary-compressed frame of its own for the Python side to accept.
//
//   node verify.mjs [--vectors DIR] [--emit FILE] [--schema FILE.binpb]
//
// - frames (type, flags, varint length, limits) and the zstd frame header are
//   parsed here;
// - the signature field (8, or 15 for HELLO) is excised at the wire level by an
//   independent scan with the same refusal rules;
// - messages are decoded with @bufbuild/protobuf from the schema compiled by buf
//   (a FileDescriptorSet of proto/iac.proto);
// - an AgentId (`from`, a HELLO's agent_id) must be a canonical encoding of a point of
//   the prime-order subgroup other than the identity, checked with its own BigInt
//   Edwards25519 arithmetic, before any signature;
// - Ed25519 signatures are verified with Node's crypto (OpenSSL), plus the checks
//   libsodium adds (canonical S, no small-order or non-canonical key or R);
// - zstd bodies are decompressed by the `zstd` command line with the dictionary file.
//
// Output: one line per check, then `SUMMARY {json}`. Exit status 1 on any failure.

import { spawnSync } from "node:child_process";
import crypto from "node:crypto";
import { readFileSync, writeFileSync } from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";

import { create, createFileRegistry, fromBinary, toBinary } from "@bufbuild/protobuf";
import { FileDescriptorSetSchema } from "@bufbuild/protobuf/wkt";

const HERE = path.dirname(fileURLToPath(import.meta.url));
const REPO = path.resolve(HERE, "..", "..", "..");

// --- arguments ---------------------------------------------------------------------------

function parseArgs(argv) {
  const out = { vectors: path.join(REPO, "proto", "testvectors"), emit: null, schema: null };
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i];
    if (a === "--vectors") out.vectors = argv[++i];
    else if (a === "--emit") out.emit = argv[++i];
    else if (a === "--schema") out.schema = argv[++i];
    else {
      console.error(`usage: node verify.mjs [--vectors DIR] [--emit FILE] [--schema FILE.binpb]; unknown ${a}`);
      process.exit(2);
    }
  }
  return out;
}

// --- errors: the names of docs/PROTOCOL.md ----------------------------------------------

class Fault extends Error {
  constructor(name, detail) {
    super(`${name}: ${detail}`);
    this.code = name;
  }
}
const fail = (name, detail) => {
  throw new Fault(name, detail);
};

// --- JSON with 64-bit integers -----------------------------------------------------------

// u64 fields (session_id, msg_id, ...) can exceed 2**53: quote long integer tokens
// before JSON.parse. Strings are matched first, so digits inside them are untouched.
function parseJsonLossless(text) {
  const quoted = text.replace(/"(?:[^"\\]|\\.)*"|-?\d+(?:\.\d+)?(?:[eE][+-]?\d+)?/g, (tok) =>
    tok[0] !== '"' && /^-?\d{16,}$/.test(tok) ? `"${tok}"` : tok,
  );
  return JSON.parse(quoted);
}
const big = (v) => BigInt(v);

// --- varints and frames -----------------------------------------------------------------

const FRAME_TYPES = new Map([
  [1, "MESSAGE"],
  [2, "HELLO"],
  [3, "FORWARD"],
  [4, "DICT"],
  [5, "GOAWAY"],
  [6, "DICT_ACK"],
]);
const FLAG_ZSTD = 0x01;
const U64_MAX = (1n << 64n) - 1n;

function readVarint(buf, pos, end) {
  let value = 0n;
  for (let i = 0; i < 10; i++) {
    if (pos >= end) fail("truncated_frame", "input ends inside a varint");
    const b = buf[pos++];
    value |= BigInt(b & 0x7f) << BigInt(7 * i);
    if (b < 0x80) {
      if (value > U64_MAX) fail("bad_varint", "varint overflows 64 bits");
      return [value, pos];
    }
  }
  fail("bad_varint", "varint longer than 10 bytes");
}

function encodeVarint(n) {
  let v = BigInt(n);
  const out = [];
  while (v >= 0x80n) {
    out.push(Number(v & 0x7fn) | 0x80);
    v >>= 7n;
  }
  out.push(Number(v));
  return Buffer.from(out);
}

// One complete frame: type:u8 | flags:u8 | length:varint | body[length].
function decodeFrame(data, maxFrameSize, dictionaries) {
  if (data.length < 1) fail("truncated_frame", "empty input");
  const type = data[0];
  if (!FRAME_TYPES.has(type)) fail("unknown_frame_type", `type 0x${type.toString(16)}`);
  if (data.length < 2) fail("truncated_frame", "input ends inside the frame header");
  const flags = data[1];
  if (flags & ~FLAG_ZSTD) fail("unknown_frame_flag", `flags 0x${flags.toString(16)}`);
  const [length, pos] = readVarint(data, 2, data.length);
  // refused as soon as the length is known, before any body is buffered
  if (length > BigInt(maxFrameSize)) fail("frame_too_large", `length ${length} > ${maxFrameSize}`);
  const end = pos + Number(length);
  if (end > data.length) fail("truncated_frame", "input ends inside the body");
  if (end < data.length) fail("frame_error", "bytes follow the frame");
  let body = data.subarray(pos, end);
  let dictId = null;
  if (flags & FLAG_ZSTD) [body, dictId] = decompress(body, maxFrameSize, dictionaries);
  return { type, flags, body: Buffer.from(body), dictId };
}

function frameBytes(type, flags, body) {
  return Buffer.concat([Buffer.from([type, flags]), encodeVarint(body.length), body]);
}

// --- zstd (RFC 8878): header and block walk here, decompression by the zstd CLI ----------

const ZSTD_MAGIC = 0xfd2fb528;

function leUint(buf, pos, n) {
  let v = 0n;
  for (let i = n - 1; i >= 0; i--) v = (v << 8n) | BigInt(buf[pos + i]);
  return v;
}

function zstdInfo(body, maxSize) {
  const n = body.length;
  if (n < 6 || body.readUInt32LE(0) !== ZSTD_MAGIC) fail("compression_error", "not a zstd frame");
  const fhd = body[4];
  if (fhd & 0x08) fail("compression_error", "reserved bit set");
  const singleSegment = (fhd >> 5) & 1;
  const hasChecksum = (fhd >> 2) & 1;
  const didSize = [0, 1, 2, 4][fhd & 3];
  const fcsSize = [singleSegment, 2, 4, 8][fhd >> 6];
  let pos = 5 + (singleSegment ? 0 : 1);
  if (pos + didSize + fcsSize > n) fail("compression_error", "frame header truncated");
  const dictId = Number(leUint(body, pos, didSize));
  pos += didSize;
  if (fcsSize === 0) fail("missing_content_size", "the frame header declares no content size");
  let size = leUint(body, pos, fcsSize);
  if (fcsSize === 2) size += 256n;
  pos += fcsSize;
  // zstd returns nothing for a declared size of 0 without reading the blocks after it
  if (size === 0n) fail("zero_content_size", "the frame header declares a content size of 0");
  if (size > BigInt(maxSize)) fail("decompression_bomb", `declares ${size} bytes > ${maxSize}`);
  for (;;) {
    if (pos + 3 > n) fail("compression_error", "truncated inside a block header");
    const header = body[pos] | (body[pos + 1] << 8) | (body[pos + 2] << 16);
    pos += 3;
    const last = header & 1;
    const btype = (header >> 1) & 3;
    const bsize = header >>> 3;
    if (btype === 3) fail("compression_error", "reserved block type");
    if (bsize > 128 * 1024) fail("compression_error", "block larger than 128 KiB");
    pos += btype === 1 ? 1 : bsize;
    if (pos > n) fail("compression_error", "truncated inside a block");
    if (last) break;
  }
  if (hasChecksum) {
    pos += 4;
    if (pos > n) fail("compression_error", "truncated inside the checksum");
  }
  if (pos !== n) fail("trailing_data", `${n - pos} bytes after the zstd frame`);
  return { dictId, size: Number(size) };
}

function runZstd(args, input) {
  const r = spawnSync("zstd", ["-q", "-c", ...args], { input, maxBuffer: 64 * 1024 * 1024 });
  if (r.error) throw new Error(`cannot run the zstd command line: ${r.error.message}`);
  return r;
}

function decompress(body, maxSize, dictionaries) {
  const { dictId, size } = zstdInfo(body, maxSize);
  const args = ["-d"];
  if (dictId !== 0) {
    const file = dictionaries.get(dictId);
    if (!file) fail("unknown_dictionary", `dictionary ${dictId} is not known here`);
    args.push("-D", file);
  }
  const r = runZstd(args, body);
  if (r.status !== 0) fail("compression_error", `zstd: ${r.stderr.toString().trim()}`);
  if (r.stdout.length !== size) fail("compression_error", "content differs from its declared size");
  return [r.stdout, dictId];
}

// --- the signature-field scan ------------------------------------------------------------

const VARINT = 0,
  I64 = 1,
  LEN = 2,
  I32 = 5;

const TASK_STATE = { name: "TaskState", wt: { 1: [LEN], 2: [VARINT], 3: [VARINT], 4: [VARINT], 5: [LEN] } };
const TRACE_CONTEXT = { name: "TraceContext", wt: { 1: [LEN], 2: [LEN] } };
const MESSAGE = {
  name: "Message",
  sig: 8,
  nested: { 11: TASK_STATE, 16: TRACE_CONTEXT },
  wt: {
    1: [LEN], 2: [LEN], 3: [VARINT], 4: [LEN], 5: [VARINT], 6: [VARINT], 7: [VARINT], 8: [LEN],
    9: [LEN], 10: [VARINT], 11: [LEN], 12: [VARINT], 13: [LEN], 14: [VARINT], 15: [VARINT],
    16: [LEN], 17: [VARINT], 18: [VARINT], 19: [LEN],
  },
};
const HELLO = {
  name: "Hello",
  sig: 15,
  repeated: new Set([7, 9, 10]),
  wt: {
    1: [VARINT], 2: [LEN], 3: [VARINT], 4: [VARINT], 5: [LEN], 6: [LEN], 7: [VARINT, LEN], 8: [VARINT],
    9: [LEN], 10: [LEN], 11: [LEN], 12: [LEN], 15: [LEN],
  },
};

// Walk fields in buf[start:end]; return the signature field's [start, end) or null.
// Refuses: field number 0, wire types 3/4/6/7, a field running past the end, a known
// field with the wrong wire type, a singular known field twice, and a signature
// field that is repeated, not length-delimited or not 64 bytes.
function scan(buf, start, end, schema) {
  const seen = new Set();
  let sigSpan = null;
  let pos = start;
  while (pos < end) {
    const fieldStart = pos;
    let valueStart = pos;
    let tag;
    [tag, pos] = readVarintInBody(buf, pos, end, schema);
    const number = Number(tag >> 3n);
    const wt = Number(tag & 7n);
    if (number === 0) fail("malformed_message", `${schema.name}: field number 0`);
    if (wt === VARINT) {
      [, pos] = readVarintInBody(buf, pos, end, schema);
    } else if (wt === LEN) {
      let len;
      [len, pos] = readVarintInBody(buf, pos, end, schema);
      if (len > BigInt(end - pos)) fail("malformed_message", `${schema.name}: field ${number} runs past the end`);
      valueStart = pos;
      pos += Number(len);
      const sub = schema.nested?.[number];
      if (sub) scan(buf, valueStart, pos, sub);
    } else if (wt === I64) pos += 8;
    else if (wt === I32) pos += 4;
    else fail("malformed_message", `${schema.name}: field ${number} has wire type ${wt}`);
    if (pos > end) fail("malformed_message", `${schema.name}: field ${number} runs past the end`);
    const allowed = schema.wt[number];
    if (allowed === undefined) continue; // unknown field: kept, and signed
    if (number === schema.sig) {
      if (sigSpan) fail("signature_repeated", `${schema.name}: signature field twice`);
      if (wt !== LEN) fail("signature_invalid", `${schema.name}: signature field is not bytes`);
      if (pos - valueStart !== 64) fail("signature_invalid", `${schema.name}: signature is ${pos - valueStart} bytes`);
      sigSpan = [fieldStart, pos];
      continue;
    }
    if (!allowed.includes(wt)) fail("malformed_message", `${schema.name}: field ${number} has wire type ${wt}`);
    if (!schema.repeated?.has(number)) {
      if (seen.has(number)) fail("field_repeated", `${schema.name}: field ${number} twice`);
      seen.add(number);
    }
  }
  return sigSpan;
}

// inside a message body a varint that runs out is a malformed message, not a truncated frame
function readVarintInBody(buf, pos, end, schema) {
  try {
    return readVarint(buf, pos, end);
  } catch (e) {
    if (e instanceof Fault) fail("malformed_message", `${schema.name}: ${e.message}`);
    throw e;
  }
}

function exciseSignature(body, schema) {
  const span = scan(body, 0, body.length, schema);
  if (!span) fail("signature_missing", `${schema.name}: no signature field`);
  const [s, e] = span;
  return [Buffer.concat([body.subarray(0, s), body.subarray(e)]), Buffer.from(body.subarray(e - 64, e))];
}

// --- Ed25519 with libsodium's extra checks -------------------------------------------------

const SPKI_PREFIX = Buffer.from("302a300506032b6570032100", "hex");
const PKCS8_PREFIX = Buffer.from("302e020100300506032b657004220420", "hex");
const L = 2n ** 252n + 27742317777372353535851937790883648493n;
const P = 2n ** 255n - 19n;
// libsodium's small-order blocklist (compared with the sign bit cleared)
const SMALL_ORDER = [
  "0000000000000000000000000000000000000000000000000000000000000000",
  "0100000000000000000000000000000000000000000000000000000000000000",
  "26e8958fc2b227b045c3f489f2ef98f0d5dfac05d3c63339b13802886d53fc05",
  "c7176a703d4dd84fba3c0b760d10670f2a2053fa2c39ccc64ec7fd7792ac037a",
  "ecffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff7f",
  "edffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff7f",
  "eeffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff7f",
].map((h) => Buffer.from(h, "hex"));

const leBig = (b) => leUint(b, 0, b.length);
function hasSmallOrder(point) {
  const p = Buffer.from(point);
  p[31] &= 0x7f;
  return SMALL_ORDER.some((s) => s.equals(p));
}
function isCanonicalPoint(point) {
  const p = Buffer.from(point);
  p[31] &= 0x7f;
  return leBig(p) < P;
}

const signingInput = (domain, data) => Buffer.concat([Buffer.from(domain, "ascii"), Buffer.from([0]), data]);

// The plain OpenSSL check (cofactorless, RFC 8032) without libsodium's extra refusals.
function opensslVerify(publicKey, data, signature) {
  try {
    const key = crypto.createPublicKey({ key: Buffer.concat([SPKI_PREFIX, publicKey]), format: "der", type: "spki" });
    return crypto.verify(null, data, key, signature);
  } catch {
    return false;
  }
}

function verifyEd25519(agentId, domain, data, signature) {
  const pk = Buffer.from(agentId, "hex");
  const ok =
    signature.length === 64 &&
    leBig(signature.subarray(32)) < L &&
    !hasSmallOrder(signature.subarray(0, 32)) &&
    isCanonicalPoint(pk) &&
    !hasSmallOrder(pk) &&
    opensslVerify(pk, signingInput(domain, data), signature);
  if (!ok) fail("bad_signature", `signature does not verify for ${agentId.slice(0, 16)}`);
}

function keyFromSeed(seed) {
  const privateKey = crypto.createPrivateKey({
    key: Buffer.concat([PKCS8_PREFIX, seed]),
    format: "der",
    type: "pkcs8",
  });
  const spki = crypto.createPublicKey(privateKey).export({ format: "der", type: "spki" });
  return { privateKey, agentId: Buffer.from(spki.subarray(spki.length - 32)).toString("hex") };
}

// --- AgentIds: 64 lowercase hex of a canonical point of the prime-order subgroup ----------
//
// Edwards25519 arithmetic after RFC 8032 section 5.1 (extended coordinates, a = -1), in
// BigInt: slow and not constant-time, which does not matter for public keys.

const AGENT_ID = /^[0-9a-f]{64}$/;
const modP = (a) => ((a % P) + P) % P;
function powMod(base, exp) {
  let result = 1n;
  let b = modP(base);
  for (let e = exp; e > 0n; e >>= 1n) {
    if (e & 1n) result = (result * b) % P;
    b = (b * b) % P;
  }
  return result;
}
const invP = (a) => powMod(a, P - 2n);
const D = modP(-121665n * invP(121666n));
const SQRT_M1 = powMod(2n, (P - 1n) / 4n);
const NEUTRAL = [0n, 1n, 1n, 0n];

function pointAdd(p, q) {
  const a = modP((p[1] - p[0]) * (q[1] - q[0]));
  const b = modP((p[1] + p[0]) * (q[1] + q[0]));
  const c = modP(2n * p[3] * q[3] * D);
  const d = modP(2n * p[2] * q[2]);
  const [e, f, g, h] = [b - a, d - c, d + c, b + a];
  return [modP(e * f), modP(g * h), modP(f * g), modP(e * h)];
}
function pointMul(s, p) {
  let q = NEUTRAL;
  for (let k = s, a = p; k > 0n; k >>= 1n) {
    if (k & 1n) q = pointAdd(q, a);
    a = pointAdd(a, a);
  }
  return q;
}
const isNeutral = (p) => modP(p[0]) === 0n && modP(p[1] - p[2]) === 0n;

// RFC 8032 5.1.3, strict: y >= p, x = 0 with the sign bit, or no square root: null
function decodePoint(bytes) {
  const n = leBig(bytes);
  const y = n & ((1n << 255n) - 1n);
  const sign = n >> 255n;
  if (y >= P) return null;
  const x2 = modP((y * y - 1n) * invP(D * y * y + 1n));
  if (x2 === 0n) return sign ? null : [0n, y, 1n, 0n];
  let x = powMod(x2, (P + 3n) / 8n);
  if (modP(x * x - x2) !== 0n) x = modP(x * SQRT_M1);
  if (modP(x * x - x2) !== 0n) return null;
  if ((x & 1n) !== sign) x = P - x;
  return [x, y, 1n, modP(x * y)];
}

// Why `value` is not an AgentId, or null when it is one.
function agentIdFault(value) {
  if (typeof value !== "string" || !AGENT_ID.test(value)) return "not 64 lowercase hex characters";
  const point = decodePoint(Buffer.from(value, "hex"));
  if (!point) return "not the canonical encoding of a curve point";
  if (isNeutral(pointMul(8n, point))) return "a point of small order";
  if (!isNeutral(pointMul(L, point))) return "not a point of the prime-order subgroup";
  return null;
}
const agentIdFaults = new Map(); // ids repeat: each is checked once
function checkAgentId(value, what) {
  if (!agentIdFaults.has(value)) agentIdFaults.set(value, agentIdFault(value));
  const fault = agentIdFaults.get(value);
  if (fault) fail("invalid_agent_id", `${what} is not an AgentId (${fault}): ${JSON.stringify(value).slice(0, 80)}`);
  return value;
}

// --- the schema ---------------------------------------------------------------------------

function loadSchema(schemaFile) {
  let bytes;
  if (schemaFile) bytes = readFileSync(schemaFile);
  else {
    const buf = path.join(HERE, "node_modules", ".bin", "buf");
    const r = spawnSync(buf, ["build", REPO, "--as-file-descriptor-set", "-o", "-#format=binpb"], {
      maxBuffer: 16 * 1024 * 1024,
    });
    if (r.error || r.status !== 0) {
      throw new Error(`buf build failed (run npm ci in ${HERE}): ${r.error?.message ?? r.stderr.toString()}`);
    }
    bytes = r.stdout;
  }
  const registry = createFileRegistry(fromBinary(FileDescriptorSetSchema, bytes));
  const get = (name) => {
    const d = registry.getMessage(name);
    if (!d) throw new Error(`schema has no ${name}`);
    return d;
  };
  return { Message: get("iac.Message"), Hello: get("iac.Hello"), TaskState: get("iac.TaskState") };
}

// --- decoding a MESSAGE frame, in the receive pipeline's order ----------------------------

function openMessage(schema, data, maxFrameSize, dictionaries) {
  const frame = decodeFrame(data, maxFrameSize, dictionaries);
  if (frame.type !== 1) fail("malformed_message", `expected a MESSAGE frame, got ${FRAME_TYPES.get(frame.type)}`);
  const [unsigned, signature] = exciseSignature(frame.body, MESSAGE);
  let msg;
  try {
    msg = fromBinary(schema.Message, frame.body);
  } catch (e) {
    fail("malformed_message", `Message does not parse: ${e.message}`);
  }
  checkAgentId(msg.from, "from");
  verifyEd25519(msg.from, "iac-msg-v1", unsigned, signature);
  return { frame, msg, unsigned, signature };
}

function openHello(schema, body, domain) {
  const [unsigned, signature] = exciseSignature(body, HELLO);
  let hello;
  try {
    hello = fromBinary(schema.Hello, body);
  } catch (e) {
    fail("malformed_message", `Hello does not parse: ${e.message}`);
  }
  checkAgentId(hello.agentId, "agent_id");
  verifyEd25519(hello.agentId, domain, unsigned, signature);
  return { hello, unsigned, signature };
}

// --- checks ---------------------------------------------------------------------------------

function expectEqual(what, got, want) {
  const g = typeof got === "bigint" ? got.toString() : JSON.stringify(got);
  const w = typeof want === "bigint" ? want.toString() : JSON.stringify(want);
  if (g !== w) throw new Error(`${what}: got ${g}, want ${w}`);
}

function checkMessageFields(msg, m) {
  expectEqual("from", msg.from, m.from);
  expectEqual("to", msg.to, m.to);
  expectEqual("msg_type", msg.msgType, m.msg_type);
  expectEqual("payload_json", msg.payloadJson, m.payload_json);
  for (const [key, field] of [
    ["timestamp", "timestamp"],
    ["msg_id", "msgId"],
    ["session_id", "sessionId"],
    ["reply_to", "replyTo"],
    ["reply_session_id", "replySessionId"],
    ["deadline", "deadline"],
  ]) {
    expectEqual(key, msg[field], big(m[key]));
  }
  expectEqual("flags", msg.flags, m.flags);
  expectEqual("extra_data", Buffer.from(msg.extraData).toString("hex"), m.extra_data_hex);
  expectEqual("sealed", Buffer.from(msg.sealed).toString("hex"), m.sealed_hex);
  // fields 16-19 (sections 3 and 18): known, singular, absent in older vectors
  expectEqual("stream_seq", msg.streamSeq, big(m.stream_seq ?? 0));
  expectEqual("credit", msg.credit, big(m.credit ?? 0));
  expectEqual("principal", msg.principal, m.principal ?? "");
  expectEqual("trace present", msg.trace !== undefined, "trace" in m);
  if (m.trace) {
    expectEqual("trace", [msg.trace.traceparent, msg.trace.tracestate], [m.trace.traceparent, m.trace.tracestate]);
  }
  expectEqual("task present", msg.task !== undefined, "task" in m);
  if (m.task) {
    const t = msg.task;
    expectEqual("task", [t.taskId, t.intent, t.step, t.steps, t.stateRef], [
      m.task.task_id,
      m.task.intent,
      m.task.step,
      m.task.steps,
      m.task.state_ref,
    ]);
  }
}

function checkVector(schema, v, dictionaries) {
  const { agentId } = keyFromSeed(Buffer.from(v.seed_hex, "hex"));
  expectEqual("agent_id from seed", agentId, v.agent_id);
  const signed = Buffer.from(v.signed_hex, "hex");
  const [unsigned, signature] = exciseSignature(signed, MESSAGE);
  expectEqual("unsigned bytes (field 8 excised)", unsigned.toString("hex"), v.unsigned_hex);
  expectEqual("signature", signature.toString("hex"), v.signature_hex);
  // Ed25519 is deterministic: signing again gives the same signature
  const { privateKey } = keyFromSeed(Buffer.from(v.seed_hex, "hex"));
  const again = crypto.sign(null, signingInput("iac-msg-v1", unsigned), privateKey);
  expectEqual("re-signed", again.toString("hex"), v.signature_hex);
  // re-encoding the decoded message with signature emptied gives the unsigned bytes
  const decoded = fromBinary(schema.Message, signed);
  const copy = create(schema.Message, { ...decoded, signature: new Uint8Array(0) });
  expectEqual("re-encoded unsigned bytes", Buffer.from(toBinary(schema.Message, copy)).toString("hex"), v.unsigned_hex);
  for (const [key, zstd] of [
    ["frame_raw_hex", false],
    ["frame_zstd_hex", true],
  ]) {
    const { frame, msg } = openMessage(schema, Buffer.from(v[key], "hex"), 4 * 1024 * 1024, dictionaries);
    expectEqual(`${key} body`, frame.body.toString("hex"), v.signed_hex);
    expectEqual(`${key} dict_id`, frame.dictId, zstd ? v.dict_id : null);
    checkMessageFields(msg, v.message);
  }
}

function checkAccept(schema, v, dictionaries) {
  const { frame, unsigned } = openMessage(schema, Buffer.from(v.frame_hex, "hex"), v.max_frame_size, dictionaries);
  expectEqual("body", frame.body.toString("hex"), v.signed_hex);
  expectEqual("unsigned", unsigned.toString("hex"), v.unsigned_hex);
}

function checkHello(schema, v) {
  const { agentId } = keyFromSeed(Buffer.from(v.seed_hex, "hex"));
  expectEqual("agent_id from seed", agentId, v.agent_id);
  const frame = decodeFrame(Buffer.from(v.frame_raw_hex, "hex"), 4 * 1024 * 1024, new Map());
  expectEqual("frame type", frame.type, 2);
  expectEqual("body", frame.body.toString("hex"), v.signed_hex);
  const { hello, unsigned, signature } = openHello(schema, frame.body, v.domain);
  expectEqual("unsigned", unsigned.toString("hex"), v.unsigned_hex);
  expectEqual("signature", signature.toString("hex"), v.signature_hex);
  expectEqual("agent_id", hello.agentId, v.hello.agent_id);
  expectEqual("nonce", Buffer.from(hello.nonce).toString("hex"), v.hello.nonce_hex);
  expectEqual("dict_ids", hello.dictIds, v.hello.dict_ids);
  const other = v.domain === "iac-hello-client-v1" ? "iac-hello-server-v1" : "iac-hello-client-v1";
  let reflected = false;
  try {
    openHello(schema, frame.body, other);
  } catch (e) {
    reflected = e instanceof Fault && e.code === "bad_signature";
  }
  if (!reflected) throw new Error("HELLO verified in the other role's domain");
}

function expectFault(name, fn) {
  try {
    fn();
  } catch (e) {
    if (!(e instanceof Fault)) throw e;
    if (e.code !== name) throw new Error(`refused as ${e.code} (${e.message}), expected ${name}`);
    return e;
  }
  throw new Error(`accepted, expected ${name}`);
}

// --- a frame of our own ---------------------------------------------------------------------

const JS_SEED = Buffer.from(Array.from({ length: 32 }, (_, i) => 0xa0 + i));

function makeFrame(schema, doc, dictionaries) {
  const { privateKey, agentId } = keyFromSeed(JS_SEED);
  const [dictId, dictFile] = [...dictionaries.entries()][0];
  const payload = {
    jsonrpc: "2.0",
    id: 4242,
    method: "tasks/send",
    params: { task: "summarize", step: 2, state: "working", input: "summarize item 9 of the report — ✓" },
  };
  const fields = {
    from: agentId,
    to: doc.vectors[0].message.to,
    msgType: 5, // DELEGATE_TASK
    payloadJson: JSON.stringify(payload),
    timestamp: 1767225600123456n,
    msgId: 18446744073709551615n,
    sessionId: 0x0123456789abcdefn,
    extraData: Buffer.from("from node", "utf8"),
    flags: 3,
    task: { taskId: "js-task-1", intent: 1, step: 2, steps: 4, stateRef: "s3://bucket/state" },
    deadline: 1767225630000000n,
  };
  const msg = create(schema.Message, fields);
  const unsigned = Buffer.from(toBinary(schema.Message, msg));
  msg.signature = crypto.sign(null, signingInput("iac-msg-v1", unsigned), privateKey);
  const signed = Buffer.from(toBinary(schema.Message, msg));
  const [check] = exciseSignature(signed, MESSAGE);
  if (!check.equals(unsigned)) throw new Error("own excision does not give the signed bytes");
  const r = runZstd(["-19", "--no-check", `--stream-size=${signed.length}`, "-D", dictFile], signed);
  if (r.status !== 0) throw new Error(`zstd failed: ${r.stderr}`);
  const info = zstdInfo(r.stdout, 4 * 1024 * 1024);
  if (info.dictId !== dictId || info.size !== signed.length) throw new Error("zstd header is not as expected");
  const frame = frameBytes(1, FLAG_ZSTD, r.stdout);
  openMessage(schema, frame, 4 * 1024 * 1024, dictionaries); // our own decoder accepts it
  return {
    seed_hex: JS_SEED.toString("hex"),
    agent_id: agentId,
    dict_id: dictId,
    frame_hex: frame.toString("hex"),
    signed_hex: signed.toString("hex"),
    unsigned_hex: unsigned.toString("hex"),
    message: {
      from: agentId,
      to: fields.to,
      msg_type: fields.msgType,
      payload_json: fields.payloadJson,
      timestamp: fields.timestamp.toString(),
      msg_id: fields.msgId.toString(),
      session_id: fields.sessionId.toString(),
      extra_data_hex: Buffer.from(fields.extraData).toString("hex"),
      flags: fields.flags,
      deadline: fields.deadline.toString(),
      task: { task_id: "js-task-1", intent: 1, step: 2, steps: 4, state_ref: "s3://bucket/state" },
    },
  };
}

// --- main ------------------------------------------------------------------------------------

function main() {
  const args = parseArgs(process.argv.slice(2));
  const doc = parseJsonLossless(readFileSync(path.join(args.vectors, "v1.json"), "utf8"));
  if (doc.version !== 1) throw new Error(`unsupported vector file version ${doc.version}`);
  const dictionaries = new Map(
    Object.entries(doc.dictionaries).map(([id, file]) => [Number(id), path.join(args.vectors, file)]),
  );
  const schema = loadSchema(args.schema);
  const counts = { vectors: 0, accept: 0, hello: 0, hello_negative: 0, negative: 0, emit: 0, failed: 0 };
  const failures = [];
  const run = (kind, name, fn) => {
    try {
      const note = fn();
      counts[kind] += 1;
      console.log(`ok   ${kind} ${name}${note ? ` (${note})` : ""}`);
    } catch (e) {
      counts.failed += 1;
      failures.push(`${kind} ${name}`);
      console.log(`FAIL ${kind} ${name}: ${e.message}`);
    }
  };
  for (const v of doc.vectors) run("vectors", v.name, () => checkVector(schema, v, dictionaries));
  for (const v of doc.accept ?? []) run("accept", v.name, () => checkAccept(schema, v, dictionaries));
  for (const v of doc.hello ?? []) run("hello", v.name, () => checkHello(schema, v));
  for (const v of doc.hello_negative ?? []) {
    run("hello_negative", v.name, () => {
      const frame = decodeFrame(Buffer.from(v.frame_hex, "hex"), 4 * 1024 * 1024, dictionaries);
      return expectFault(v.error, () => openHello(schema, frame.body, v.domain)).code;
    });
  }
  for (const v of doc.negative) {
    run("negative", v.name, () => {
      const data = Buffer.from(v.frame_hex, "hex");
      const e = expectFault(v.error, () => openMessage(schema, data, v.max_frame_size, dictionaries));
      // a key refused as an AgentId, or a signature refused by libsodium's extra rules: say
      // whether the plain OpenSSL check alone would have passed it
      if (e.code === "invalid_agent_id" || e.code === "bad_signature") {
        const body = decodeFrame(data, v.max_frame_size, dictionaries).body;
        const [unsigned, sig] = exciseSignature(body, MESSAGE);
        const from = fromBinary(schema.Message, body).from;
        if (AGENT_ID.test(from)) {
          const plain = opensslVerify(Buffer.from(from, "hex"), signingInput("iac-msg-v1", unsigned), sig);
          return `${e.code}; plain OpenSSL verify says ${plain}`;
        }
      }
      return e.code;
    });
  }
  let emitted = null;
  if (args.emit) {
    run("emit", args.emit, () => {
      emitted = makeFrame(schema, doc, dictionaries);
      writeFileSync(args.emit, JSON.stringify(emitted, null, 1) + "\n");
    });
  }
  const summary = { ...counts, failures, emitted: emitted ? args.emit : null };
  console.log(`SUMMARY ${JSON.stringify(summary)}`);
  process.exit(counts.failed ? 1 : 0);
}

main();
