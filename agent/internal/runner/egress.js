// Preloaded into every Node.js process of user code (NODE_OPTIONS) by the
// codemode runner. Node's fetch() does not read HTTP_PROXY, and the sandbox
// has no other way out than the runner's egress proxy: on the first call,
// this sends fetch() through the proxy (except for NO_PROXY hosts) with the
// undici that Debian's Node.js uses for its own fetch. Node's http and https
// modules are left alone; they do not read HTTP_PROXY either.
'use strict';
(() => {
  const proxy = process.env.HTTPS_PROXY || process.env.HTTP_PROXY;
  const original = globalThis.fetch;
  if (!proxy || typeof original !== 'function') return;
  let installed = false;
  function install() {
    installed = true;
    const undici = require('undici');
    const direct = new undici.Agent();
    const viaProxy = new undici.ProxyAgent(proxy);
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
  }
  globalThis.fetch = function fetch(...args) {
    if (!installed) install();
    return original.apply(this, args);
  };
})();
