#!/usr/bin/env node
/*
 * S3-compatible test server for kvtier's s3 adapter tests.
 *
 * s3rver (npm) serves the S3 REST API from a directory. It checks that an
 * access key id exists but does not verify SigV4 signatures, so this wrapper
 * puts a middleware in front of it that recomputes every request's
 * signature with AWS's own signer (@smithy/signature-v4, the one the AWS SDK
 * for JavaScript uses) and answers 403 SignatureDoesNotMatch on a mismatch.
 * A request signed with a wrong secret is therefore refused, as AWS would.
 *
 *   node server.js --port P --dir D [--bucket B]... [--access-key K --secret-key S]
 *                  [--no-verify]
 *
 * Prints "ready <port>" on stdout once listening. Needs NODE_PATH pointing at
 * the node_modules that scripts/install-test-servers.sh installs (build/s3server).
 */
'use strict';

const S3rver = require('s3rver');
const AWSAccount = require('s3rver/lib/models/account');
const S3Error = require('s3rver/lib/models/error');
const { SignatureV4 } = require('@smithy/signature-v4');
const { Hash } = require('@smithy/hash-node');

function parseArgs(argv) {
  const o = { port: 0, dir: null, buckets: [], key: 'kvtier', secret: 'kvtier-secret', verify: true };
  for (let i = 2; i < argv.length; i++) {
    const a = argv[i];
    if (a === '--port') o.port = Number(argv[++i]);
    else if (a === '--dir') o.dir = argv[++i];
    else if (a === '--bucket') o.buckets.push(argv[++i]);
    else if (a === '--access-key') o.key = argv[++i];
    else if (a === '--secret-key') o.secret = argv[++i];
    else if (a === '--no-verify') o.verify = false;
    else throw new Error('unknown argument ' + a);
  }
  if (!o.dir) throw new Error('--dir is required');
  return o;
}

const opts = parseArgs(process.argv);
const secrets = new Map([[opts.key, opts.secret]]);
AWSAccount.DUMMY_ACCOUNT.createKeyPair(opts.key, opts.secret);

function mismatch(message) {
  return new S3Error('SignatureDoesNotMatch',
    'The request signature we calculated does not match the signature you provided. ' +
    'Check your key and signing method.' + (message ? ' (' + message + ')' : ''));
}

/* Recompute the signature of a header-signed SigV4 request from the
 * headers it lists as signed, the raw path and the query. */
async function verifySigV4(ctx, next) {
  const auth = ctx.get('authorization');
  if (!auth.startsWith('AWS4-HMAC-SHA256 ')) return next();
  const m = /Credential=([^/]+)\/(\d{8})\/([^/]+)\/([^/]+)\/aws4_request,\s*SignedHeaders=([^,]+),\s*Signature=([0-9a-f]{64})/.exec(auth);
  if (!m) throw mismatch('malformed Authorization header');
  const [, keyId, , region, service, signedList, signature] = m;
  const secret = secrets.get(keyId);
  if (secret === undefined) return next(); // s3rver answers InvalidAccessKeyId
  const amzDate = ctx.get('x-amz-date');
  const d = /^(\d{4})(\d{2})(\d{2})T(\d{2})(\d{2})(\d{2})Z$/.exec(amzDate);
  if (!d) throw mismatch('missing or malformed x-amz-date');
  const signingDate = new Date(Date.UTC(+d[1], +d[2] - 1, +d[3], +d[4], +d[5], +d[6]));
  const headers = {};
  for (const name of signedList.split(';')) {
    const v = ctx.req.headers[name];
    if (v === undefined) throw mismatch('signed header ' + name + ' is missing');
    headers[name] = Array.isArray(v) ? v.join(',') : v;
  }
  const rawUrl = ctx.req.url;
  const qi = rawUrl.indexOf('?');
  const path = qi < 0 ? rawUrl : rawUrl.slice(0, qi);
  const query = {};
  if (qi >= 0) {
    for (const part of rawUrl.slice(qi + 1).split('&')) {
      if (!part) continue;
      const eq = part.indexOf('=');
      const k = decodeURIComponent(eq < 0 ? part : part.slice(0, eq));
      const v = eq < 0 ? '' : decodeURIComponent(part.slice(eq + 1).replace(/\+/g, '%20'));
      if (k in query) query[k] = [].concat(query[k], v); else query[k] = v;
    }
  }
  const signer = new SignatureV4({
    credentials: { accessKeyId: keyId, secretAccessKey: secret },
    region, service, sha256: Hash.bind(null, 'sha256'), uriEscapePath: false, applyChecksum: false,
  });
  const signed = await signer.sign(
    { method: ctx.method, protocol: 'http:', hostname: headers.host || '', path, query, headers },
    { signingDate, signableHeaders: new Set(Object.keys(headers)) });
  const want = /Signature=([0-9a-f]{64})/.exec(signed.headers.authorization)[1];
  if (want !== signature) throw mismatch();
  return next();
}

async function main() {
  const server = new S3rver({
    port: opts.port, address: '127.0.0.1', silent: true, directory: opts.dir,
    configureBuckets: opts.buckets.map(name => ({ name })), vhostBuckets: true,
    serviceEndpoint: 'localhost',
  });
  if (opts.verify) server.middleware.unshift(verifySigV4);
  const addr = await server.run();
  process.stdout.write('ready ' + addr.port + '\n');
  const stop = () => server.close().finally(() => process.exit(0));
  process.on('SIGTERM', stop);
  process.on('SIGINT', stop);
}

main().catch(err => { console.error(err); process.exit(1); });
