package docs

import (
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// root is the repository's root: this file's directory's parent.
func root(t *testing.T) string {
	t.Helper()
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		t.Fatal("no caller information")
	}
	return filepath.Dir(filepath.Dir(file))
}

// pages are the pages whose links must resolve, relative to the root.
func pages(t *testing.T) []string {
	t.Helper()
	md, err := filepath.Glob(filepath.Join(root(t), "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	if len(md) == 0 {
		t.Fatal("no docs/*.md")
	}
	out := []string{"README.md", filepath.Join(".github", "SECURITY.md")}
	for _, m := range md {
		out = append(out, filepath.Join("docs", filepath.Base(m)))
	}
	return out
}

func read(t *testing.T, rel string) Page {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root(t), rel))
	if err != nil {
		t.Fatal(err)
	}
	return Parse(string(b))
}

// TestLinks checks that every relative link and #anchor in README.md,
// docs/*.md and .github/SECURITY.md names a file or directory that exists
// and, for a Markdown file, a heading it has (by GitHub's anchors).
func TestLinks(t *testing.T) {
	r := root(t)
	anchors := map[string]map[string]bool{}
	anchorsOf := func(rel string) map[string]bool {
		if a, ok := anchors[rel]; ok {
			return a
		}
		a := map[string]bool{}
		for _, h := range read(t, rel).Headings() {
			a[h.Anchor] = true
		}
		anchors[rel] = a
		return a
	}
	checked := 0
	for _, page := range pages(t) {
		for _, l := range read(t, page).Links() {
			target := l.Target
			if strings.HasPrefix(target, "http://") || strings.HasPrefix(target, "https://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			checked++
			path, frag, _ := strings.Cut(target, "#")
			rel := page
			if path != "" {
				rel = filepath.Join(filepath.Dir(page), path)
				if strings.HasPrefix(rel, "..") || filepath.IsAbs(path) {
					t.Errorf("%s:%d: link %q leaves the repository", page, l.N, target)
					continue
				}
				if _, err := os.Stat(filepath.Join(r, rel)); err != nil {
					t.Errorf("%s:%d: link %q: %v", page, l.N, target, err)
					continue
				}
			}
			if frag == "" {
				continue
			}
			if !strings.HasSuffix(rel, ".md") {
				t.Errorf("%s:%d: link %q has an anchor into a file that is not Markdown", page, l.N, target)
				continue
			}
			if !anchorsOf(rel)[frag] {
				t.Errorf("%s:%d: link %q: %s has no heading with anchor #%s", page, l.N, target, rel, frag)
			}
		}
	}
	if checked == 0 {
		t.Fatal("no relative links found: the parser is broken")
	}
}

// firstScreen is how many lines of the README a newcomer sees first.
const firstScreen = 60

// TestReadmeFirstScreen checks the README's shape: under 300 lines, and its
// first screen holds the two set-up commands, the whole quick start (with
// its shell blocks and the playground's URL) and the table of contents.
func TestReadmeFirstScreen(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(root(t), "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(b), "\n"); n >= 300 {
		t.Errorf("README.md has %d lines, want fewer than 300 (the rest belongs in docs/)", n)
	}
	p := Parse(string(b))
	setUp := false
	for _, blk := range p.Shell() {
		if blk.N < firstScreen && strings.Contains(blk.Text, "make up") && strings.Contains(blk.Text, "make test") {
			setUp = true
		}
	}
	if !setUp {
		t.Errorf("no shell block with `make up` and `make test` in the first %d lines", firstScreen)
	}
	for _, anchor := range []string{"quick-start", "contents"} {
		sec, first, last, ok := p.Section(anchor)
		if !ok {
			t.Errorf("README.md has no heading #%s", anchor)
			continue
		}
		if last > firstScreen {
			t.Errorf("README.md's #%s spans lines %d-%d, want it within the first %d", anchor, first, last, firstScreen)
		}
		if anchor == "quick-start" {
			qs := QuickStart(sec)
			if len(qs.Shell) == 0 || qs.Playground == "" {
				t.Errorf("the quick start has %d shell blocks and playground %q, want both", len(qs.Shell), qs.Playground)
			}
			all := ""
			for _, blk := range qs.Shell {
				all += blk.Text + "\n"
			}
			for _, want := range []string{"curl ", "claude mcp add --transport http ", "mcp-stdio", "claude mcp list", "@modelcontextprotocol/inspector"} {
				if !strings.Contains(all, want) {
					t.Errorf("the quick start's shell blocks lack %q", want)
				}
			}
		}
	}
}

// TestAnchor pins GitHub's anchors for the kinds of headings the pages use.
func TestAnchor(t *testing.T) {
	for heading, want := range map[string]string{
		"Quick start": "quick-start",
		"gRPC (grpcurl or buf curl, through server reflection)": "grpc-grpcurl-or-buf-curl-through-server-reflection",
		"The same APIs from code on `/mcp`: egress":             "the-same-apis-from-code-on-mcp-egress",
		"`POST /run` and `GET /status`":                         "post-run-and-get-status",
		"Direct API tools on `/mcp-no-code-execute`":            "direct-api-tools-on-mcp-no-code-execute",
		"Deploying across hosts":                                "deploying-across-hosts",
		"`make up-cluster`":                                     "make-up-cluster",
	} {
		if got := Anchor(heading); got != want {
			t.Errorf("Anchor(%q) = %q, want %q", heading, got, want)
		}
	}
}
