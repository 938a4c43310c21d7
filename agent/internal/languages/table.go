package languages

import (
	_ "embed"
	"regexp"
	"slices"
	"strings"
)

// Language is one runnable language. The table of them ([All]) is the
// only list of languages in codemode: the runner reads it for how to run
// each, the agent for the names it accepts and reports (with aliases,
// versions and how sessions treat them), and everything upstream (control
// plane, edge, MCP tools, playground) learns the languages from the agents.
// Adding a language is one entry here plus its package in the sandbox image
// (agent/host/sandbox-packages).
type Language struct {
	// Name is what requests use (codemode.execution.v1.Execution.language)
	// and what policies see.
	Name string
	// Aliases are other names a request may use, for example "python3"
	// for "python". The edge turns them into Name before policies run.
	Aliases []string
	// Interpreter is the program the runner starts, looked up on the
	// sandbox's PATH and never started through a shell. For a compiled
	// language it is sh, running Build.
	Interpreter string
	// Requires is the program the language needs on PATH, when it is not
	// Interpreter (the compiler of a compiled language).
	Requires string
	// File is the name the code would have as a file; its extension is the
	// language's.
	File string
	// CodeArgs come between the interpreter and the code when the code is
	// passed as one argument: Interpreter, CodeArgs..., code. Without them
	// the code always goes on fd 3.
	CodeArgs []string
	// FDArgs follow the interpreter to run code read from fd 3, for code
	// longer than one argument may be.
	FDArgs []string
	// Env is added to the environment of user code.
	Env []string
	// Version is the argv whose first line of output is the interpreter's
	// version (a leading "v" is dropped).
	Version []string
	// Compiled says that a run compiles the code first, in the sandbox and
	// within the run's limits, then runs the program.
	Compiled bool
	// Prestart, if set, is the argv of an interpreter that waits for the
	// code of one stateless run on fd 3 (see the runner's prestart.go).
	Prestart []string
	// Preload are the modules a preloaded parent imports before it forks
	// the prestarted interpreters of stateless runs (see the runner's
	// preload.go), so that code importing them does not wait for the
	// imports; an agent flag replaces the list or empties it. Needs
	// Prestart and Parent.
	Preload []string
	// PreloadLight are the modules of Preload that a second, smaller
	// parent holds alone, forked from the first once it has imported them:
	// code that imports nothing else of Preload's, nor beyond the standard
	// library (ImportsOnly), is forked from it, whose children fork and end
	// at less cost (the runner's RATIONALE, "A smaller parent for numpy
	// and requests"). Imported first, in this order.
	PreloadLight []string
	// Parent is the argv of that preloaded parent (see zygote.py).
	Parent []string
	// ParentEnv is added to the environment the preloaded parent starts
	// with, and only to it: settings read once at an interpreter's start
	// (its memory allocator's), which the interpreters forked from it
	// inherit with its memory. The parent removes them from its environment
	// before its imports and its first fork, so that runs see Env alone.
	ParentEnv []string
	// PreloadProbe, given module names as further arguments, prints those
	// the image has, one per line: the runner that probes the versions
	// reports the others, which the parent will skip.
	PreloadProbe []string
	// Kernel, if set, is the argv of a resident interpreter that runs the
	// cells of a session in one namespace (see kernel.py).
	Kernel []string
	// Shell says that sessions carry the shell's working directory and
	// exported variables from one run to the next.
	Shell bool
}

// SessionState says what a session keeps between runs of l: "interpreter"
// (variables and imports), "shell" (working directory and exported
// variables) or "files" (only /workspace and background processes).
func (l Language) SessionState() string {
	switch {
	case l.Kernel != nil:
		return "interpreter"
	case l.Shell:
		return "shell"
	}
	return "files"
}

// Program is what the language needs on PATH.
func (l Language) Program() string {
	if l.Requires != "" {
		return l.Requires
	}
	return l.Interpreter
}

var (
	//go:embed prestart.py
	prestartPython string
	//go:embed prestart.js
	prestartNode string
	//go:embed kernel.py
	kernelPython string
	//go:embed zygote.py
	zygotePython string
)

// build returns the sh arguments that write the code (from $1, or from fd 3
// with fromFD) to a fresh directory under /tmp as file, run compile there
// (with "$d" the directory) and, if it succeeds, exec the program with fd 3
// closed. The directory lives in /tmp, which the reset after an unrelated
// run empties; the compiler's messages name the file, not the directory.
func build(file, compile string, fromFD bool) []string {
	write := `printf '%s' "$1" >` + file
	if fromFD {
		write = `cat <&3 >` + file
	}
	script := `set -e; d=$(mktemp -d); cd "$d"; ` + write + `; ` + compile + `; cd "$OLDPWD"; exec 3<&-; exec "$d/main"`
	if fromFD {
		return []string{"-c", script}
	}
	return []string{"-c", script, "sh"}
}

// Default is the language of a run or session that names none.
const Default = "python"

