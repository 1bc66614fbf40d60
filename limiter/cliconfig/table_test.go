package cliconfig_test

import (
	"bytes"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/gpubroker/gpubroker/limiter/cliconfig"
)

// settings is a small configuration with one flag of every kind.
type settings struct {
	Addr    string
	Wait    time.Duration
	Count   int
	Max     int64
	Rate    float64
	On      bool
	Items   []string
	URL     string
	Checked bool // set by Addr's check, to see that checks run
}

func (s *settings) table() *cliconfig.Table {
	return &cliconfig.Table{
		Program: "prog run", Summary: "Runs prog.", EnvPrefix: "PROG_",
		Foreign: []string{"PROG_OTHER_", "PROG_HOOK"},
		Flags: []cliconfig.Flag{
			{Name: "addr", Placeholder: "ADDR", Value: cliconfig.String(&s.Addr), Default: ":80", Help: "Listen address.",
				Check: func() error {
					s.Checked = true
					return cliconfig.CheckHostPort(s.Addr)
				}},
			{Name: "wait", Placeholder: "DURATION", Value: cliconfig.Duration(&s.Wait), Default: "1s", Help: "How long to wait | at most.",
				Check: func() error {
					if s.Wait <= 0 {
						return errors.New("must be > 0")
					}
					return nil
				}},
			{Name: "count", Placeholder: "N", Value: cliconfig.Int(&s.Count), Default: "3", Help: "How many."},
			{Name: "max", Placeholder: "N", Value: cliconfig.Int64(&s.Max), Help: "Most."},
			{Name: "rate", Placeholder: "QPS", Value: cliconfig.Float(&s.Rate), Default: "2.5", Help: "Rate."},
			{Name: "on", Value: cliconfig.Bool(&s.On), Help: "Switch."},
			{Name: "items", Placeholder: "LIST", Value: cliconfig.List(&s.Items), Help: "Items."},
			{Name: "url", Placeholder: "URL", Value: cliconfig.String(&s.URL), DefaultDoc: "required", Help: "A URL.",
				Redact: cliconfig.RedactURL},
		},
	}
}

func env(kv ...string) []string { return kv }

func TestLoadPrecedenceAndSyntax(t *testing.T) {
	tests := []struct {
		name string
		args []string
		env  []string
		want settings
	}{
		{name: "defaults", want: settings{Addr: ":80", Wait: time.Second, Count: 3, Rate: 2.5}},
		{name: "env over default, empty env unset",
			env:  env("PROG_WAIT=2m", "PROG_COUNT=", "PROG_ON=yes", "PROG_ITEMS= a, b,,", "PROG_MAX=9000000000", "OTHER=1"),
			want: settings{Addr: ":80", Wait: 2 * time.Minute, Count: 3, Max: 9000000000, Rate: 2.5, On: true, Items: []string{"a", "b"}}},
		{name: "flag over env, every syntax",
			args: []string{"-addr", ":81", "--wait=5s", "--on", "--count", "7", "-rate=0.5", "--items=x"},
			env:  env("PROG_ADDR=:82", "PROG_WAIT=1h", "PROG_ON=false", "PROG_COUNT=1", "PROG_ITEMS=y,z"),
			want: settings{Addr: ":81", Wait: 5 * time.Second, Count: 7, Rate: 0.5, On: true, Items: []string{"x"}}},
		{name: "a bool flag set false over a true variable", args: []string{"--on=false"}, env: env("PROG_ON=1"),
			want: settings{Addr: ":80", Wait: time.Second, Count: 3, Rate: 2.5}},
		{name: "a flag over a bad variable wins quietly", args: []string{"--wait=3s", "--count=2"}, env: env("PROG_WAIT=soon", "PROG_COUNT=many"),
			want: settings{Addr: ":80", Wait: 3 * time.Second, Count: 2, Rate: 2.5}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var s settings
			warnings, err := s.table().Load(tc.args, tc.env)
			if err != nil || len(warnings) > 0 {
				t.Fatalf("Load: %v, warnings %q", err, warnings)
			}
			tc.want.Checked = true
			if diff := cmp.Diff(tc.want, s); diff != "" {
				t.Errorf("settings (-want +got):\n%s", diff)
			}
		})
	}
}

