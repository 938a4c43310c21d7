// Package apistest serves a fake of the GitHub REST API endpoints that the
// shipped declaration (internal/apicatalog/github.json) calls, on loopback, for
// tests of the API tools. Its answers have the shape of GitHub's.
//
// Users it knows:
//
//   - octocat: two repositories, three pull requests (one of them closed)
//     and two issues;
//   - many: as many repositories as per_page asks (up to 100), with long
//     descriptions, to fill answers;
//   - echo: one repository whose description is the Authorization header
//     the fake received, as an API that echoes its input would;
//   - anyone else: 404 with GitHub's error body.
//
// It also serves [Echo], an API that echoes a credential back in the
// forms an API may write it in, for tests of redaction.
package apistest

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
)

// Request is a request the fake received.
type Request struct {
	Method string
	Path   string
	Query  url.Values
	Header http.Header
}

// GitHub is the fake.
type GitHub struct {
	// URL is its base URL, http://127.0.0.1:PORT.
	URL string

	mu       sync.Mutex
	requests []Request
}

// NewGitHub starts a fake on 127.0.0.1, closed when the test ends.
func NewGitHub(t testing.TB) *GitHub {
	t.Helper()
	g := &GitHub{}
	srv := httptest.NewServer(http.HandlerFunc(g.serve))
	t.Cleanup(srv.Close)
	g.URL = srv.URL
	return g
}

// Requests returns the requests received so far.
func (g *GitHub) Requests() []Request {
	g.mu.Lock()
	defer g.mu.Unlock()
	return append([]Request(nil), g.requests...)
}

func (g *GitHub) serve(w http.ResponseWriter, r *http.Request) {
	g.mu.Lock()
	g.requests = append(g.requests, Request{Method: r.Method, Path: r.URL.Path, Query: r.URL.Query(), Header: r.Header.Clone()})
	g.mu.Unlock()
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	w.Header().Set("X-GitHub-Api-Version-Selected", "2022-11-28")
	if r.Method != http.MethodGet {
		notFound(w)
		return
	}
	perPage := 30
	if n, err := strconv.Atoi(r.URL.Query().Get("per_page")); err == nil && n > 0 {
		perPage = min(n, 100)
	}
	switch parts := strings.Split(strings.Trim(r.URL.Path, "/"), "/"); {
	case len(parts) == 3 && parts[0] == "users" && parts[2] == "repos":
		repos, ok := userRepos(parts[1], perPage, r.Header.Get("Authorization"))
		if !ok {
			notFound(w)
			return
		}
		writeJSON(w, repos)
	case len(parts) == 2 && parts[0] == "search" && parts[1] == "issues":
		items, err := search(r.URL.Query().Get("q"))
		if err != nil {
			w.WriteHeader(http.StatusUnprocessableEntity)
			writeJSON(w, map[string]any{"message": "Validation Failed", "errors": []map[string]string{{"message": err.Error(), "resource": "Search", "field": "q", "code": "invalid"}},
				"documentation_url": "https://docs.github.com/v3/search/", "status": "422"})
			return
		}
		writeJSON(w, map[string]any{"total_count": len(items), "incomplete_results": false, "items": items[:min(len(items), perPage)]})
	default:
		notFound(w)
	}
}

func notFound(w http.ResponseWriter) {
	w.WriteHeader(http.StatusNotFound)
	writeJSON(w, map[string]string{"message": "Not Found", "documentation_url": "https://docs.github.com/rest", "status": "404"})
}

func writeJSON(w http.ResponseWriter, v any) {
	b, _ := json.Marshal(v)
	_, _ = w.Write(b)
}

func owner(login string, id int) map[string]any {
	return map[string]any{"login": login, "id": id, "type": "User", "site_admin": false,
		"html_url": "https://github.com/" + login, "avatar_url": fmt.Sprintf("https://avatars.githubusercontent.com/u/%d?v=4", id)}
}

