package wire

import "testing"

func TestLanguages(t *testing.T) {
	seen := map[string]bool{}
	for _, l := range Languages() {
		if seen[l.Name] {
			t.Errorf("language %q listed twice", l.Name)
		}
		seen[l.Name] = true
		if l.Interpreter == "" || l.File == "" || len(l.CodeArgs) == 0 || len(l.FDArgs) == 0 {
			t.Errorf("language %q is incomplete: %+v", l.Name, l)
		}
		got, ok := LookupLanguage(l.Name)
		if !ok || got.Name != l.Name || got.Interpreter != l.Interpreter {
			t.Errorf("LookupLanguage(%q) = %+v, %v", l.Name, got, ok)
		}
	}
	for _, name := range []string{"python", "bash", "sh", "javascript"} {
		if !seen[name] {
			t.Errorf("language %q missing", name)
		}
	}
	for _, name := range []string{"", "Python", "python3", "cobol"} {
		if _, ok := LookupLanguage(name); ok {
			t.Errorf("LookupLanguage(%q) found a language", name)
		}
	}
	// Callers cannot change the table through what they are given.
	Languages()[0].Name = "changed"
	if Languages()[0].Name == "changed" {
		t.Error("Languages returned the table itself")
	}
}
