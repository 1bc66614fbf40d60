package region

import (
	"encoding/binary"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"runtime"
	"sort"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	v1 "github.com/gpubroker/gpubroker/broker/api/v1"
	"github.com/gpubroker/gpubroker/e2e/testdeps"
)

var update = flag.Bool("update", false, "rewrite testdata/*.golden")

// headerDir is the C header directory, relative to this package.
func headerDir(t *testing.T) string {
	t.Helper()
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		t.Fatal("runtime.Caller failed")
	}
	return filepath.Join(filepath.Dir(file), "..", "hook", "include")
}

// needGCC returns the path of gcc; when gcc or the C headers are missing it
// fails the test naming the packages (skips it under -short).
func needGCC(t *testing.T) string {
	t.Helper()
	testdeps.Need(t, "/usr/include/stdio.h")
	return testdeps.Need(t, "gcc")
}

// layoutEntry is one field's place in a struct: byte offset and size.
type layoutEntry struct {
	Offset, Size int
}

// goLayout lists the packed (encoding/binary) offset and size of every
// tagged field of v's type, keyed "cstruct.cfield", plus the struct size
// under "cstruct.".
func goLayout(t *testing.T, cstruct string, v any) map[string]layoutEntry {
	t.Helper()
	out := map[string]layoutEntry{}
	rt := reflect.TypeOf(v)
	off := 0
	for i := range rt.NumField() {
		f := rt.Field(i)
		size := binary.Size(reflect.New(f.Type).Elem().Interface())
		if size < 0 {
			t.Fatalf("%s.%s has no fixed size", rt.Name(), f.Name)
		}
		if int(f.Offset) != off {
			t.Errorf("%s.%s: Go offset %d differs from packed offset %d: the C layout needs explicit padding", rt.Name(), f.Name, f.Offset, off)
		}
		name := f.Tag.Get("c")
		if name == "" && f.Name != "Header" {
			t.Errorf("%s.%s has no c tag naming its C field", rt.Name(), f.Name)
		}
		if _, dup := out[cstruct+"."+name]; dup {
			t.Errorf("%s.%s: c tag %q used twice", rt.Name(), f.Name, name)
		}
		if name != "" {
			out[cstruct+"."+name] = layoutEntry{Offset: off, Size: size}
		}
		off += size
	}
	out[cstruct+"."] = layoutEntry{Offset: 0, Size: off}
	return out
}

// cLayout compiles and runs a C program that prints offsetof and sizeof for
// every key of want, using the real header.
func cLayout(t *testing.T, want map[string]layoutEntry, consts []string) (map[string]layoutEntry, map[string]string) {
	t.Helper()
	gcc := needGCC(t)
	var src strings.Builder
	src.WriteString("#include <stdio.h>\n#include <stddef.h>\n#include \"gpulimit_region.h\"\nint main(void) {\n")
	for key := range want {
		st, field, _ := strings.Cut(key, ".")
		if field == "" {
			fmt.Fprintf(&src, "\tprintf(\"L %s 0 %%zu\\n\", sizeof(struct %s));\n", key, st)
			continue
		}
		fmt.Fprintf(&src, "\tprintf(\"L %s %%zu %%zu\\n\", offsetof(struct %s, %s), sizeof(((struct %s *)0)->%s));\n", key, st, field, st, field)
	}
	for _, c := range consts {
		fmt.Fprintf(&src, "\tprintf(\"C %s %%s\\n\", GPULIMIT_STR(%s));\n", c, c)
	}
	src.WriteString("\treturn 0;\n}\n")
	dir := t.TempDir()
	cfile := filepath.Join(dir, "layout.c")
	prelude := "#define GPULIMIT_STR2(x) #x\n#define GPULIMIT_STR(x) GPULIMIT_STR2(x)\n"
	if err := os.WriteFile(cfile, []byte(prelude+src.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "layout")
	if out, err := exec.Command(gcc, "-std=c11", "-Wall", "-Wextra", "-Werror", "-I", headerDir(t), "-o", bin, cfile).CombinedOutput(); err != nil {
		t.Fatalf("compile layout program: %v\n%s", err, out)
	}
	out, err := exec.Command(bin).Output()
	if err != nil {
		t.Fatalf("run layout program: %v", err)
	}
	got := map[string]layoutEntry{}
	macros := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		var kind, key string
		var a, b int
		if strings.HasPrefix(line, "C ") {
			f := strings.SplitN(line, " ", 3)
			macros[f[1]] = f[2]
			continue
		}
		if _, err := fmt.Sscan(line, &kind, &key, &a, &b); err != nil {
			t.Fatalf("parse %q: %v", line, err)
		}
		got[key] = layoutEntry{Offset: a, Size: b}
	}
	return got, macros
}

