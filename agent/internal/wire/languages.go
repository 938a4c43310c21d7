package wire

// Language is one runnable language. The table of them ([Languages]) is the
// one both sides read: the agent for the names it accepts and lists, the
// runner for how to start each interpreter.
type Language struct {
	// Name is what requests use (codemode.execution.v1.Execution.language).
	Name string
	// Interpreter is the program that runs the code, looked up on the
	// sandbox's PATH and never started through a shell.
	Interpreter string
	// File is the name the code would have as a file.
	File string
	// CodeArgs come between the interpreter and the code when the code is
	// passed as one argument: Interpreter, CodeArgs..., code.
	CodeArgs []string
	// FDArgs follow the interpreter to run code read from fd 3, for code
	// longer than one argument may be.
	FDArgs []string
	// Env is added to the environment of user code.
	Env []string
	// Version is the argv whose first line of output is the interpreter's
	// version (a leading "v" is dropped); nil: the runner finds it another
	// way or not at all.
	Version []string
}

// languages is the table. Treat its entries as constants.
var languages = [...]Language{
	{
		Name: "python", Interpreter: "python3", File: "main.py",
		CodeArgs: []string{"-c"},
		FDArgs:   []string{"/dev/fd/3"},
		// Unbuffered, so that output streams as it is printed.
		Env:     []string{"PYTHONUNBUFFERED=1"},
		Version: []string{"python3", "-I", "-S", "-c", "import sys; print('%d.%d.%d' % sys.version_info[:3])"},
	},
	{
		Name: "bash", Interpreter: "bash", File: "main.sh",
		CodeArgs: []string{"-c"},
		FDArgs:   []string{"/dev/fd/3"},
		Version:  []string{"bash", "-c", `echo "${BASH_VERSION%%(*}"`},
	},
	{
		// The runner reports which shell sh is (the target of /bin/sh).
		Name: "sh", Interpreter: "sh", File: "main.sh",
		CodeArgs: []string{"-c"},
		FDArgs:   []string{"/dev/fd/3"},
	},
	{
		Name: "javascript", Interpreter: "node", File: "main.js",
		CodeArgs: []string{"-e"},
		// node cannot load a script from a pipe by path; -e evaluates the
		// code read from fd 3 the way -e evaluates its argument.
		FDArgs:  []string{"-e", `require("vm").runInThisContext(require("fs").readFileSync(3, "utf8"), {filename: "[eval]"})`},
		Version: []string{"node", "--version"},
	},
}

// Languages returns the table of runnable languages, in the order they are
// listed to users.
func Languages() []Language { return append([]Language(nil), languages[:]...) }

// LookupLanguage returns the language called name.
func LookupLanguage(name string) (Language, bool) {
	for _, l := range languages {
		if l.Name == name {
			return l, true
		}
	}
	return Language{}, false
}
