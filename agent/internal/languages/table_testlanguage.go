//go:build codemode_testlanguage

package languages

// A table entry that exists only in builds with the codemode_testlanguage
// tag, with which tests show that a language added to the table is run by
// the runner, listed by the agent and accepted by the edge, with no change
// to any proto or to the edge. It runs awk, which every Debian image has.
func init() {
	table = append(table, Language{
		Name: "awk", Aliases: []string{"mawk"},
		Interpreter: "awk", File: "main.awk",
		CodeArgs: []string{"--"},
		FDArgs:   []string{"-f", "/dev/fd/3"},
		Version:  []string{"sh", "-c", "awk -W version 2>&1 | head -n 1 | cut -d ' ' -f 2"},
	})
}