func TestLayoutMatchesHeader(t *testing.T) {
	want := map[string]layoutEntry{}
	for k, v := range goLayout(t, "gpulimit_quota", quotaRaw{}) {
		want[k] = v
	}
	for k, v := range goLayout(t, "gpulimit_usage_slot", usageSlotRaw{}) {
		want[k] = v
	}
	for k, v := range goLayout(t, "gpulimit_usage_device", usageDeviceRaw{}) {
		want[k] = v
	}
	hdr := goLayout(t, "gpulimit_usage", usageHeaderRaw{})
	delete(hdr, "gpulimit_usage.") // the header is a prefix of the C struct
	for k, v := range hdr {
		want[k] = v
	}
	for k, v := range goLayout(t, "gpulimit_usage", usageRaw{}) {
		if k == "gpulimit_usage." || k == "gpulimit_usage.slots" {
			want[k] = v
		}
	}
	consts := []string{
		"GPULIMIT_QUOTA_MAGIC", "GPULIMIT_USAGE_MAGIC", "GPULIMIT_LAYOUT_VERSION",
		"GPULIMIT_SLICE_ID_LEN", "GPULIMIT_UUID_BYTES", "GPULIMIT_USAGE_SLOTS", "GPULIMIT_USAGE_DEVICES",
		"GPULIMIT_QUOTA_FILE", "GPULIMIT_USAGE_FILE",
	}
	got, macros := cLayout(t, want, consts)
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("Go mirror differs from gpulimit_region.h (-go +c):\n%s", diff)
	}
	wantMacros := map[string]string{
		"GPULIMIT_QUOTA_MAGIC":    fmt.Sprintf("%#xu", QuotaMagic),
		"GPULIMIT_USAGE_MAGIC":    fmt.Sprintf("%#xu", UsageMagic),
		"GPULIMIT_LAYOUT_VERSION": fmt.Sprintf("%du", LayoutVersion),
		"GPULIMIT_SLICE_ID_LEN":   fmt.Sprint(SliceIDLen),
		"GPULIMIT_UUID_BYTES":     fmt.Sprint(UUIDBytes),
		"GPULIMIT_USAGE_SLOTS":    fmt.Sprint(UsageSlots),
		"GPULIMIT_USAGE_DEVICES":  fmt.Sprint(UsageDevices),
		"GPULIMIT_QUOTA_FILE":     fmt.Sprintf("%q", v1.PodQuotaFile),
		"GPULIMIT_USAGE_FILE":     fmt.Sprintf("%q", v1.PodUsageFile),
	}
	if diff := cmp.Diff(wantMacros, macros); diff != "" {
		t.Errorf("constants differ from gpulimit_region.h (-go +c):\n%s", diff)
	}
	if got["gpulimit_usage.agent_sample_ns"].Offset != agentSampleOffset || got["gpulimit_usage.agent_util_permille"].Offset != agentUtilOffset ||
		got["gpulimit_usage.agent_device_util_permille"].Offset != agentUtilOffset+4 {
		t.Errorf("agent field offsets in C: %+v %+v %+v; WriteAgentSample uses %d and %d",
			got["gpulimit_usage.agent_sample_ns"], got["gpulimit_usage.agent_util_permille"], got["gpulimit_usage.agent_device_util_permille"],
			agentSampleOffset, agentUtilOffset)
	}
	checkGolden(t, "layout.golden", formatLayout(got))
	if got["gpulimit_quota."].Size != QuotaSize || got["gpulimit_usage."].Size != UsageSize {
		t.Errorf("sizes: quota %d usage %d, want %d and %d", got["gpulimit_quota."].Size, got["gpulimit_usage."].Size, QuotaSize, UsageSize)
	}
}

// formatLayout prints a layout as "struct.field offset size" lines sorted by
// struct and offset: the reviewable record of the ABI in testdata/layout.golden.
func formatLayout(l map[string]layoutEntry) string {
	keys := make([]string, 0, len(l))
	for k := range l {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		si, _, _ := strings.Cut(keys[i], ".")
		sj, _, _ := strings.Cut(keys[j], ".")
		if si != sj {
			return si < sj
		}
		if l[keys[i]].Offset != l[keys[j]].Offset {
			return l[keys[i]].Offset < l[keys[j]].Offset
		}
		return keys[i] < keys[j]
	})
	var b strings.Builder
	b.WriteString("# struct.field offset size (bytes); \"struct.\" is the whole struct. Regenerate: go test ./limiter/region -update\n")
	for _, k := range keys {
		fmt.Fprintf(&b, "%-42s %5d %5d\n", k, l[k].Offset, l[k].Size)
	}
	return b.String()
}

func checkGolden(t *testing.T, name, got string) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *update {
		if err := os.MkdirAll("testdata", 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run with -update to create it)", err)
	}
	if diff := cmp.Diff(string(want), got); diff != "" {
		t.Errorf("%s changed (-golden +now); review and run with -update:\n%s", path, diff)
	}
}
