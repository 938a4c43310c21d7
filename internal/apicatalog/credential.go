package apicatalog

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"strings"

	"golang.org/x/net/http/httpguts"

	"github.com/codemode-go/codemode/internal/secretfile"
)

// Credential says how a secret goes with every request to an API: in the
// header Header, after Prefix ("Authorization", "Bearer ").
type Credential struct {
	// Header is the header's name.
	Header string `json:"header"`
	// Prefix comes before the secret in the header's value.
	Prefix string `json:"prefix,omitempty"`
	// SecretEnv names an environment variable holding the secret; it is
	// read first.
	SecretEnv string `json:"secret_env,omitempty"`
	// SecretFile names a file holding the secret (white space around it
	// is dropped); it is read when SecretEnv is not set or empty. The file
	// is read for every request, so a token refreshed in place is used at
	// once. It must be the service's own: a file its group or other users
	// may read or write is refused, at load and at every request.
	SecretFile string `json:"secret_file,omitempty"`
	// Optional lets requests go without the header while no secret is
	// there (GitHub's public API answers without a token, with a lower
	// rate limit). A credential that is not optional must be there when the
	// declaration is loaded, and a request made while it is missing fails.
	Optional bool `json:"optional,omitempty"`
	// RefuseEcho makes an answer that holds the secret, in any form a
	// [Redactor] finds, an error instead of an answer with the secret
	// redacted: a direct tool call fails, and code gets 502 Bad Gateway.
	// For an API whose answers should never hold the token.
	RefuseEcho bool `json:"refuse_echo,omitempty"`
}

// check checks the credential, and that its secret is there unless it is
// optional. Errors name the variable and file, never the secret.
func (c *Credential) check(getenv func(string) string) error {
	if !httpguts.ValidHeaderFieldName(c.Header) {
		return fmt.Errorf("header %q is not a valid header name", c.Header)
	}
	if !httpguts.ValidHeaderFieldValue(c.Prefix) {
		return errors.New("prefix holds characters a header cannot carry")
	}
	if c.SecretEnv == "" && c.SecretFile == "" {
		return errors.New("give secret_env, secret_file or both")
	}
	var from []string
	if c.SecretEnv != "" {
		from = append(from, "the environment variable "+c.SecretEnv)
	}
	if c.SecretFile != "" {
		from = append(from, "the file "+c.SecretFile)
	}
	_, ok, err := c.secret(getenv)
	switch {
	case errors.Is(err, secretfile.ErrExposed):
		return fmt.Errorf("the secret file %s is %w: make it the service's own with `chmod 600 %s` (a secret mounted by Docker or Kubernetes: give it mode 0400)", c.SecretFile, secretfile.ErrExposed, c.SecretFile)
	case err != nil:
		return fmt.Errorf("%w (secret from %s)", err, strings.Join(from, " or "))
	case !ok && !c.Optional:
		return fmt.Errorf("no secret in %s, and the credential is not optional", strings.Join(from, " or "))
	}
	return nil
}

// secret returns the secret, or ok false when there is none. Its errors
// never hold the secret or the file's name.
func (c *Credential) secret(getenv func(string) string) (secret string, ok bool, err error) {
	if c.SecretEnv != "" {
		if s := strings.TrimSpace(getenv(c.SecretEnv)); s != "" {
			return s, true, checkSecret(c.Prefix + s)
		}
	}
	if c.SecretFile == "" {
		return "", false, nil
	}
	b, err := secretfile.Read(c.SecretFile)
	if errors.Is(err, fs.ErrNotExist) {
		return "", false, nil
	}
	if errors.Is(err, secretfile.ErrExposed) {
		return "", false, fmt.Errorf("the secret file is %w", secretfile.ErrExposed) // without the path
	}
	if err != nil {
		var pe *fs.PathError
		if errors.As(err, &pe) {
			err = pe.Err // without the path
		}
		return "", false, fmt.Errorf("read the secret file: %w", err)
	}
	s := strings.TrimSpace(string(b))
	if s == "" {
		return "", false, nil
	}
	return s, true, checkSecret(c.Prefix + s)
}

func checkSecret(value string) error {
	if !httpguts.ValidHeaderFieldValue(value) {
		return errors.New("the secret holds characters a header cannot carry")
	}
	return nil
}

func checkHeader(name, value string) error {
	if !httpguts.ValidHeaderFieldName(name) {
		return fmt.Errorf("%q is not a valid header name", name)
	}
	if !httpguts.ValidHeaderFieldValue(value) {
		return fmt.Errorf("header %s: the value holds characters a header cannot carry", name)
	}
	switch http.CanonicalHeaderKey(name) {
	case "Host", "Content-Length", "Transfer-Encoding", "Connection":
		return fmt.Errorf("header %s is set by the HTTP client", name)
	case "Accept-Encoding", "Range", "If-Range", "Te", "Trailer", "Upgrade":
		// An answer must come whole and uncompressed for the credential
		// to be looked for in it (see Redactor).
		return fmt.Errorf("header %s is set by codemode", name)
	}
	return nil
}

// CredentialHeader returns the name of the header that carries the API's
// credential, or "" when it has none.
func (a *API) CredentialHeader() string {
	if a.cred == nil {
		return ""
	}
	return http.CanonicalHeaderKey(a.cred.Header)
}

// Header returns the headers to send with every request to the API: the
// declared ones, Accept-Encoding: identity (an answer is looked for the
// credential in as it comes, so it must come uncompressed), and the
// credential, read now. The secret is in the result:
// never log it. An error (a credential that is not optional and missing,
// or an unreadable secret file) names the API but neither the secret nor
// the file.
func (a *API) Header(_ context.Context) (http.Header, error) {
	h := a.header.Clone()
	h.Set("Accept-Encoding", "identity")
	if a.cred == nil {
		return h, nil
	}
	s, ok, err := a.cred.secret(a.getenv)
	if err != nil {
		return nil, fmt.Errorf("api %s: credential: %w", a.Name, err)
	}
	if !ok {
		if a.cred.Optional {
			return h, nil
		}
		return nil, fmt.Errorf("api %s: its credential is missing", a.Name)
	}
	h.Set(a.cred.Header, a.cred.Prefix+s)
	return h, nil
}
