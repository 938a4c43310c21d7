package oidctest

import (
	"crypto"
	"crypto/hmac"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"strings"
)

// Forgeries of a token the provider issued, as an attacker would make
// them: same claims, another header or signature.

// resign returns token with header alg (and the token's own kid) and the
// signature sig makes of the signing input.
func resign(token, alg string, sig func(input []byte) []byte) string {
	parts := strings.Split(token, ".")
	hb, _ := base64.RawURLEncoding.DecodeString(parts[0])
	var h map[string]any
	_ = json.Unmarshal(hb, &h)
	h["alg"] = alg
	nh, _ := json.Marshal(h)
	input := base64.RawURLEncoding.EncodeToString(nh) + "." + parts[1]
	return input + "." + base64.RawURLEncoding.EncodeToString(sig([]byte(input)))
}

// AlgNone returns token unsigned, with alg none.
func AlgNone(token string) string {
	return resign(token, "none", func([]byte) []byte { return nil })
}

// HMACWithPublicKey returns token signed with HS256 keyed with the
// provider's public key, as published (the algorithm-confusion attack).
func (p *Provider) HMACWithPublicKey(token string) string {
	p.store.mu.Lock()
	pub := p.store.key.PublicKey
	p.store.mu.Unlock()
	return resign(token, "HS256", func(in []byte) []byte {
		m := hmac.New(sha256.New, pub.N.Bytes())
		m.Write(in)
		return m.Sum(nil)
	})
}

// SignedByAnotherKey returns token signed with a key the provider never
// had, under the provider's key id.
func SignedByAnotherKey(token string) string {
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		panic(err)
	}
	return resign(token, "RS256", func(in []byte) []byte {
		h := sha256.Sum256(in)
		sig, err := rsa.SignPKCS1v15(rand.Reader, key, crypto.SHA256, h[:])
		if err != nil {
			panic(err)
		}
		return sig
	})
}
