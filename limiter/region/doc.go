// Package region reads and writes the two per-slice files that the in-pod
// limiter hook (libgpulimit.so) and the node agent share: the quota region,
// written only by the agent, and the usage region, written by the hooks.
//
// The C header limiter/hook/include/gpulimit_region.h is the single source of
// truth for both layouts. This package mirrors it in quotaRaw, usageHeaderRaw,
// usageSlotRaw and usageDeviceRaw; layout_test.go compiles a C program against
// the header and compares every field's offset and size, so the two cannot
// drift.
//
// Invariants:
//   - A quota file is replaced only by rename(2) of a complete temporary file
//     in the same directory, with a generation higher than the file it
//     replaces; readers never see a torn file. Whatever stands at the path
//     (a FIFO, a symbolic link) is replaced, never opened.
//   - Nothing at a region path blocks or redirects the caller: every open is
//     O_NONBLOCK | O_NOFOLLOW | O_NOCTTY after an lstat (a FIFO, socket or
//     device is not even opened), and a file is used only if it is regular
//     and of exactly the region's size; anything else is an error wrapping
//     ErrNotRegular or ErrCorrupt. The agent runs as root over directories a
//     root tenant can write into (ARCHITECTURE.md invariant 3).
//   - CreateUsage creates the usage region initialized (the hook refuses an
//     uninitialized one), mode UsageMode (0666) whatever the umask, and never
//     replaces an existing file (hooks may have it mapped).
//   - Decoders never panic: any byte slice yields a value or an error wrapping
//     ErrCorrupt.
//   - The usage region is advisory (ARCHITECTURE.md invariant 3). ReadUsage reports
//     slots as written, including slots of processes that died without
//     releasing them (SIGKILL, _exit); hooks ignore such slots and free them
//     lazily. Deciding whether a slot is live is the caller's job: its PID is
//     in the pod's pid namespace, but StartTimeTicks (proc(5) stat field 22)
//     is the same in every namespace, so from the host a slot is live when a
//     process of the pod has that start time and that pid as the last entry
//     of the NSpid line of /proc/<host pid>/status.
//
// Both files are little-endian; the package supports little-endian hosts only
// (amd64, arm64), like the hook.
package region
