// Package testdeps knows the Debian packages the test suite needs and makes a
// test that needs a missing one fail, naming the package and the command that
// installs it, instead of passing by skipping.
//
// The list is one file, e2e/testdeps/packages (embedded here), also read by
// .ci/deps, which `go tool task test` and .ci/run run first: as root with
// apt-get it installs what is missing, otherwise it fails at once. A line per
// program: the program (a name looked up on PATH, or an absolute path), the
// Debian packages that provide it, and a comment saying what uses it.
//
// Skipping is opt-in: with `go test -short` a test whose program is missing
// skips; without -short it fails. The package lives under e2e because e2e is
// the home of the suite's real parts, and every test package may import it
// (the limiter's rule — only broker/api/v1 of the broker — is not touched).
package testdeps