// PyArenaLib is where the sandbox image keeps the library that puts
// pymalloc's arenas in glibc's heap (agent/host/pyarena.c), which the
// Python parent's ParentEnv preloads.
const PyArenaLib = "/usr/lib/codemode/pyarena.so"

// languages is the table, in the order languages are listed to users.
// Treat its entries as constants.
var table = []Language{
	{
		Name: "python", Aliases: []string{"python3", "py"},
		Interpreter: "python3", File: "main.py",
		CodeArgs: []string{"-c"},
		FDArgs:   []string{"/dev/fd/3"},
		// Unbuffered, so that output streams as it is printed.
		Env:      []string{"PYTHONUNBUFFERED=1"},
		Version:  []string{"python3", "-I", "-S", "-c", "import sys; print('%d.%d.%d' % sys.version_info[:3])"},
		Prestart: []string{"python3", "-c", prestartPython},
		// What model-written code imports most; matplotlib.pyplot with the
		// runner's backend (MPLBACKEND). Modules the image lacks are
		// skipped, and said so in the log.
		Preload: []string{"numpy", "pandas", "matplotlib", "matplotlib.pyplot", "requests", "scipy"},
		// requests, what code mode's HTTP calls import, and numpy; requests
		// first, which leaves numpy's runs less of the parent to copy.
		PreloadLight: []string{"requests", "numpy"},
		// -s: no user site directory in a process that starts as root.
		Parent: []string{"python3", "-s", "-c", zygotePython},
		// pymalloc's arenas in glibc's heap (the image's pyarena.so, built
		// from agent/host/pyarena.c) rather than each its own mapping;
		// glibc mapping nothing under 32 MiB on its own (where its own
		// threshold ends up once such blocks are freed), so neither an
		// arena nor numpy's arrays; and the heap grown 64 MiB at a time.
		// Under gVisor a forked child then copies fewer and larger pieces
		// of its parent, and code that allocates much makes fewer system
		// calls (the runner's RATIONALE, "The parent's memory allocator").
		// An image without the library keeps mapped arenas.
		ParentEnv: []string{"LD_PRELOAD=" + PyArenaLib, "MALLOC_MMAP_THRESHOLD_=33554432", "MALLOC_TOP_PAD_=67108864"},
		// The top-level package only: finding matplotlib.pyplot's would
		// import matplotlib.
		PreloadProbe: []string{"python3", "-I", "-c", "import importlib.util as u, sys\nfor m in sys.argv[1:]:\n    if u.find_spec(m.partition('.')[0]) is not None:\n        print(m)"},
		Kernel:       []string{"python3", "-c", kernelPython},
	},
	{
		Name: "javascript", Aliases: []string{"js", "node", "nodejs"},
		Interpreter: "node", File: "main.js",
		CodeArgs: []string{"-e"},
		// node cannot load a script from a pipe by path; -e evaluates the
		// code read from fd 3 the way -e evaluates its argument.
		FDArgs:   []string{"-e", `require("vm").runInThisContext(require("fs").readFileSync(3, "utf8"), {filename: "[eval]"})`},
		Version:  []string{"node", "--version"},
		Prestart: []string{"node", "-e", prestartNode},
	},
	{
		Name: "bash", Interpreter: "bash", File: "main.sh",
		CodeArgs: []string{"-c"},
		FDArgs:   []string{"/dev/fd/3"},
		Version:  []string{"bash", "-c", `echo "${BASH_VERSION%%(*}"`},
		Shell:    true,
	},
	{
		// The version is the shell that sh is (the target of /bin/sh).
		Name: "sh", Interpreter: "sh", File: "main.sh",
		CodeArgs: []string{"-c"},
		FDArgs:   []string{"/dev/fd/3"},
		Version:  []string{"readlink", "/bin/sh"},
		Shell:    true,
	},
	{
		Name: "c", Interpreter: "sh", Requires: "gcc", File: "main.c",
		CodeArgs: build("main.c", "gcc -std=gnu17 -O2 -o main main.c -lm", false),
		FDArgs:   build("main.c", "gcc -std=gnu17 -O2 -o main main.c -lm", true),
		Version:  []string{"gcc", "-dumpfullversion"},
		Compiled: true,
	},
	{
		Name: "cpp", Aliases: []string{"c++"},
		Interpreter: "sh", Requires: "g++", File: "main.cpp",
		CodeArgs: build("main.cpp", "g++ -std=gnu++17 -O2 -o main main.cpp", false),
		FDArgs:   build("main.cpp", "g++ -std=gnu++17 -O2 -o main main.cpp", true),
		Version:  []string{"g++", "-dumpfullversion"},
		Compiled: true,
	},
	{
		Name: "ruby", Aliases: []string{"rb"},
		Interpreter: "ruby", File: "main.rb",
		CodeArgs: []string{"-e"},
		FDArgs:   []string{"/dev/fd/3"},
		Version:  []string{"ruby", "-e", "puts RUBY_VERSION"},
	},
	{
		Name: "perl", Aliases: []string{"pl"},
		Interpreter: "perl", File: "main.pl",
		CodeArgs: []string{"-e"},
		FDArgs:   []string{"/dev/fd/3"},
		Version:  []string{"perl", "-e", `printf "%vd\n", $^V`},
	},
	{
		Name: "php", Interpreter: "php", File: "main.php",
		// No CodeArgs: php runs the code as a script file, so that it
		// starts with "<?php" as users write it (php -r wants it without).
		FDArgs:  []string{"/dev/fd/3"},
		Version: []string{"php", "-r", "echo PHP_MAJOR_VERSION, '.', PHP_MINOR_VERSION, '.', PHP_RELEASE_VERSION, PHP_EOL;"},
	},
	{
		Name: "lua", Interpreter: "lua5.4", File: "main.lua",
		CodeArgs: []string{"-e"},
		FDArgs:   []string{"/dev/fd/3"},
		Version:  []string{"lua5.4", "-e", "print((_VERSION:gsub('Lua ', '')))"},
	},
}

