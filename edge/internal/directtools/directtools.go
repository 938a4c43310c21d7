// Package directtools makes the calls of declared API tools (internal/apicatalog) for
// the edge's MCP door /mcp-no-code-execute. Each call goes through the same
// gates as a run: its arguments are checked against the tool's schema, it
// counts against the tenant's admission limits, and the request-phase
// policies vet it (door "mcp-api", with api_call set) before anything is
// sent. Then the edge makes the HTTP request with the API's headers and
// credential, bounded in time and in the size of the answer kept.
//
// # Errors
//
// Errors are Connect errors whose message is for the caller (a model):
// invalid_argument for arguments that do not fit, resource_exhausted for a
// tenant over its limits, permission_denied for a policy's denial (as for a
// run), deadline_exceeded when the API does not answer in time, and
// unavailable when it cannot be reached or its answer cannot be checked for
// the credential (see apicatalog.ErrUnchecked), and permission_denied for an
// answer that echoes the credential of an API declared with refuse_echo.
// None holds the credential or the API's base URL (callers see its name),
// and transport details (addresses, causes) go only to the log. An answer
// with an error status is a Response, not an error.
//
// # Credentials in answers
//
// An answer is passed through the API's apicatalog.Redactor before anything of it
// is kept: the credential, in every form the Redactor finds, is redacted
// from the reason phrase, every header (Location included) and the body
// (or, with refuse_echo, the call fails).
//
// A Service is safe for concurrent use.
package directtools

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"time"
	"unicode/utf8"

	"connectrpc.com/connect"

	"github.com/codemode-go/codemode/edge/internal/policy"
	"github.com/codemode-go/codemode/edge/internal/ratelimit"
	executionv1 "github.com/codemode-go/codemode/gen/codemode/execution/v1"
	policyv1 "github.com/codemode-go/codemode/gen/codemode/policy/v1"
	"github.com/codemode-go/codemode/internal/apicatalog"
)

// Door is the door policies see for an API call.
const Door = "mcp-api"

// Defaults.
const (
	// DefaultTimeout bounds one call, from sending the request to reading
	// the last byte kept.
	DefaultTimeout = 30 * time.Second
	// DefaultMaxResponseBytes is how much of an answer's body is kept;
	// more is cut, and the Response says so.
	DefaultMaxResponseBytes = 1 << 20
	// maxRedirects is how many redirects within the API's host are followed.
	maxRedirects = 5
)

// Service makes API calls.
type Service struct {
	client    *http.Client
	logger    *slog.Logger
	policies  *policy.Engine     // nil: no policies
	admission *ratelimit.Limiter // nil: no limits
	timeout   time.Duration
	maxBytes  int64
}

// Option configures a Service.
type Option func(*Service)

// WithPolicies vets every call with the request-phase policies of e.
func WithPolicies(e *policy.Engine) Option { return func(s *Service) { s.policies = e } }

// WithAdmission counts every call against its tenant's limits in l, the
// same Limiter the runs use.
func WithAdmission(l *ratelimit.Limiter) Option { return func(s *Service) { s.admission = l } }

// WithTimeout bounds each call; zero or less means DefaultTimeout.
func WithTimeout(d time.Duration) Option { return func(s *Service) { s.timeout = d } }

// WithMaxResponseBytes sets how much of an answer is kept; zero or less
// means DefaultMaxResponseBytes.
func WithMaxResponseBytes(n int64) Option { return func(s *Service) { s.maxBytes = n } }

// New returns a Service.
func New(logger *slog.Logger, opts ...Option) *Service {
	s := &Service{
		logger: logger,
		// The default transport's settings, the proxy variables included
		// (they never apply to loopback).
		client: &http.Client{Transport: http.DefaultTransport.(*http.Transport).Clone(), CheckRedirect: sameHost},
	}
	for _, o := range opts {
		o(s)
	}
	if s.logger == nil {
		s.logger = slog.New(slog.DiscardHandler)
	}
	if s.timeout <= 0 {
		s.timeout = DefaultTimeout
	}
	if s.maxBytes <= 0 {
		s.maxBytes = DefaultMaxResponseBytes
	}
	return s
}

// sameHost follows a redirect only within the scheme and host of the
// first request: the credential header, whatever its name, goes to the
// API's host and nowhere else. Another redirect is returned as the answer.
func sameHost(req *http.Request, via []*http.Request) error {
	if len(via) >= maxRedirects || req.URL.Scheme != via[0].URL.Scheme || req.URL.Host != via[0].URL.Host {
		return http.ErrUseLastResponse
	}
	return nil
}