func repo(login string, id int, name, description, language string, stars int) map[string]any {
	full := login + "/" + name
	return map[string]any{
		"id": id, "node_id": fmt.Sprintf("MDEwOlJlcG9zaXRvcnk%d", id), "name": name, "full_name": full,
		"private": false, "owner": owner(login, 583231), "html_url": "https://github.com/" + full,
		"description": description, "fork": false, "url": "https://api.github.com/repos/" + full,
		"created_at": "2011-01-26T19:01:12Z", "updated_at": "2026-11-30T10:02:41Z", "pushed_at": "2026-11-29T17:44:03Z",
		"homepage": "", "size": 108, "stargazers_count": stars, "watchers_count": stars, "language": language,
		"forks_count": stars / 4, "open_issues_count": 3, "default_branch": "master", "visibility": "public",
		"topics": []string{}, "archived": false, "license": map[string]any{"key": "mit", "name": "MIT License", "spdx_id": "MIT"},
	}
}

func userRepos(login string, perPage int, authorization string) ([]map[string]any, bool) {
	switch login {
	case "octocat":
		return []map[string]any{
			repo("octocat", 1296269, "Hello-World", "My first repository on GitHub!", "", 2930),
			repo("octocat", 132935648, "boysenberry-repo-1", "Testing", "", 312),
		}, true
	case "many":
		var out []map[string]any
		for i := range perPage {
			out = append(out, repo("many", 1000+i, fmt.Sprintf("repo-%03d", i), strings.Repeat("a long description, ", 100), "Go", i))
		}
		return out, true
	case "echo":
		return []map[string]any{repo("echo", 7, "echo", "you sent: "+authorization, "", 0)}, true
	}
	return nil, false
}

func issue(login, repoName string, number int, title, state string, pr bool) map[string]any {
	full := "octo-org/" + repoName
	it := map[string]any{
		"url":            fmt.Sprintf("https://api.github.com/repos/%s/issues/%d", full, number),
		"repository_url": "https://api.github.com/repos/" + full,
		"html_url":       fmt.Sprintf("https://github.com/%s/issues/%d", full, number),
		"id":             2000000 + number, "number": number, "title": title, "state": state,
		"user": owner(login, 583231), "labels": []any{}, "comments": 2, "locked": false,
		"created_at": "2026-10-01T09:00:00Z", "updated_at": "2026-11-01T09:00:00Z", "closed_at": nil,
		"author_association": "CONTRIBUTOR", "body": "Steps to reproduce: ...", "score": 1.0,
	}
	if state == "closed" {
		it["closed_at"] = "2026-11-01T09:00:00Z"
	}
	if pr {
		it["html_url"] = fmt.Sprintf("https://github.com/%s/pull/%d", full, number)
		it["pull_request"] = map[string]any{
			"url":      fmt.Sprintf("https://api.github.com/repos/%s/pulls/%d", full, number),
			"html_url": fmt.Sprintf("https://github.com/%s/pull/%d", full, number),
			"merged_at": func() any {
				if state == "closed" {
					return "2026-11-01T09:00:00Z"
				}
				return nil
			}(),
		}
	}
	return it
}

// search answers the qualifiers the shipped tools send: type:pr or
// type:issue, author:LOGIN, and optionally is:closed.
func search(q string) ([]map[string]any, error) {
	var kind, author string
	closed := false
	for _, f := range strings.Fields(q) {
		switch {
		case f == "type:pr" || f == "type:issue":
			kind = strings.TrimPrefix(f, "type:")
		case strings.HasPrefix(f, "author:"):
			author = strings.TrimPrefix(f, "author:")
		case f == "is:closed":
			closed = true
		default:
			return nil, fmt.Errorf("the fake does not know the qualifier %q", f)
		}
	}
	if kind == "" || author == "" {
		return nil, fmt.Errorf("want type: and author: in %q", q)
	}
	var all []map[string]any
	if author == "octocat" {
		if kind == "pr" {
			all = []map[string]any{
				issue(author, "widgets", 41, "Add a widget cache", "open", true),
				issue(author, "widgets", 37, "Fix the gear ratio", "closed", true),
				issue(author, "docs", 12, "Document the API", "open", true),
			}
		} else {
			all = []map[string]any{
				issue(author, "widgets", 40, "Widgets spin backwards", "open", false),
				issue(author, "docs", 9, "Broken link on the front page", "closed", false),
			}
		}
	}
	var out []map[string]any
	for _, it := range all {
		if !closed || it["state"] == "closed" {
			out = append(out, it)
		}
	}
	if out == nil {
		out = []map[string]any{}
	}
	return out, nil
}
