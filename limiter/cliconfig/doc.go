// Package cliconfig is the command-line configuration shared by gpubroker's
// binaries (gpubroker, gpubroker-dev and gpubroker-agent): the flag table
// each of them declares its settings in, and the Redis and Kubernetes
// clients built from those settings.
//
// Why here: the broker and the node agent must read Redis and Kubernetes
// settings the same way (one URL or Sentinel, a password file, context
// deadlines that reach the socket, kubeconfig or in-cluster, the client rate
// limit), and the limiter may import nothing of the broker but broker/api/v1.
// A package under limiter/ that imports nothing of the broker is importable
// by both, as limiter/agent/agentstore already is. It holds no policy of
// either binary: each one declares its own table.
//
// The flag table. Each setting is one Flag: name, environment twin, default,
// help text and validation, bound to a field of the binary's configuration.
// That one declaration drives
//   - parsing: Table.Load sets the defaults, then each flag's environment
//     variable (EnvPrefix + the name in upper case with '_' for '-'), then the
//     command line; a flag given on the command line wins and its variable is
//     not even parsed, so a bad variable under a good flag is quiet;
//   - --help (Table.Usage), validation (Table.Validate), the configuration's
//     log line with secrets redacted (Table.LogValue) and the README's
//     configuration table (Table.Markdown; each binary has a test that the
//     README equals it).
//
// Load tells the whole truth at once: every unknown flag (with the closest
// name), every value that does not parse (naming the form it wants), every
// bad environment value, every failed check, in one joined error, one line
// each, with flag names written --name. Variables under EnvPrefix that no
// flag reads are warnings, with the closest name: a misspelled variable is
// otherwise silently ignored.
//
// Invariants: the package reads no environment itself (callers pass
// os.Environ()); validation only stats files; secrets are read from files,
// into Secret, which never prints.
package cliconfig