// Languages returns the table of runnable languages, in the order they are
// listed to users.
func All() []Language { return slices.Clone(table) }

// Lookup returns the language called name, or with name as an
// alias.
func Lookup(name string) (Language, bool) {
	for _, l := range table {
		if l.Name == name || slices.Contains(l.Aliases, name) {
			return l, true
		}
	}
	return Language{}, false
}

// PreloadList parses a list of modules to preload: comma-separated names,
// "default" for the Python entry's Preload, or "none" (or empty) for none;
// "none" is how an environment variable, where empty means unset, says
// none. Names that are not dotted Python identifiers are dropped.
func PreloadList(v string) []string {
	switch strings.TrimSpace(v) {
	case "default":
		l, _ := Lookup(Default)
		return slices.Clone(l.Preload)
	case "none":
		return nil
	}
	var out []string
	for _, m := range strings.Split(v, ",") {
		if m = strings.TrimSpace(m); m != "" && moduleName(m) {
			out = append(out, m)
		}
	}
	return out
}

func moduleName(m string) bool {
	for _, part := range strings.Split(m, ".") {
		if part == "" || (part[0] >= '0' && part[0] <= '9') {
			return false
		}
		for _, c := range part {
			if !(c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9') {
				return false
			}
		}
	}
	return true
}

// Names returns the names of the table, in its order, for messages (see
// limits.UnknownLanguage).
func Names() []string {
	names := make([]string, len(table))
	for i, l := range table {
		names[i] = l.Name
	}
	return names
}

// NamesModule says whether code names one of modules' top-level packages as
// a word ("import pandas as pd", "from matplotlib import pyplot"): a guess,
// made before the code runs, of whether it imports them. A wrong guess
// costs time, not isolation.
func NamesModule(code string, modules []string) bool {
	for _, m := range modules {
		top, _, _ := strings.Cut(m, ".")
		for i := 0; ; {
			j := strings.Index(code[i:], top)
			if j < 0 {
				break
			}
			j += i
			end := j + len(top)
			if (j == 0 || !identByte(code[j-1])) && (end == len(code) || !identByte(code[end])) {
				return true
			}
			i = end
		}
	}
	return false
}

// LightList returns the modules of lang's PreloadLight that preload
// holds, nil if a smaller parent would hold no fewer than preload's.
func LightList(lang Language, preload []string) []string {
	var out []string
	for _, m := range lang.PreloadLight {
		if slices.Contains(preload, m) {
			out = append(out, m)
		}
	}
	if len(out) == len(preload) {
		return nil
	}
	return out
}

// importRE finds import statements: "from M import" (M in group 1) and
// "import M [as A], ..." (the list in group 2). It reads comments and
// strings too, which only finds more modules.
var importRE = regexp.MustCompile(`(?:^|[^\w.])(?:from\s+(\.*[\w.]*)\s+import\b|import\s+([\w.]+(?:\s+as\s+\w+)?(?:[ \t]*,[ \t]*[\w.]+(?:\s+as\s+\w+)?)*))`)

// ImportsOnly says whether every module that code's import statements name
// has its top-level package among names, and code imports nothing
// otherwise (__import__, importlib's import_module, a relative import): a
// guess, made before the code runs, that a parent holding names holds what
// code imports. Unlike NamesModule it errs towards false: a wrong true
// costs the imports the guess was to save.
func ImportsOnly(code string, names map[string]bool) bool {
	if strings.Contains(code, "__import__") || strings.Contains(code, "import_module") {
		return false
	}
	for _, m := range importRE.FindAllStringSubmatch(code, -1) {
		mods := []string{m[1]}
		if m[1] == "" {
			mods = strings.Split(m[2], ",")
		}
		for _, mod := range mods {
			f := strings.Fields(mod)
			if len(f) == 0 {
				return false
			}
			top, _, _ := strings.Cut(f[0], ".")
			if !names[top] {
				return false
			}
		}
	}
	return true
}

func identByte(c byte) bool {
	return c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
}