// Call is one call of a tool, as the door hands it over.
type Call struct {
	Tool *apicatalog.Tool
	// Arguments as the caller sent them: a JSON object, or empty.
	Arguments []byte
	// Tenant is who asks.
	Tenant string
	// RequestID identifies the call in logs and to policies.
	RequestID string
	// Subject is a hash of who asks within the tenant, for callers with a
	// token; "" otherwise.
	Subject string
}

// Response is the API's answer.
type Response struct {
	// Method and URL of the request made (no credential is in the URL).
	Method, URL string
	// Path is the request's path and query below the API's base URL: what
	// a caller is shown instead of URL.
	Path string
	// Status is the HTTP status code, StatusText the status line's text
	// ("404 Not Found"), redacted.
	Status     int
	StatusText string
	// ContentType is the answer's Content-Type.
	ContentType string
	// Location is the Location of a redirect that was not followed,
	// redacted; below the API's base URL, it is given as a path.
	Location string
	// Body is the answer's body, with the credential redacted, cut at the
	// limit (at a UTF-8 boundary when it is text).
	Body []byte
	// Truncated says that the body was cut.
	Truncated bool
	// Duration of the call.
	Duration time.Duration
}

// Call makes c and returns the API's answer, whatever its status.
func (s *Service) Call(ctx context.Context, c Call) (res *Response, err error) {
	start := time.Now()
	t := c.Tool
	log := s.logger.With("request_id", c.RequestID, "tenant", c.Tenant, "subject", c.Subject, "door", Door, "api", t.API.Name, "tool", t.Name)
	var cause error // what the log gets instead of err, which is for the caller
	defer func() {
		if err == nil {
			return
		}
		lvl := slog.LevelDebug
		if code := connect.CodeOf(err); code == connect.CodeUnavailable || code == connect.CodeFailedPrecondition || errors.Is(cause, apicatalog.ErrEcho) {
			lvl = slog.LevelWarn
		}
		if cause == nil {
			cause = err
		}
		log.Log(context.Background(), lvl, "api call failed", "code", connect.CodeOf(err).String(), "error", cause)
	}()
	call, err := t.NewCall(c.Arguments)
	if err != nil {
		return nil, connect.NewError(connect.CodeInvalidArgument, err)
	}
	release, err := s.admit(c.Tenant)
	if err != nil {
		return nil, err
	}
	defer release()
	if err := s.vet(ctx, c, call); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	req, err := call.Request(ctx)
	if err != nil {
		return nil, connect.NewError(connect.CodeFailedPrecondition, err)
	}
	hres, err := s.client.Do(req)
	if err != nil {
		cause = err
		return nil, s.transportError(ctx, t, c.RequestID)
	}
	defer hres.Body.Close()
	if err := t.API.Redactor(req.Header).Response(hres); err != nil {
		cause = err
		return nil, answerError(t, err, c.RequestID)
	}
	res = &Response{Method: call.Method, URL: call.URL.String(), Path: below(t.API, call.URL.String()),
		Status: hres.StatusCode, StatusText: hres.Status, ContentType: hres.Header.Get("Content-Type")}
	if hres.StatusCode >= 300 && hres.StatusCode < 400 {
		res.Location = hres.Header.Get("Location")
		if u, err := hres.Location(); err == nil {
			res.Location = below(t.API, u.String())
		}
	}
	if res.Body, res.Truncated, err = s.read(hres.Body); err != nil {
		cause = err
		if errors.Is(err, apicatalog.ErrEcho) {
			return nil, answerError(t, err, c.RequestID)
		}
		return nil, s.transportError(ctx, t, c.RequestID)
	}
	res.Duration = time.Since(start)
	log.Debug("api call", "method", call.Method, "path", call.URL.Path, "status", res.Status,
		"bytes", len(res.Body), "truncated", res.Truncated, "elapsed", res.Duration)
	return res, nil
}

// admit counts the call against its tenant's limits.
func (s *Service) admit(tenant string) (release func(), err error) {
	if s.admission == nil {
		return func() {}, nil
	}
	release, err = s.admission.Acquire(tenant)
	if ex := (*ratelimit.ExceededError)(nil); errors.As(err, &ex) {
		return nil, ex.ConnectError()
	}
	if err != nil {
		return nil, connect.NewError(connect.CodeResourceExhausted, err)
	}
	return release, nil
}

