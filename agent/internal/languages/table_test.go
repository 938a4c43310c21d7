package languages

import (
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// languageName is the form the protos allow for a language name.
var languageName = regexp.MustCompile(`^[a-z][a-z0-9+_.-]{0,31}$`)

func TestLanguages(t *testing.T) {
	seen := map[string]string{} // name or alias -> language
	for _, l := range All() {
		for _, n := range append([]string{l.Name}, l.Aliases...) {
			if other, ok := seen[n]; ok {
				t.Errorf("%q names both %s and %s", n, other, l.Name)
			}
			seen[n] = l.Name
			if !languageName.MatchString(n) {
				t.Errorf("%q does not match the protos' rule for language names", n)
			}
			got, ok := Lookup(n)
			if !ok || got.Name != l.Name {
				t.Errorf("Lookup(%q) = %q, %v; want %q", n, got.Name, ok, l.Name)
			}
		}
		if l.Interpreter == "" || l.File == "" || len(l.FDArgs) == 0 || len(l.Version) == 0 {
			t.Errorf("language %q is incomplete: %+v", l.Name, l)
		}
		if l.Kernel != nil && l.Shell {
			t.Errorf("language %q has both a kernel and a shell session", l.Name)
		}
	}
	for _, name := range []string{"python", "bash", "sh", "javascript", "c", "cpp", "ruby", "perl", "php", "lua"} {
		if seen[name] != name {
			t.Errorf("language %q missing", name)
		}
	}
	for _, name := range []string{"", "Python", "cobol", "python4"} {
		if _, ok := Lookup(name); ok {
			t.Errorf("Lookup(%q) found a language", name)
		}
	}
	if l, ok := Lookup(Default); !ok || l.Name != Default {
		t.Errorf("the default language %q is not in the table", Default)
	}
	// Callers cannot change the table through what they are given.
	All()[0].Name = "changed"
	if All()[0].Name == "changed" {
		t.Error("Languages returned the table itself")
	}
}

func TestPreloadList(t *testing.T) {
	py, _ := Lookup("python")
	for _, tc := range []struct {
		in   string
		want []string
	}{
		{"", nil},
		{" none ", nil},
		{"default", py.Preload},
		{" numpy, pandas ,,matplotlib.pyplot", []string{"numpy", "pandas", "matplotlib.pyplot"}},
		{"os;print(1),1abc,a..b,json", []string{"json"}},
	} {
		if got := PreloadList(tc.in); !slices.Equal(got, tc.want) {
			t.Errorf("PreloadList(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
	if !slices.Contains(py.Preload, "pandas") || py.Parent == nil || py.Prestart == nil {
		t.Errorf("python's entry: Preload %q, Parent set %v", py.Preload, py.Parent != nil)
	}
}

// TestDocsNameEveryLanguage keeps the README's first paragraph and the
// table in docs/sandbox.md in step with the table: a language added here
// must be named there, with its aliases.
func TestDocsNameEveryLanguage(t *testing.T) {
	readme, err := os.ReadFile("../../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	intro, _, _ := strings.Cut(string(readme), "\n\n```")
	sandbox, err := os.ReadFile("../../../docs/sandbox.md")
	if err != nil {
		t.Fatal(err)
	}
	display := map[string]string{"python": "Python", "javascript": "JavaScript", "bash": "bash", "sh": "sh",
		"c": "C", "cpp": "C++", "ruby": "Ruby", "perl": "Perl", "php": "PHP", "lua": "Lua"}
	for _, l := range All() {
		d, ok := display[l.Name]
		if !ok {
			t.Errorf("language %q: add it to the README's first paragraph and to this test", l.Name)
			continue
		}
		if !regexp.MustCompile(`(^|[\s(,])` + regexp.QuoteMeta(d) + `([\s,:)]|$)`).MatchString(intro) {
			t.Errorf("README's first paragraph does not name %s", d)
		}
		row := "| `" + l.Name + "` |"
		for _, a := range l.Aliases {
			row += " `" + a + "`,"
		}
		row = strings.TrimSuffix(row, ",") + " |"
		if len(l.Aliases) == 0 {
			row = "| `" + l.Name + "` | |"
		}
		if !strings.Contains(string(sandbox), row) {
			t.Errorf("docs/sandbox.md's table has no row starting %q", row)
		}
	}
}
func TestNamesModule(t *testing.T) {
	mods := []string{"numpy", "pandas", "matplotlib.pyplot"}
	for code, want := range map[string]bool{
		"print(1)":                          false,
		"import pandas as pd":               true,
		"from matplotlib import pyplot":     true,
		"import numpyx, mynumpy, numpy_ext": false,
		"x = 1\nimport os, numpy":           true,
		"pandas":                            true,
		"print('matplotlib.pyplot')":        true,
		"":                                  false,
	} {
		if got := NamesModule(code, mods); got != want {
			t.Errorf("NamesModule(%q) = %v, want %v", code, got, want)
		}
	}
}

func TestImportsOnly(t *testing.T) {
	names := map[string]bool{"numpy": true, "os": true, "json": true, "math": true}
	for code, want := range map[string]bool{
		"print(1)":                                         true,
		"import numpy as np\nprint(np.pi)":                 true,
		"import numpy as np, json\nimport os.path":         true,
		"from numpy.linalg import eig, (norm)":             true,
		"from numpy import (\n    linalg,\n    random,\n)": true,
		"def f():\n    import math; import os\n":           true,
		"import numpy as np\nimport pandas as pd":          false,
		"import numpy, scipy":                              false,
		"from scipy import stats":                          false,
		"if True: import seaborn":                          false,
		"import numpy\nfrom . import local":                false,
		"from .local import thing":                         false,
		"import numpy\nmod = __import__('pandas')":         false,
		"import importlib\nimportlib.import_module('x')":   false,
		"import numpy\n# import the data next":             false, // "the": erring towards false
		"import numpyx":                                    false,
	} {
		if got := ImportsOnly(code, names); got != want {
			t.Errorf("ImportsOnly(%q) = %v, want %v", code, got, want)
		}
	}
}

func TestLightList(t *testing.T) {
	py, _ := Lookup("python")
	for _, tc := range []struct {
		preload, want []string
	}{
		{py.Preload, []string{"requests", "numpy"}},
		{[]string{"numpy"}, nil},             // no smaller than the parent
		{[]string{"requests", "numpy"}, nil}, // no smaller either
		{[]string{"pandas", "scipy"}, nil},   // none of PreloadLight
		{[]string{"requests", "pandas"}, []string{"requests"}},
		{[]string{"pandas", "numpy", "requests"}, []string{"requests", "numpy"}}, // in PreloadLight's order
		{nil, nil},
	} {
		if got := LightList(py, tc.preload); !slices.Equal(got, tc.want) {
			t.Errorf("LightList(%q) = %q, want %q", tc.preload, got, tc.want)
		}
	}
}
