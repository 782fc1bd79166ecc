// The Node.js client of tests/integration/vm-secrets.sh, run in the guest: GET https://HOST/PATH
// through the egress proxy with "Authorization: Bearer $EXAMPLE_API_KEY", trusting what Node
// trusts (its own roots plus NODE_EXTRA_CA_CERTS). Node's https does not follow https_proxy, so
// the tunnel is opened by hand, as proxy-aware client libraries do. Prints "STATUS BODY", or
// "error MESSAGE" and exits 1.
// Usage: node secrets-node-client.js HOST PATH [PROXY_HOST:PORT]   (default 10.0.2.100:3128)
'use strict';
const http = require('http');
const https = require('https');
const tls = require('tls');

const [host, path, proxy = '10.0.2.100:3128'] = process.argv.slice(2);
const [proxyHost, proxyPort] = proxy.split(':');
const fail = (message) => {
  console.log('error ' + message);
  process.exit(1);
};

const connect = http.request({
  host: proxyHost,
  port: Number(proxyPort),
  method: 'CONNECT',
  path: host + ':443',
  headers: { Host: host + ':443' },
});
connect.on('connect', (res, socket) => {
  if (res.statusCode !== 200) fail('proxy answered ' + res.statusCode);
  const req = https.request(
    {
      host,
      port: 443,
      path,
      headers: { Host: host, Authorization: 'Bearer ' + (process.env.EXAMPLE_API_KEY || '') },
      createConnection: () => tls.connect({ socket, servername: host }),
    },
    (resp) => {
      let body = '';
      resp.setEncoding('utf8');
      resp.on('data', (d) => (body += d));
      resp.on('end', () => {
        console.log(resp.statusCode + ' ' + body);
        process.exit(0);
      });
    },
  );
  req.on('error', (e) => fail(e.message));
  req.end();
});
connect.on('error', (e) => fail(e.message));
connect.setTimeout(30000, () => fail('timeout'));
connect.end();
