// Package wire is the contract between the agent and the runner that lives
// inside each sandbox: the framing of codemode.runner.v1 messages on the
// sandbox's attached stdin and stdout, the agent-side [Client], and the
// constants both sides must agree on (where the runner binary is mounted, the
// capabilities the container keeps, the uid user code runs as).
//
// # Framing
//
// Each message is a frame: a 4-byte big-endian length followed by that many
// bytes of a serialized protobuf message. The agent writes
// [runnerv1.Request] frames to the container's stdin; the runner writes
// [runnerv1.Event] frames to its stdout and nothing else (its diagnostics go
// to stderr). No frame is larger than [MaxFrameSize]. The container runs
// without a TTY, so the Docker attach stream multiplexes stdout and stderr;
// the agent demultiplexes it and hands the stdout side to [NewClient].
//
// # Protocol
//
// The runner sends a Ready event (id 0) once it can take requests. Every
// request carries an id chosen by the agent, unique on the stream, and every
// event that answers it carries the same id. The runner serves one request at
// a time: a Run answers with any number of stdout and stderr chunks and then
// exactly one Exit or Error; a Reset, WriteFile, ReadFile or ListFiles answers
// with exactly one Done, File, FileList or Error. A Cancel has no answer of its
// own: the run it names ends soon with its Exit. A request that arrives while
// another is being served (other than Cancel) is answered with an Error of
// code BUSY.
//
// A Reset answers Done once the sandbox is clean and, unless the runner was
// started with -prestart=false, once the interpreter of the next stateless
// run (the language of the last one; Python at first) is started and ready.
// The runner sends Ready only after the same. The table of languages both
// sides use is [Languages].
//
// # Notes for the container (measured under runsc)
//
//   - --pids-limit counts the gVisor kernel's host threads and stub
//     processes, not the sandbox's own processes (inside, pids.max reads
//     "max"). A fork bomb that pushes the sandbox kernel into the limit kills
//     the whole sandbox. The runner caps the user's processes and threads with
//     RLIMIT_NPROC (flag -max-user-procs, default 32); with that, a limit of
//     128 contains a fork bomb on a quiet host and 64 does not. With the
//     host's CPUs saturated the sandbox kernel runs more threads, and 128
//     once fell short; the agent's default is 256.
//   - Docker mounts --tmpfs noexec by default: add "exec" to the /workspace
//     options if user code may run files it writes (./script.sh, compiled
//     programs). The runner gives /workspace to [UserUID] itself at start, so
//     no uid= option is needed.
//   - Reaching the memory limit makes the host kill the whole sandbox
//     (runner gone; the container's State.OOMKilled is true). The runner
//     watches the sandbox's usage and kills the run a little before that
//     (limit minus max(limit/8, 24 MiB), or Run.memory_limit), reporting
//     oom_killed, so the sandbox usually survives.
//   - A run with stateful false has its leftover processes killed when it
//     ends; a session's runs should set stateful (in every language) to keep
//     background processes running between runs.
package wire

import "github.com/codemode-go/codemode/internal/limits"

// RunnerPath is where the agent bind-mounts the runner binary (read-only)
// inside every sandbox, and the sandbox's entrypoint.
const RunnerPath = "/opt/codemode/runner"

// RunnerCapabilities are the only capabilities the sandbox container keeps
// (cap-drop ALL, then cap-add these). The runner runs as root and needs them
// to start user code as [UserUID] (SETUID, SETGID), to kill every process of
// that uid (KILL), and to manage files that user code owns in /workspace,
// /tmp and /dev/shm (CHOWN, DAC_OVERRIDE, FOWNER). User code runs under
// another uid, so it holds none of them.
//
// Treat it as a constant: callers must not modify it.
var RunnerCapabilities = []string{
	"CAP_CHOWN",
	"CAP_DAC_OVERRIDE",
	"CAP_FOWNER",
	"CAP_KILL",
	"CAP_SETGID",
	"CAP_SETUID",
}

// UserUID and UserGID are the uid and gid that user code runs as ("nobody"
// and "nogroup" in the Debian image). The runner itself runs as uid 0.
const (
	UserUID = 65534
	UserGID = 65534
)

// ParentUID is the real and saved uid of the runner's preloaded parent (see
// the runner's preload.go), a uid of its own that no file or other process
// in the image has: user code, whose uids are all UserUID, can neither
// signal nor trace it.
const ParentUID = 65533

// Workspace is the working directory of user code and the directory that
// file paths in requests are relative to. The agent mounts a tmpfs there.
const Workspace = "/workspace"

// MaxFileSize is the largest file content that WriteFile takes, that a Run
// may carry per file, and that ReadFile returns.
const MaxFileSize = limits.MaxFileBytes

// OutputsDir is the directory of the workspace (relative to [Workspace])
// whose files a run returns as artifacts: the runner creates it, owned by
// [UserUID], before every run, and reports in the run's Exit the regular
// files in it that are new or changed, at most [MaxArtifacts] of them and
// [MaxArtifactBytes] of content in all.
const OutputsDir = "outputs"

// Limits of a run's artifacts. MaxArtifactBytes leaves an Exit well within
// [MaxFrameSize].
const (
	MaxArtifacts     = 64
	MaxArtifactBytes = 4 << 20
)

// UserLib is a directory, on a small tmpfs of its own that the agent
// mounts, where the runner writes the modules it lends user code: a
// matplotlib backend whose plt.show() saves figures into [OutputsDir] (the
// directory is on PYTHONPATH), and a Node.js preload that sends fetch()
// through the egress proxy (in NODE_OPTIONS). The runner makes it root's,
// mode 0755, before any user code runs; without it, user code runs without
// them. Its subdirectory matplotlib is the user's: MPLCONFIGDIR, made again
// from the image's font list at every reset.
const UserLib = "/opt/codemode/lib"