// vet runs the request-phase policies on the call. Only their verdict
// matters: an API call has no code to rewrite, no limits to tighten and
// no agent to route to.
func (s *Service) vet(ctx context.Context, c Call, call *apicatalog.Call) error {
	if s.policies == nil {
		return nil
	}
	_, err := s.policies.EvaluateRequest(ctx, policy.RequestInput{
		Execution: &executionv1.Execution{},
		Tenant:    c.Tenant, Door: Door, RequestID: c.RequestID, Subject: c.Subject,
		APICall: &policyv1.ApiCall{
			Api: c.Tool.API.Name, Tool: c.Tool.Name, ArgumentsJson: string(call.Arguments),
			Method: call.Method, Url: call.URL.String(),
		},
	})
	if d := (*policy.Denial)(nil); errors.As(err, &d) {
		return d.ConnectError()
	}
	if err != nil {
		if ctx.Err() != nil {
			return connect.NewError(connect.CodeCanceled, ctx.Err())
		}
		return connect.NewError(connect.CodeUnavailable, fmt.Errorf("the policies could not vet the call (request id %s)", c.RequestID))
	}
	return nil
}

// read reads body (redacted by apicatalog.Redactor.Response) up to the limit, and
// says whether it was cut.
func (s *Service) read(body io.Reader) (b []byte, truncated bool, err error) {
	b, err = io.ReadAll(io.LimitReader(body, s.maxBytes+1))
	if err != nil {
		return nil, false, err
	}
	truncated = int64(len(b)) > s.maxBytes
	if truncated {
		b = b[:s.maxBytes]
		// Nor in part of the mark of a redacted secret.
		for k := len(apicatalog.Redacted) - 1; k > 0; k-- {
			if bytes.HasSuffix(b, []byte(apicatalog.Redacted[:k])) {
				b = b[:len(b)-k]
				break
			}
		}
		// Text is not left ending in part of a character.
		for i := 1; i < utf8.UTFMax && len(b) > 0; i++ {
			if r, size := utf8.DecodeLastRune(b); r != utf8.RuneError || size != 1 {
				break
			}
			b = b[:len(b)-1]
		}
	}
	return b, truncated, nil
}

// below returns u as a path below the API's base URL when it is one, for
// callers, who are shown the API's name and never its address; else u.
func below(api *apicatalog.API, u string) string {
	base := strings.TrimSuffix(api.BaseURL.String(), "/")
	if rest, ok := strings.CutPrefix(u, base); ok && (rest == "" || strings.HasPrefix(rest, "/") || strings.HasPrefix(rest, "?")) {
		if !strings.HasPrefix(rest, "/") {
			rest = "/" + rest
		}
		return rest
	}
	return u
}

// answerError says why an answer is withheld: it echoes the credential of
// an API that refuses echoes, or it cannot be checked for the credential.
func answerError(t *apicatalog.Tool, err error, requestID string) error {
	if errors.Is(err, apicatalog.ErrEcho) {
		return connect.NewError(connect.CodePermissionDenied,
			fmt.Errorf("the answer of %s echoes its credential and is withheld (request id %s)", t.API.Name, requestID))
	}
	if errors.Is(err, apicatalog.ErrUnchecked) {
		return connect.NewError(connect.CodeUnavailable, fmt.Errorf("%s: %w (request id %s)", t.API.Name, err, requestID))
	}
	return connect.NewError(connect.CodeUnavailable, fmt.Errorf("%s could not be read (request id %s)", t.API.Name, requestID))
}

// transportError says why no answer came, without the cause (addresses,
// resolver errors), which goes to the log.
func (s *Service) transportError(ctx context.Context, t *apicatalog.Tool, requestID string) error {
	switch {
	case errors.Is(ctx.Err(), context.DeadlineExceeded):
		return connect.NewError(connect.CodeDeadlineExceeded, fmt.Errorf("%s did not answer within %s", t.API.Name, s.timeout))
	case ctx.Err() != nil:
		return connect.NewError(connect.CodeCanceled, ctx.Err())
	}
	return connect.NewError(connect.CodeUnavailable, fmt.Errorf("%s could not be reached (request id %s)", t.API.Name, requestID))
}
