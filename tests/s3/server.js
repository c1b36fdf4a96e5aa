// The S3-compatible server of the object-storage tests: s3rver (npm,
// pinned in package.json) on 127.0.0.1, data under DIR, one bucket, and
// "port N" on stdout once it listens (PORT 0 picks a free one).
//
// s3rver 3.7.1 lacks AbortMultipartUpload and ListMultipartUploads (it
// answers 405 / NotImplemented); the middleware below adds both over
// s3rver's own upload folders, so the tests can check that a failed upload
// leaves no parts behind. They are test-only and skip authentication.
//
// Usage: node --openssl-legacy-provider server.js DIR PORT BUCKET
// (s3rver's ListObjectsV2 continuation tokens are DES-encrypted; Node 17+
// has DES only in OpenSSL 3's legacy provider.)
'use strict';
const fs = require('fs');
const path = require('path');
const S3rver = require('s3rver');

const [dir, port, bucket] = process.argv.slice(2);
const server = new S3rver({
  address: '127.0.0.1',
  port: Number(port),
  directory: dir,
  silent: true,
  configureBuckets: [{ name: bucket, configs: [] }],
});

const xmlEscape = s => s.replace(/[&<>"']/g, c => `&#${c.charCodeAt(0)};`);
const uploadsDir = b => server.store.getResourcePath(b, undefined, 'uploads');
const errorXml = (code, message) =>
  `<?xml version="1.0" encoding="UTF-8"?><Error><Code>${code}</Code><Message>${message}</Message></Error>`;

server.middleware.unshift(async (ctx, next) => {
  const m = /^\/([^/]+)(?:\/(.+))?$/.exec(ctx.path);
  if (!m) return next();
  const [, b, key] = m;
  if (ctx.method === 'DELETE' && key && 'uploadId' in ctx.query) {
    const d = path.join(uploadsDir(b), path.basename(String(ctx.query.uploadId)));
    if (!fs.existsSync(d)) {
      ctx.status = 404;
      ctx.type = 'application/xml';
      ctx.body = errorXml('NoSuchUpload', 'The specified upload does not exist.');
      return undefined;
    }
    await fs.promises.rm(d, { recursive: true, force: true });
    ctx.status = 204;
    return undefined;
  }
  if (ctx.method === 'GET' && !key && 'uploads' in ctx.query) {
    let ids = [];
    try {
      ids = await fs.promises.readdir(uploadsDir(b));
    } catch (e) {
      if (e.code !== 'ENOENT') throw e;
    }
    let uploads = '';
    for (const id of ids) {
      let k = '';
      try {
        k = (await fs.promises.readFile(path.join(uploadsDir(b), id, 'key'))).toString();
      } catch (e) {
        continue;
      }
      uploads += `<Upload><Key>${xmlEscape(k)}</Key><UploadId>${xmlEscape(id)}</UploadId></Upload>`;
    }
    ctx.type = 'application/xml';
    ctx.body = `<?xml version="1.0" encoding="UTF-8"?><ListMultipartUploadsResult>` +
      `<Bucket>${xmlEscape(b)}</Bucket><IsTruncated>false</IsTruncated>${uploads}</ListMultipartUploadsResult>`;
    return undefined;
  }
  return next();
});

server.run().then(({ port: p }) => {
  process.stdout.write(`port ${p}\n`);
}).catch(err => {
  process.stderr.write(`s3rver: ${err}\n`);
  process.exit(1);
});
