package spawner

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"k8s.io/apimachinery/pkg/util/validation"
)

func TestSlug(t *testing.T) {
	long := strings.Repeat("a", 70)
	tests := []struct {
		name string
		raw  string
		want string
	}{
		{name: "plain lowercase stays", raw: "alice", want: "alice"},
		{name: "digits and dashes stay", raw: "team-42", want: "team-42"},
		{name: "leading digit stays", raw: "42", want: "42"},
		{name: "uppercase is folded and hashed", raw: "Alice", want: "alice-" + hash8("Alice")},
		{name: "email becomes dashes and hash", raw: "alice@example.com", want: "alice-example-com-" + hash8("alice@example.com")},
		{name: "dot is changed", raw: "a.b", want: "a-b-" + hash8("a.b")},
		{name: "accents are stripped", raw: "José", want: "jose-" + hash8("José")},
		{name: "non-latin becomes x", raw: "日本", want: "x-" + hash8("日本")},
		{name: "empty becomes x and hash", raw: "", want: "x-" + hash8("")},
		{name: "leading punctuation trimmed", raw: "--bob", want: "bob-" + hash8("--bob")},
		{name: "trailing punctuation trimmed", raw: "bob.", want: "bob-" + hash8("bob.")},
		{name: "double dash is changed", raw: "a--b", want: "a-b-" + hash8("a--b")},
		{name: "value that looks hashed is hashed again", raw: "alice-0123abcd", want: "alice-0123abcd-" + hash8("alice-0123abcd")},
		{name: "63 characters stay", raw: long[:63], want: long[:63]},
		{name: "64 characters are cut", raw: long[:64], want: long[:54] + "-" + hash8(long[:64])},
		{name: "cut never leaves a dash before the hash", raw: strings.Repeat("a", 53) + "-bbbbbbbbbbbb", want: strings.Repeat("a", 53) + "-" + hash8(strings.Repeat("a", 53)+"-bbbbbbbbbbbb")},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := Slug(tc.raw)
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("Slug(%q) (-want +got):\n%s", tc.raw, diff)
			}
			checkSlug(t, tc.raw, got, MaxNameLen)
		})
	}
}

func TestSlugN(t *testing.T) {
	tests := []struct {
		name  string
		raw   string
		limit int
		want  string
	}{
		{name: "fits", raw: "alice", limit: 20, want: "alice"},
		{name: "cut to limit", raw: "abcdefghijklmnopqrstuvwxyz", limit: 20, want: "abcdefghijk-" + hash8("abcdefghijklmnopqrstuvwxyz")},
		{name: "limit below minimum is clamped to 10", raw: "abcdefghijklmnop", limit: 3, want: "a-" + hash8("abcdefghijklmnop")},
		{name: "limit above 63 is clamped", raw: strings.Repeat("b", 64), limit: 100, want: strings.Repeat("b", 54) + "-" + hash8(strings.Repeat("b", 64))},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := SlugN(tc.raw, tc.limit)
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("SlugN(%q, %d) (-want +got):\n%s", tc.raw, tc.limit, diff)
			}
			checkSlug(t, tc.raw, got, max(tc.limit, minSlugLen))
		})
	}
}

func TestSlugNoCollisions(t *testing.T) {
	prefix := strings.Repeat("p", 60)
	groups := [][]string{
		{"Alice", "alice", "ALICE", "alice-" + hash8("Alice")},
		{"a.b", "a-b", "a_b", "a--b", "a b"},
		{prefix + "1111", prefix + "2222", prefix + "11111"},
		{"", "x", "-", "@", "x-" + hash8("")},
		{"日本", "日本語", "x-" + hash8("日本")},
		{"alice@example.com", "alice@example.org", "alice.example.com"},
	}
	for _, g := range groups {
		seen := map[string]string{}
		for _, raw := range g {
			s := Slug(raw)
			if other, ok := seen[s]; ok {
				t.Errorf("Slug(%q) = Slug(%q) = %q", raw, other, s)
			}
			seen[s] = raw
		}
	}
}

