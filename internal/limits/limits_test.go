package limits_test

import (
	"bufio"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"buf.build/gen/go/bufbuild/protovalidate/protocolbuffers/go/buf/validate"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"

	_ "github.com/codemode-go/codemode/gen/codemode/agent/v1"
	_ "github.com/codemode-go/codemode/gen/codemode/controlplane/v1"
	_ "github.com/codemode-go/codemode/gen/codemode/edge/v1"
	_ "github.com/codemode-go/codemode/gen/codemode/execution/v1"
	_ "github.com/codemode-go/codemode/gen/codemode/policy/v1"
	_ "github.com/codemode-go/codemode/gen/codemode/runner/v1"
	"github.com/codemode-go/codemode/internal/limits"
)

// repoRoot is the module's root, two levels above this package.
func repoRoot(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		t.Fatalf("no go.mod at %s: %v", root, err)
	}
	return root
}

// literals are the spellings of this package's facts that must not be
// written anywhere else in the Go sources (tests and generated code aside).
// Each is precise: it names the fact as well as its value, so that another
// fact that happens to share a number (a 30 s idle-connection timeout, a
// 1 MiB scanner buffer) is not taken for it.
var literals = []struct {
	fact string
	re   *regexp.Regexp
}{
	{"the sandbox image", regexp.MustCompile(regexp.QuoteMeta(`codemode-sandbox:bookworm`))},
	{"the language-name rule", regexp.MustCompile(regexp.QuoteMeta(`[a-z0-9+_.-]{0,31}`))},
	{"the unknown-language message", regexp.MustCompile(`valid languages are`)},
	{"the code size", regexp.MustCompile(`\b262144\b|\b256 ?<< ?10\b|\b256 ?\* ?1024\b`)},
	{"the stdin size", regexp.MustCompile(`(?i)\bmax\w*stdin\w*\s*(=|:)\s*[0-9]`)},
	{"a run's default or longest timeout", regexp.MustCompile(`(?i)\b(default|max)(run)?timeout\s*(=|:)\s*([0-9(]|time\.)`)},
	{"a run's output limit", regexp.MustCompile(`(?i)\b(default|max)output(limit|bytes)?\s*(=|:)\s*[0-9(]`)},
	{"a sandbox's memory", regexp.MustCompile(`(?i)\b(default|max|min)?memory(bytes)?\s*(=|:)\s*[0-9]+ ?<<`)},
	{"a session's idle timeout", regexp.MustCompile(`(?i)\b(default|max)?session\w*idle\w*\s*(=|:)\s*[0-9]`)},
	{"the file size", regexp.MustCompile(`(?i)\bmax\w*file\w*(size|bytes)\s*(=|:)\s*[0-9]`)},
	{"the queue timeout", regexp.MustCompile(`(?i)(\bqueue\w*timeout\s*(=|:)|"queue-timeout",)\s*[0-9]`)},
}

// otherFacts are lines that match a spelling above but state another fact.
// Keyed by path and the matched line's text, trimmed.
var otherFacts = map[string]string{
	// The timeout of one call of a direct API tool, not of a run.
	"edge/internal/directtools/directtools.go\tDefaultTimeout = 30 * time.Second": "a direct tool call's timeout",
	// The response size of one direct API tool call, not a run's output.
	"edge/internal/directtools/directtools.go\tDefaultMaxResponseBytes = 1 << 20": "a direct tool call's response",
}

// TestNoLiteralsOutsideLimits checks that the facts of this package are
// written nowhere else in the Go sources: services read them from here.
func TestNoLiteralsOutsideLimits(t *testing.T) {
	t.Parallel()
	root := repoRoot(t)
	self := filepath.Join(root, "internal", "limits")
	var found []string
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			switch d.Name() {
			case ".git", "gen", "node_modules", "testdata":
				return filepath.SkipDir
			}
			if path == self {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		rel, _ := filepath.Rel(root, path)
		hits, err := scan(path, rel)
		found = append(found, hits...)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range found {
		t.Error(f)
	}
}

// scan returns the lines of the file at path that spell one of the facts.
func scan(path, rel string) ([]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var hits []string
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		if n == 1 && strings.HasPrefix(line, "// Code generated") {
			return nil, nil
		}
		for _, l := range literals {
			m := l.re.FindStringIndex(line)
			if m == nil {
				continue
			}
			if _, ok := otherFacts[filepath.ToSlash(rel)+"\t"+strings.TrimSpace(line)]; ok {
				continue
			}
			hits = append(hits, fmt.Sprintf("%s:%d: %s written as a literal (use package limits): %s", rel, n, l.fact, strings.TrimSpace(line)))
		}
	}
	return hits, sc.Err()
}

