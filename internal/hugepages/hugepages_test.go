package hugepages

import "testing"

// What runsc makes of each setting: its loader (runsc/boot/loader.go) turns
// huge pages on for always, within_size and force, and for advise only with a
// defrag that does not compact directly, where it also commits them by
// writing (pgalloc's AllocateAndWritePopulate).
func TestSettings(t *testing.T) {
	for _, tc := range []struct {
		shmem, defrag        string
		sandboxes, writeComm bool
	}{
		{"never", "madvise", false, false},
		{"deny", "always", false, false},
		{"within_size", "madvise", true, false},
		{"always", "madvise", true, false},
		{"force", "never", true, false},
		{"advise", "madvise", false, false},
		{"advise", "defer+madvise", false, false},
		{"advise", "defer", true, true},
		{"advise", "always", true, true},
		{"advise", "never", true, true},
		{"?", "?", false, false},
	} {
		s := Settings{ShmemEnabled: tc.shmem, Defrag: tc.defrag}
		if got := s.Sandboxes(); got != tc.sandboxes {
			t.Errorf("%v: Sandboxes = %v, want %v", s, got, tc.sandboxes)
		}
		if got := s.WriteCommitted(); got != tc.writeComm {
			t.Errorf("%v: WriteCommitted = %v, want %v", s, got, tc.writeComm)
		}
	}
}

// A setting's file lists every value and brackets the selected one.
func TestSelected(t *testing.T) {
	for file, want := range map[string]string{
		"always within_size advise [never] deny force\n": "never",
		"always defer defer+madvise [madvise] never\n":   "madvise",
		"[always] madvise never\n":                       "always",
		"always madvise never\n":                         "?",
		"always [] never\n":                              "?",
		"":                                               "?",
	} {
		if got := selected(file); got != want {
			t.Errorf("selected(%q) = %q, want %q", file, got, want)
		}
	}
}