func TestPodName(t *testing.T) {
	tests := []struct {
		name         string
		user, server string
		want         string
	}{
		{name: "default server", user: "alice", want: "nb-alice"},
		{name: "named server", user: "alice", server: "gpu", want: "nb-alice--gpu"},
		{name: "raw names are slugged", user: "Alice@x.org", server: "My Lab", want: "nb-alice-x-org-" + hash8("Alice@x.org") + "--my-lab-" + hash8("My Lab")},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, PodName(tc.user, tc.server)); diff != "" {
				t.Errorf("PodName (-want +got):\n%s", diff)
			}
		})
	}
}

func TestPodNameNoCollisions(t *testing.T) {
	long := strings.Repeat("u", 70)
	pairs := [][2]string{
		{"a-b", "c"}, {"a", "b-c"}, {"a", ""}, {"a", "x-" + hash8("")},
		{long, "s"}, {long + "2", "s"}, {long, long}, {long, long + "2"}, {"s", long},
		{"a--b", ""}, {"a", "b"},
	}
	for _, name := range []struct {
		fn   func(u, s string) string
		what string
	}{{PodName, "PodName"}, {SecretName, "SecretName"}} {
		seen := map[string][2]string{}
		for _, p := range pairs {
			n := name.fn(p[0], p[1])
			if msgs := validation.IsDNS1123Label(n); len(msgs) > 0 {
				t.Errorf("%s(%q, %q) = %q: %v", name.what, p[0], p[1], n, msgs)
			}
			if other, ok := seen[n]; ok {
				t.Errorf("%s(%q, %q) = %s(%q, %q) = %q", name.what, p[0], p[1], name.what, other[0], other[1], n)
			}
			seen[n] = p
		}
	}
}

func FuzzSlug(f *testing.F) {
	for _, s := range []string{
		"", "alice", "Alice", "ALICE", "José", "日本語", "alice@example.com", "-lead", ".dot", "_under",
		"trailing-", strings.Repeat("x", 64), strings.Repeat("Ab.", 30), "a--b", "alice-0123abcd", "\x00\xff",
	} {
		f.Add(s, "alice")
	}
	f.Fuzz(func(t *testing.T, a, b string) {
		sa, sb := Slug(a), Slug(b)
		checkSlug(t, a, sa, MaxNameLen)
		if Slug(a) != sa {
			t.Fatalf("Slug(%q) is not deterministic", a)
		}
		if a != b && sa == sb {
			t.Fatalf("Slug(%q) = Slug(%q) = %q", a, b, sa)
		}
		n := PodName(a, b)
		if msgs := validation.IsDNS1123Label(n); len(msgs) > 0 {
			t.Fatalf("PodName(%q, %q) = %q: %v", a, b, n, msgs)
		}
		if a != b && n == PodName(b, a) {
			t.Fatalf("PodName(%q, %q) = PodName(%q, %q) = %q", a, b, b, a, n)
		}
	})
}

// checkSlug asserts the properties every slug has.
func checkSlug(t *testing.T, raw, got string, limit int) {
	t.Helper()
	if msgs := validation.IsDNS1123Label(got); len(msgs) > 0 {
		t.Fatalf("slug of %q = %q is not a DNS-1123 label: %v", raw, got, msgs)
	}
	if msgs := validation.IsValidLabelValue(got); len(msgs) > 0 {
		t.Fatalf("slug of %q = %q is not a label value: %v", raw, got, msgs)
	}
	if len(got) > limit {
		t.Fatalf("slug of %q = %q is %d long, limit %d", raw, got, len(got), limit)
	}
	if strings.Contains(got, "--") {
		t.Fatalf("slug of %q = %q contains --", raw, got)
	}
	if (got == raw) == hasHashSuffix(got) {
		t.Fatalf("slug of %q = %q: unchanged values must not end in a hash, changed ones must", raw, got)
	}
}

// hash8 recomputes the hash suffix independently of the code under test.
func hash8(raw string) string {
	sum := sha256.Sum256([]byte(raw))
	return hex.EncodeToString(sum[:4])
}

func BenchmarkSlug(b *testing.B) {
	for _, raw := range []string{"alice", "Zoë.Ünal@Example.org", strings.Repeat("x", 80)} {
		b.Run(raw[:min(len(raw), 12)], func(b *testing.B) {
			for b.Loop() {
				Slug(raw)
			}
		})
	}
}