// TestLiteralScanFindsCopies checks the spellings against copies as they
// were written before this package held them, so that the scan above
// cannot pass by matching nothing.
func TestLiteralScanFindsCopies(t *testing.T) {
	t.Parallel()
	copies := []string{
		`		Image:             "codemode-sandbox:bookworm",`,
		`    (buf.validate.field).string = {pattern: "^[a-z][a-z0-9+_.-]{0,31}$"}`,
		`return fmt.Errorf("unknown language %q: valid languages are %s", name, names)`,
		`	maxCodeBytes       = 262144`,
		`	maxStdinBytes      = 1 << 20`,
		`	DefaultTimeout     = 30 * time.Second`,
		`	MaxTimeout         = time.Hour`,
		`		MaxTimeout:        300 * time.Second,`,
		`	DefaultRunTimeout       = 30 * time.Second`,
		`const defaultTimeout = 30 * time.Second`,
		`	DefaultOutputLimit = 16 << 20`,
		`		DefaultOutput:     1 << 20,`,
		`		Memory:            512 << 20,`,
		`		MaxMemory:         2 << 30,`,
		`const minMemory = 64 << 20`,
		`		MaxSessionIdleTTL: 24 * time.Hour,`,
		`const MaxFileSize = 4 << 20`,
		`		QueueTimeout:      30 * time.Second,`,
		`	f.DurationVar(&o.queue, "queue-timeout", 30*time.Second, "the agent's --queue-timeout")`,
	}
	for _, c := range copies {
		matched := false
		for _, l := range literals {
			matched = matched || l.re.MatchString(c)
		}
		if !matched {
			t.Errorf("no spelling matches %q", c)
		}
	}
}

// ruleCheck is one kind of field whose buf.validate rule states a fact of
// this package.
type ruleCheck struct {
	fact string
	// match reports whether the rule of field applies, and returns its value.
	value func(f protoreflect.FieldDescriptor, r *validate.FieldRules) (any, bool)
	want  any
	least int // fields expected to carry it, so that a rename cannot hide them
}

func durationOf(d interface {
	GetSeconds() int64
	GetNanos() int32
}) time.Duration {
	return time.Duration(d.GetSeconds())*time.Second + time.Duration(d.GetNanos())
}

var ruleChecks = []ruleCheck{
	{"language name rule", func(f protoreflect.FieldDescriptor, r *validate.FieldRules) (any, bool) {
		return r.GetString().GetPattern(), f.Name() == "language" && r.GetString().HasPattern()
	}, limits.LanguagePattern, 6},
	{"code size", func(f protoreflect.FieldDescriptor, r *validate.FieldRules) (any, bool) {
		return r.GetString().GetMaxBytes(), f.Name() == "code" && r.GetString().HasMaxBytes()
	}, uint64(limits.MaxCodeBytes), 3},
	{"stdin size", func(f protoreflect.FieldDescriptor, r *validate.FieldRules) (any, bool) {
		return r.GetBytes().GetMaxLen(), f.Name() == "stdin" && r.GetBytes().HasMaxLen()
	}, uint64(limits.MaxStdinBytes), 3},
	{"timeout ceiling", func(f protoreflect.FieldDescriptor, r *validate.FieldRules) (any, bool) {
		return durationOf(r.GetDuration().GetLte()), f.Name() == "timeout" && r.GetDuration().HasLte()
	}, limits.TimeoutCeiling, 3},
	{"session idle ceiling", func(f protoreflect.FieldDescriptor, r *validate.FieldRules) (any, bool) {
		return durationOf(r.GetDuration().GetLte()), f.Name() == "idle_timeout" && r.GetDuration().HasLte()
	}, limits.MaxSessionIdle, 3},
	{"memory ceiling", func(f protoreflect.FieldDescriptor, r *validate.FieldRules) (any, bool) {
		return r.GetUint64().GetLte(), f.FullName() == "codemode.execution.v1.Limits.memory_bytes"
	}, uint64(limits.MemoryCeiling), 1},
	{"output ceiling", func(f protoreflect.FieldDescriptor, r *validate.FieldRules) (any, bool) {
		return r.GetUint64().GetLte(), f.FullName() == "codemode.execution.v1.Limits.output_bytes"
	}, uint64(limits.OutputCeiling), 1},
	{"file size", func(f protoreflect.FieldDescriptor, r *validate.FieldRules) (any, bool) {
		return r.GetBytes().GetMaxLen(), f.FullName() == "codemode.execution.v1.File.content"
	}, uint64(limits.MaxFileBytes), 1},
	{"file size to read", func(f protoreflect.FieldDescriptor, r *validate.FieldRules) (any, bool) {
		return r.GetUint64().GetLte(), f.Name() == "max_bytes" && r.GetUint64().HasLte()
	}, uint64(limits.MaxFileBytes), 3},
	{"files of a run", func(f protoreflect.FieldDescriptor, r *validate.FieldRules) (any, bool) {
		return r.GetRepeated().GetMaxItems(), f.Name() == "files" && f.Message() != nil && f.Message().FullName() == "codemode.execution.v1.File" && r.GetRepeated().HasMaxItems()
	}, uint64(limits.MaxFiles), 3},
}

