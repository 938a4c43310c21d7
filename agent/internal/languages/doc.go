// Package languages is codemode's one table of runnable languages: for each,
// its name and aliases, how the runner writes and runs its code, how its
// version is found, how sessions keep its state, the modules a preloaded
// parent imports, and the programs the runner starts inside the sandbox for
// it (the Python kernel of sessions, the prestart scripts and the preloaded
// parent). The agent accepts and reports the names in it; the control plane,
// the edge and its clients learn them from the agents.
package languages