func TestLoadReportsEveryProblemOnceInTheUsersTerms(t *testing.T) {
	var s settings
	warnings, err := s.table().Load(
		[]string{"--adr=:1", "--wait", "5", "-count=x", "--on=maybe", "--nothing-like-this", "stray", "--", "--addr=:2", "--rate"},
		env("PROG_MAX=1e3", "PROG_RATE=fast", "PROG_WAITT=1s", "PROG_OTHER_X=1", "PROG_HOOK=1", "PROG_ZZZZZZZZ=1", "PROG_ADDR=nope"))
	want := []string{
		`--adr: no such flag; did you mean --addr? (see prog run --help)`,
		`--wait "5" is not a duration such as 30s, 2m or 1h`,
		`--count "x" is not a whole number such as 3`,
		`--on "maybe" is not true or false`,
		`--nothing-like-this: no such flag (see prog run --help)`,
		`unexpected arguments ["stray" "--addr=:2" "--rate"]: prog run takes only flags (see prog run --help)`,
		`PROG_MAX="1e3" is not a whole number such as 3600 (for --max)`,
		`PROG_RATE="fast" is not a number such as 50 or 0.5 (for --rate)`,
		// PROG_ADDR is text, so it parses, and fails its check; --wait's
		// check is not run on the default its bad value left behind.
		`--addr (PROG_ADDR): "nope" is not host:port`,
	}
	if err == nil {
		t.Fatal("Load accepted it all")
	}
	got := strings.Split(err.Error(), "\n")
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("problems (-want +got):\n%s", diff)
	}
	wantWarnings := []string{
		"PROG_WAITT is set, but prog run has no such setting; did you mean PROG_WAIT?",
		"PROG_ZZZZZZZZ is set, but prog run has no such setting (see prog run --help)",
	}
	if diff := cmp.Diff(wantWarnings, warnings); diff != "" {
		t.Errorf("warnings (-want +got):\n%s", diff)
	}
}

func TestAFlagWithoutItsValue(t *testing.T) {
	var s settings
	_, err := s.table().Load([]string{"--wait"}, nil)
	if err == nil || err.Error() != "--wait needs a value (a duration such as 30s, 2m or 1h)" {
		t.Errorf("Load(--wait) = %v", err)
	}
}

func TestHelpAndVersionWinOverProblems(t *testing.T) {
	for _, args := range [][]string{{"--nope", "-h"}, {"--help"}, {"-help", "x"}} {
		var s settings
		if _, err := s.table().Load(args, env("PROG_WAIT=bad")); !errors.Is(err, cliconfig.ErrHelp) {
			t.Errorf("Load(%q) = %v, want ErrHelp", args, err)
		}
	}
	var s settings
	if _, err := s.table().Load([]string{"--version"}, nil); !errors.Is(err, cliconfig.ErrVersion) {
		t.Errorf("Load(--version) = %v, want ErrVersion", err)
	}
}

func TestUsageMarkdownAndLogComeFromTheTable(t *testing.T) {
	var s settings
	tab := s.table()
	u := tab.Usage()
	for _, want := range []string{
		"Usage: prog run [flags]\n\nRuns prog.\n",
		"  --addr ADDR\n      Listen address.\n      env PROG_ADDR, default \":80\"\n",
		"  --on\n      Switch.\n      env PROG_ON, default false\n",
		"  --max N\n      Most.\n      env PROG_MAX, default none\n",
		"  --url URL\n      A URL.\n      env PROG_URL, default required\n",
		"  --help\n", "  --version\n",
	} {
		if !strings.Contains(u, want) {
			t.Errorf("Usage lacks %q:\n%s", want, u)
		}
	}
	md := tab.Markdown()
	for _, want := range []string{
		"| flag | environment | default | meaning |\n|---|---|---|---|\n",
		"| `--addr` | `PROG_ADDR` | `:80` | Listen address. |\n",
		"| `--wait` | `PROG_WAIT` | `1s` | How long to wait \\| at most. |\n",
		"| `--max` | `PROG_MAX` |  | Most. |\n",
		"| `--on` | `PROG_ON` | `false` | Switch. |\n",
		"| `--url` | `PROG_URL` | required | A URL. |\n",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("Markdown lacks %q:\n%s", want, md)
		}
	}
	if n := strings.Count(md, "\n"); n != 2+len(tab.Flags) {
		t.Errorf("Markdown has %d lines, want a header and one row per flag", n)
	}

	if err := tab.SetDefaults(); err != nil {
		t.Fatal(err)
	}
	s.URL = "redis://u:hunter2@r:1"
	var buf bytes.Buffer
	slog.New(slog.NewJSONHandler(&buf, nil)).Info("cfg", "config", tab.LogValue())
	if out := buf.String(); strings.Contains(out, "hunter2") || !strings.Contains(out, `"url":"redis://u:xxxxx@r:1"`) || !strings.Contains(out, `"wait":"1s"`) {
		t.Errorf("log line: %s", out)
	}
}

func TestReplaceMarkdown(t *testing.T) {
	begin, end := cliconfig.MarkdownMarkers("prog")
	doc := "# Prog\n\n" + begin + "| old |\n" + end + "\nmore\n"
	out, found, ok := cliconfig.ReplaceMarkdown(doc, "prog", "| new |\n")
	if !ok || found != "| old |\n" || out != "# Prog\n\n"+begin+"| new |\n"+end+"\nmore\n" {
		t.Errorf("ReplaceMarkdown = %q, %q, %v", out, found, ok)
	}
	if _, _, ok := cliconfig.ReplaceMarkdown(doc, "other", "x"); ok {
		t.Error("found markers of another table")
	}
}