// TestProtoRulesAgree checks the protos' buf.validate rules against this
// package, through the generated descriptors.
func TestProtoRulesAgree(t *testing.T) {
	t.Parallel()
	counts := make([]int, len(ruleChecks))
	protoregistry.GlobalFiles.RangeFiles(func(fd protoreflect.FileDescriptor) bool {
		if !strings.HasPrefix(string(fd.Package()), "codemode.") {
			return true
		}
		eachField(fd.Messages(), func(f protoreflect.FieldDescriptor) {
			r, ok := proto.GetExtension(f.Options(), validate.E_Field).(*validate.FieldRules)
			if !ok || r == nil {
				return
			}
			for i, c := range ruleChecks {
				got, ok := c.value(f, r)
				if !ok {
					continue
				}
				counts[i]++
				if got != c.want {
					t.Errorf("%s (%s): the proto says %v, package limits %v", f.FullName(), c.fact, got, c.want)
				}
			}
		})
		return true
	})
	for i, c := range ruleChecks {
		if counts[i] < c.least {
			t.Errorf("%s: %d fields carry it, want at least %d (was a field renamed?)", c.fact, counts[i], c.least)
		}
	}
}

func eachField(msgs protoreflect.MessageDescriptors, fn func(protoreflect.FieldDescriptor)) {
	for i := range msgs.Len() {
		m := msgs.Get(i)
		for j := range m.Fields().Len() {
			fn(m.Fields().Get(j))
		}
		eachField(m.Messages(), fn)
	}
}

// commentChecks are the protos' comments that state a fact of this package:
// each regexp's groups are the numbers, want what they must be.
var commentChecks = []struct {
	fact string
	re   *regexp.Regexp
	want func(groups []int64) bool
}{
	{"code size", regexp.MustCompile(`code[^\n]*\b(\d+) KiB`), func(g []int64) bool { return g[0]<<10 == limits.MaxCodeBytes }},
	{"stdin size", regexp.MustCompile(`standard input, at most (\d+) MiB`), func(g []int64) bool { return g[0]<<20 == limits.MaxStdinBytes }},
	{"default and longest timeout", regexp.MustCompile(`(\d+) s and (\d+) s unless`), func(g []int64) bool {
		return time.Duration(g[0])*time.Second == limits.DefaultTimeout && time.Duration(g[1])*time.Second == limits.MaxTimeout
	}},
	{"file size", regexp.MustCompile(`the agent's maximum \((\d+) MiB\)`), func(g []int64) bool { return g[0]<<20 == limits.MaxFileBytes }},
}

// TestProtoCommentsAgree checks what the protos' comments say of the limits
// against this package.
func TestProtoCommentsAgree(t *testing.T) {
	t.Parallel()
	files, err := filepath.Glob(filepath.Join(repoRoot(t), "proto", "codemode", "*", "*", "*.proto"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no protos: %v", err)
	}
	seen := make([]int, len(commentChecks))
	for _, path := range files {
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(string(b), "\n") {
			comment, ok := strings.CutPrefix(strings.TrimSpace(line), "//")
			if !ok {
				continue
			}
			for i, c := range commentChecks {
				for _, m := range c.re.FindAllStringSubmatch(comment, -1) {
					seen[i]++
					var g []int64
					for _, s := range m[1:] {
						n, _ := strconv.ParseInt(s, 10, 64)
						g = append(g, n)
					}
					if !c.want(g) {
						t.Errorf("%s: comment %q disagrees with package limits on the %s", filepath.Base(path), strings.TrimSpace(comment), c.fact)
					}
				}
			}
		}
	}
	for i, c := range commentChecks {
		if seen[i] == 0 {
			t.Errorf("no proto comment states the %s (was it reworded? update commentChecks)", c.fact)
		}
	}
}

// TestUnknownLanguage checks the one message for a language the table
// lacks.
func TestUnknownLanguage(t *testing.T) {
	t.Parallel()
	got := limits.UnknownLanguage("cobol", []string{"python", "bash"}).Error()
	if want := `unknown language "cobol": valid languages are python, bash`; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
}

// TestNoDefaultLanguageOutsideTheAgents checks that the edge, the control
// plane and the shared packages do not name the default language in code:
// it is the agents' to say (Defaults.language), and they ask for it.
func TestNoDefaultLanguageOutsideTheAgents(t *testing.T) {
	t.Parallel()
	root := repoRoot(t)
	for _, dir := range []string{"edge/internal", "controlplane/internal", "internal"} {
		err := filepath.WalkDir(filepath.Join(root, dir), func(path string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
				return err
			}
			b, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			for n, line := range strings.Split(string(b), "\n") {
				if code, _, _ := strings.Cut(line, "//"); strings.Contains(code, `"python"`) {
					rel, _ := filepath.Rel(root, path)
					t.Errorf("%s:%d names the default language; use the agents' default: %s", rel, n+1, strings.TrimSpace(line))
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
}
