// Package hook holds the Go-driven tests of libgpulimit.so, the in-pod
// limiter written in C in this directory (src/, include/), and of the stub
// driver (stub/) it is tested against.
//
// The C code is built by `go tool task limiter:build` (make -C limiter/hook)
// into build/, which is not committed; the tests run make themselves when the
// build is missing or stale, so `go test ./limiter/...` works on its own.
// They need gcc, libc6-dev and make; without them they fail, naming the
// packages (e2e/testdeps), and skip only under `go test -short`.
//
// Each test gets its own simulated device (GPUBROKER_STUB_STATE in a
// temporary directory) and its own slice directories, laid out as the node
// agent lays them out, so tests run in parallel without sharing state. The
// production library reads its slice only at the fixed in-pod paths, so
// every hooked test program (tests/cudaprog.c, with
// LD_PRELOAD=build/libgpulimit.so and LD_LIBRARY_PATH=build/stub) runs under
// build/podrun, which mounts the slice's directories there in a private mount
// namespace (the quota one read-only) and drops every capability, as the
// pod does; podrun needs root or unprivileged user namespaces (without
// either the tests fail, saying so; they skip under -short), and running a
// tenant as another uid needs root.
//
// tenant_test.go holds the hostile-tenant cases (ARCHITECTURE.md invariant
// 3), each its own test with a deadline; files_test.go the special files at
// the region paths. See README.md for the threat model.
package hook
