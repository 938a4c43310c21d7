// Preloaded into every Node.js process of user code (NODE_OPTIONS) by the
// codemode runner. Node's fetch() does not read HTTP_PROXY, and the sandbox
// has no other way out than the runner's egress proxy: on the first call,
// this sends fetch() through the proxy (except for NO_PROXY hosts) with the
// undici that Debian's Node.js uses for its own fetch. Node's http and https
// modules are left alone; they do not read HTTP_PROXY either.
//
// The tunnel to the proxy is made here rather than by undici's ProxyAgent:
// the ProxyAgent of undici 5 (Debian's) takes a refused CONNECT for a
// broken socket and tries again until the request is cancelled, seconds
// later, without the proxy's reason. Here a refusal fails the fetch at once
// with the reason the proxy gave in its status line.
'use strict';
(() => {
  const proxy = process.env.HTTPS_PROXY || process.env.HTTP_PROXY;
  const original = globalThis.fetch;
  if (!proxy || typeof original !== 'function') return;
  let installed = false;
  function install() {
    installed = true;
    const net = require('net');
    const undici = require('undici');
    const proxyURL = new URL(proxy);
    const tls = undici.buildConnector({});
    const direct = new undici.Agent();
    const viaProxy = new undici.Agent({
      connect(opts, callback) {
        const port = opts.port || (opts.protocol === 'https:' ? 443 : 80);
        const host = opts.hostname.includes(':') ? `[${opts.hostname}]` : opts.hostname;
        tunnel(`${host}:${port}`, (err, socket) => {
          if (err) return callback(err);
          if (opts.protocol !== 'https:') return callback(null, socket);
          return tls({ ...opts, httpSocket: socket }, callback);
        });
      },
    });
    const noProxy = new Set((process.env.NO_PROXY || '').split(',').map((h) => h.trim().toLowerCase()).filter(Boolean));
    class Egress extends undici.Dispatcher {
      dispatch(opts, handler) {
        const host = new URL(opts.origin).hostname.replace(/^\[|\]$/g, '').toLowerCase();
        return (noProxy.has(host) ? direct : viaProxy).dispatch(opts, handler);
      }
      close() { return Promise.all([direct.close(), viaProxy.close()]); }
      destroy(err) { return Promise.all([direct.destroy(err), viaProxy.destroy(err)]); }
    }
    undici.setGlobalDispatcher(new Egress());

    // tunnel opens a CONNECT tunnel to target through the proxy and calls
    // back with its socket, or with an error that carries the proxy's
    // reason.
    function tunnel(target, callback) {
      const socket = net.connect(Number(proxyURL.port) || 80, proxyURL.hostname);
      let head = Buffer.alloc(0);
      let done = false;
      const finish = (err, rest) => {
        if (done) return;
        done = true;
        socket.removeListener('data', onData);
        socket.removeListener('error', finish);
        socket.removeListener('end', onEnd);
        if (err) {
          socket.destroy();
          callback(err);
          return;
        }
        socket.pause();
        if (rest && rest.length > 0) socket.unshift(rest);
        callback(null, socket);
      };
      const onEnd = () => finish(new Error(`codemode egress: the proxy closed the tunnel to ${target} before it answered`));
      function onData(chunk) {
        head = Buffer.concat([head, chunk]);
        const end = head.indexOf('\r\n\r\n');
        if (end < 0) {
          if (head.length > 16 << 10) finish(new Error('codemode egress: the proxy\'s answer has no end'));
          return;
        }
        const line = head.subarray(0, head.indexOf('\r\n')).toString('latin1');
        const m = /^HTTP\/1\.[01] (\d{3})(?: (.*))?$/.exec(line);
        if (!m || m[1] !== '200') {
          const reason = ((m && m[2]) || '').replace(/^codemode egress: /, '') || `the proxy answered ${JSON.stringify(line)}`;
          finish(new Error(`codemode egress: ${target} refused: ${reason}`));
          return;
        }
        finish(null, head.subarray(end + 4));
      }
      socket.on('data', onData);
      socket.on('error', finish);
      socket.on('end', onEnd);
      socket.write(`CONNECT ${target} HTTP/1.1\r\nHost: ${target}\r\n\r\n`);
    }
  }
  globalThis.fetch = function fetch(...args) {
    if (!installed) install();
    return original.apply(this, args);
  };
})();
