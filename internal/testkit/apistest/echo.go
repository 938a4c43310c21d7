package apistest

import (
	"bytes"
	"compress/gzip"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"
)

// Echo is an API on loopback that echoes a request's header back in one of
// the forms an API may write it in, chosen by the path's last segment:
//
//   - raw: the value in a text body;
//   - gzip: the value in a text body, gzip-compressed when the request
//     accepts gzip;
//   - gzip-always: the same, compressed whatever the request accepts;
//   - json: a JSON body {"you_sent": VALUE} as PHP writes it, every '/'
//     escaped as \/;
//   - json-u: the same with every character as a \u00XX escape;
//   - percent: the value percent-encoded in a text body;
//   - basic: "user:VALUE" base64-encoded, in a text body;
//   - html: an HTML page with the value's characters as character
//     references, decimal and hex by turns, as strict HTML encoders write;
//   - range: "you sent: VALUE" served with ranges (206 for a Range request);
//   - trailer: an empty body, the value in the trailer X-Echo;
//   - location: 302 to another host, the value in Location's query;
//   - reason: 400 with the value in the status line's reason phrase;
//   - early: 103 Early Hints whose Link holds the value, then "ok";
//   - clean: "nothing echoed";
//   - big: 64 KiB of JSON shaped like GitHub's repositories, nothing
//     echoed, for benchmarks.
//
// Any other segment is 404.
type Echo struct {
	// URL is its base URL, http://127.0.0.1:PORT.
	URL string
	// Header is the request header echoed.
	Header string
}

// bigJSON is 64 KiB of a JSON array of repositories.
var bigJSON = func() []byte {
	repos, _ := userRepos("many", 100, "")
	for n := len(repos); ; n-- {
		b, _ := json.Marshal(repos[:n])
		if len(b) <= 64<<10 {
			return append(b, bytes.Repeat([]byte(" "), 64<<10-len(b))...)
		}
	}
}()

// EchoForms are the paths an Echo answers.
var EchoForms = []string{"raw", "gzip", "gzip-always", "json", "json-u", "percent", "basic", "html", "range", "trailer", "location", "reason", "early"}

// NewEcho starts an Echo of header on 127.0.0.1, closed when the test ends.
func NewEcho(t testing.TB, header string) *Echo {
	t.Helper()
	e := &Echo{Header: header}
	srv := httptest.NewServer(http.HandlerFunc(e.serve))
	t.Cleanup(srv.Close)
	e.URL = srv.URL
	return e
}

func (e *Echo) serve(w http.ResponseWriter, r *http.Request) {
	v := r.Header.Get(e.Header)
	form := r.URL.Path[strings.LastIndex(r.URL.Path, "/")+1:]
	text := func(s string) {
		w.Header().Set("Content-Type", "text/plain")
		fmt.Fprint(w, s)
	}
	gz := func(s string) {
		w.Header().Set("Content-Type", "text/plain")
		w.Header().Set("Content-Encoding", "gzip")
		zw := gzip.NewWriter(w)
		fmt.Fprint(zw, s)
		zw.Close()
	}
	switch form {
	case "raw":
		text("you sent: " + v)
	case "gzip":
		if strings.Contains(r.Header.Get("Accept-Encoding"), "gzip") {
			gz("you sent: " + v)
			return
		}
		text("you sent: " + v)
	case "gzip-always":
		gz("you sent: " + v)
	case "json", "json-u":
		echoJSON(w, form, v)
	case "percent":
		text("you sent: " + url.QueryEscape(v))
	case "basic":
		text("you sent: " + base64.StdEncoding.EncodeToString([]byte("user:"+v)))
	case "html":
		echoHTML(w, v)
	case "range":
		w.Header().Set("Content-Type", "text/plain")
		http.ServeContent(w, r, "", time.Unix(0, 0), strings.NewReader("you sent: "+v))
	case "trailer":
		w.Header().Set("Trailer", "X-Echo")
		w.Header().Set("Content-Type", "text/plain")
		w.WriteHeader(http.StatusOK)
		w.(http.Flusher).Flush()
		w.Header().Set("X-Echo", v)
	case "location":
		// Another port is another host: not followed.
		http.Redirect(w, r, "http://127.0.0.1:1/callback?token="+url.QueryEscape(v), http.StatusFound)
	case "reason":
		conn, buf, err := w.(http.Hijacker).Hijack()
		if err != nil {
			return
		}
		defer conn.Close()
		fmt.Fprintf(buf, "HTTP/1.1 400 Bad token %s\r\nContent-Length: 2\r\nConnection: close\r\n\r\nno", v)
		buf.Flush()
	case "early":
		w.Header().Set("Link", "</style.css?t="+v+">; rel=preload")
		w.WriteHeader(http.StatusEarlyHints)
		w.Header().Del("Link")
		text("ok")
	case "clean":
		text("nothing echoed")
	case "big":
		w.Header().Set("Content-Type", "application/json")
		w.Write(bigJSON)
	default:
		http.NotFound(w, r)
	}
}

// echoJSON writes the "json" form, every '/' escaped, or the "json-u" form,
// every character escaped.
func echoJSON(w http.ResponseWriter, form, v string) {
	b, _ := json.Marshal(map[string]string{"you_sent": v})
	if form == "json" {
		b = bytes.ReplaceAll(b, []byte("/"), []byte(`\/`))
	} else {
		var esc strings.Builder
		for _, c := range []byte(v) {
			fmt.Fprintf(&esc, `\u%04x`, c)
		}
		b = []byte(`{"you_sent":"` + esc.String() + `"}`)
	}
	w.Header().Set("Content-Type", "application/json")
	w.Write(b)
}

// echoHTML writes the "html" form: v's characters as character references,
// decimal and hex by turns.
func echoHTML(w http.ResponseWriter, v string) {
	var esc strings.Builder
	for i, c := range []byte(v) {
		if i%2 == 0 {
			fmt.Fprintf(&esc, "&#%d;", c)
		} else {
			fmt.Fprintf(&esc, "&#x%X;", c)
		}
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	fmt.Fprintf(w, "<p>You sent <code>%s</code></p>", esc.String())
}
