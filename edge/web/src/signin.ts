// Sign-in with the OpenID provider the edge trusts, when it offers one
// (GET signin.json): the authorization code flow with PKCE, in the page.
// The page goes to the provider's authorization endpoint, comes back to
// itself with a code, and trades it (with the PKCE verifier only this tab
// holds) for an access token at the provider's token endpoint. The token
// lives in sessionStorage, like an API key: it survives a reload, not the
// tab, and goes to the edge as Authorization: Bearer over gRPC-Web.

export interface SignInSettings {
  issuer: string;
  clientId: string;
  authorizationEndpoint: string;
  tokenEndpoint: string;
  scopes: string[];
}

const tokenStore = "codemode.token";
const pendingStore = "codemode.signin";

function base64url(bytes: Uint8Array): string {
  let s = "";
  for (const b of bytes) s += String.fromCharCode(b);
  return btoa(s).replace(/\+/g, "-").replace(/\//g, "_").replace(/=+$/, "");
}

function random(n: number): string {
  const b = new Uint8Array(n);
  crypto.getRandomValues(b);
  return base64url(b);
}

// The page's own URL is the redirect URI; its origin is the resource
// (RFC 8707) the token is asked for.
function redirectURI(): string {
  return new URL(".", document.baseURI).href;
}

function resource(): string {
  return new URL(document.baseURI).origin;
}

// settings returns the edge's sign-in settings, or undefined when it offers
// no sign-in.
export async function settings(): Promise<SignInSettings | undefined> {
  try {
    const res = await fetch("signin.json", { cache: "no-store" });
    return res.status === 200 ? ((await res.json()) as SignInSettings) : undefined; // 204: none
  } catch {
    return undefined;
  }
}

// token returns the access token of the signed-in user, if any and not
// expired.
export function token(): string | undefined {
  const raw = sessionStorage.getItem(tokenStore);
  if (!raw) return undefined;
  const t = JSON.parse(raw) as { accessToken: string; expires: number };
  if (Date.now() >= t.expires) {
    sessionStorage.removeItem(tokenStore);
    return undefined;
  }
  return t.accessToken;
}

export function signOut() {
  sessionStorage.removeItem(tokenStore);
}

// start sends the user to the provider.
export async function start(s: SignInSettings): Promise<void> {
  const verifier = random(32);
  const state = random(16);
  const challenge = base64url(new Uint8Array(await crypto.subtle.digest("SHA-256", new TextEncoder().encode(verifier))));
  sessionStorage.setItem(pendingStore, JSON.stringify({ verifier, state }));
  const u = new URL(s.authorizationEndpoint);
  u.searchParams.set("response_type", "code");
  u.searchParams.set("client_id", s.clientId);
  u.searchParams.set("redirect_uri", redirectURI());
  u.searchParams.set("scope", s.scopes.join(" "));
  u.searchParams.set("state", state);
  u.searchParams.set("code_challenge", challenge);
  u.searchParams.set("code_challenge_method", "S256");
  u.searchParams.set("resource", resource());
  location.assign(u.href);
}

// finish completes a sign-in when the page was opened by the provider's
// redirect (?code=...&state=...): it returns true once the token is kept,
// false when there is nothing to finish, and throws when the provider
// refused or the answer does not match the sign-in this tab started.
export async function finish(s: SignInSettings): Promise<boolean> {
  const q = new URLSearchParams(location.search);
  if (!q.has("code") && !q.has("error")) return false;
  history.replaceState(null, "", redirectURI()); // the code is used once
  const pending = JSON.parse(sessionStorage.getItem(pendingStore) ?? "null") as { verifier: string; state: string } | null;
  sessionStorage.removeItem(pendingStore);
  if (q.has("error")) throw new Error(`sign-in refused: ${q.get("error_description") ?? q.get("error")}`);
  if (!pending || q.get("state") !== pending.state) throw new Error("sign-in answer does not match a sign-in started here");
  const res = await fetch(s.tokenEndpoint, {
    method: "POST",
    headers: { "Content-Type": "application/x-www-form-urlencoded" },
    body: new URLSearchParams({
      grant_type: "authorization_code",
      code: q.get("code")!,
      redirect_uri: redirectURI(),
      client_id: s.clientId,
      code_verifier: pending.verifier,
      resource: resource(),
    }),
  });
  const body = (await res.json()) as { access_token?: string; expires_in?: number; error?: string; error_description?: string };
  if (!res.ok || !body.access_token) throw new Error(`sign-in: ${body.error_description ?? body.error ?? res.status}`);
  const expires = Date.now() + (body.expires_in ?? 300) * 1000 - 10000;
  sessionStorage.setItem(tokenStore, JSON.stringify({ accessToken: body.access_token, expires }));
  return true;
}
