// An edge that trusts an OpenID provider (CODEMODE_EDGE_URL; the provider
// runs on loopback in the Go test that starts this one): the official MCP
// TypeScript SDK's client connects to /mcp with no credential, finds the
// provider from the edge's 401 and Protected Resource Metadata, gets a
// token for the resource by the authorization code flow with PKCE (driven
// here without a browser: the provider's login signs its test user in at
// once), and then calls execute_code.

import assert from "node:assert/strict";
import { describe, test } from "node:test";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";
import { UnauthorizedError } from "@modelcontextprotocol/sdk/client/auth.js";
import { edgeURL } from "./edge.mjs";

const clientId = process.env.CODEMODE_OAUTH_CLIENT_ID;
const redirectUrl = process.env.CODEMODE_OAUTH_REDIRECT_URI;
const issuer = process.env.CODEMODE_OAUTH_ISSUER;

// provider keeps what the SDK's OAuth flow hands it, in memory.
class Provider {
  constructor() {
    this.authorizationUrl = undefined;
    this.saved = undefined;
    this.verifier = undefined;
  }
  get redirectUrl() {
    return redirectUrl;
  }
  get clientMetadata() {
    return { client_name: "codemode-web-test", redirect_uris: [redirectUrl], grant_types: ["authorization_code"], response_types: ["code"], token_endpoint_auth_method: "none" };
  }
  clientInformation() {
    return { client_id: clientId }; // registered with the provider beforehand
  }
  tokens() {
    return this.saved;
  }
  saveTokens(tokens) {
    this.saved = tokens;
  }
  redirectToAuthorization(url) {
    this.authorizationUrl = url;
  }
  saveCodeVerifier(v) {
    this.verifier = v;
  }
  codeVerifier() {
    return this.verifier;
  }
}

// authorize follows the provider's redirects from url, as a browser would,
// until one goes to the redirect URI, and returns its code.
async function authorize(url) {
  let next = url.href;
  for (let i = 0; i < 10; i++) {
    const u = new URL(next);
    assert.ok(["127.0.0.1", "localhost"].includes(u.hostname), `redirected off loopback: ${next}`);
    const res = await fetch(next, { redirect: "manual" });
    const location = res.headers.get("location");
    assert.ok(location, `${next}: HTTP ${res.status} without a redirect: ${await res.text()}`);
    const to = new URL(location, next);
    if (to.href.startsWith(redirectUrl)) {
      const code = to.searchParams.get("code");
      assert.ok(code, `redirect without a code: ${to.href}`);
      return code;
    }
    next = to.href;
  }
  throw new Error("too many redirects");
}

function claims(jwt) {
  return JSON.parse(Buffer.from(jwt.split(".")[1], "base64url").toString());
}

describe("MCP authorization", { timeout: 60000 }, () => {
  const url = edgeURL();
  const mcpURL = new URL("/mcp", url);
  assert.ok(clientId && redirectUrl && issuer, "CODEMODE_OAUTH_CLIENT_ID, CODEMODE_OAUTH_REDIRECT_URI and CODEMODE_OAUTH_ISSUER must be set");

  test("the SDK's client signs in through the provider and runs code", async () => {
    const provider = new Provider();
    let transport = new StreamableHTTPClientTransport(mcpURL, { authProvider: provider });
    const first = new Client({ name: "codemode-web-test", version: "0.1.0" });
    await assert.rejects(first.connect(transport), UnauthorizedError);

    // The SDK found the provider through the edge's metadata and sent the
    // user there: the authorization code flow, with PKCE and a resource
    // indicator naming /mcp.
    const auth = provider.authorizationUrl;
    assert.ok(auth, "the SDK did not start the authorization");
    assert.equal(auth.origin, new URL(issuer).origin);
    assert.equal(auth.searchParams.get("response_type"), "code");
    assert.equal(auth.searchParams.get("code_challenge_method"), "S256");
    assert.ok(auth.searchParams.get("code_challenge"));
    assert.equal(auth.searchParams.get("resource"), mcpURL.href);
    assert.match(auth.searchParams.get("scope") ?? "", /codemode:execute/);

    await transport.finishAuth(await authorize(auth));
    const token = provider.tokens()?.access_token;
    assert.ok(token, "no token after the code exchange");
    const c = claims(token);
    assert.equal(c.iss, issuer);
    assert.deepEqual([c.aud].flat(), [mcpURL.href]);

    transport = new StreamableHTTPClientTransport(mcpURL, { authProvider: provider });
    const client = new Client({ name: "codemode-web-test", version: "0.1.0" });
    await client.connect(transport);
    try {
      const res = await client.callTool({ name: "execute_code", arguments: { language: "python", code: "print(6*7)" } });
      assert.notEqual(res.isError, true, JSON.stringify(res));
      assert.equal(res.structuredContent.stdout, "42\n");
    } finally {
      await client.close();
    }
  });
});
