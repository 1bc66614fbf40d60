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
// temporary directory) and its own quota and usage files, so tests run in
// parallel without sharing state. Test programs are tests/cudaprog.c, run
// with LD_PRELOAD=build/libgpulimit.so and LD_LIBRARY_PATH=build/stub.
package hook
