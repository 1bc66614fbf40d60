package spawner

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"
	"unicode"

	"golang.org/x/text/unicode/norm"
)

// MaxNameLen is the longest slug, and the longest name this package builds:
// the DNS-1123 label limit, which also bounds label values.
const MaxNameLen = 63

// minSlugLen is the shortest budget SlugN honours: "x-" plus the hash.
const minSlugLen = 2 + hashLen

// hashLen is the number of hex digits of SHA-256 appended to a changed value.
const hashLen = 8

// Slug returns the Kubernetes form of a raw name (user, server, group): a
// lowercase DNS-1123 label of at most MaxNameLen characters. It is SlugN(raw,
// MaxNameLen); see SlugN for the rules.
func Slug(raw string) string { return SlugN(raw, MaxNameLen) }

// SlugN returns the Kubernetes form of raw in at most limit characters (limit
// is clamped to 10..MaxNameLen, so the result may be longer than a limit below 10).
// It is the one function every Kubernetes name and label value in gpubroker is
// derived from. It is deterministic, never fails and never returns "".
//
// A raw value that is already a plain slug is returned unchanged: a valid
// DNS-1123 label of at most limit characters that contains no "--" and does not
// end in "-" followed by 8 lowercase hex digits. Every other value is changed:
// accents are stripped (NFD), letters are folded to lower case, every run of
// other characters becomes one '-', the result is trimmed of '-' and cut to
// leave room, and "-" plus the first 8 hex digits of SHA-256(raw) is appended.
// An empty base becomes "x". So "alice" → "alice", "Alice" →
// "alice-3bc51062", "alice@example.com" → "alice-example-com-ff8d9819",
// "" → "x-e3b0c442".
//
// Distinct raw values never share a slug: unchanged values are distinct by
// themselves, can never end like a changed one, and changed values differ in
// their hash unless two raw values with the same sanitized prefix collide in
// 32 bits of SHA-256. Slugs never contain "--", so names composed with a
// "--" separator (see PodName) stay unambiguous.
func SlugN(raw string, limit int) string {
	limit = max(minSlugLen, min(MaxNameLen, limit))
	if isPlainSlug(raw, limit) {
		return raw
	}
	base := sanitize(raw)
	if room := limit - 1 - hashLen; len(base) > room {
		base = strings.TrimRight(base[:room], "-")
	}
	if base == "" {
		base = "x"
	}
	sum := sha256.Sum256([]byte(raw))
	return base + "-" + hex.EncodeToString(sum[:])[:hashLen]
}

// isPlainSlug reports whether s may be used as its own slug within limit chars.
func isPlainSlug(s string, limit int) bool {
	if s == "" || len(s) > limit || s[0] == '-' || s[len(s)-1] == '-' {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !isAlnum(c) && c != '-' {
			return false
		}
	}
	return !strings.Contains(s, "--") && !hasHashSuffix(s)
}

// hasHashSuffix reports whether s ends like a changed slug: "-" + 8 hex digits.
func hasHashSuffix(s string) bool {
	if len(s) < hashLen+1 || s[len(s)-hashLen-1] != '-' {
		return false
	}
	for i := len(s) - hashLen; i < len(s); i++ {
		c := s[i]
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return false
		}
	}
	return true
}

func isAlnum(c byte) bool { return 'a' <= c && c <= 'z' || '0' <= c && c <= '9' }

// sanitize folds raw to [a-z0-9-] with single dashes and no dash at either end.
func sanitize(raw string) string {
	var b strings.Builder
	dash := false
	for _, r := range norm.NFD.String(raw) {
		if unicode.Is(unicode.Mn, r) { // combining accent of a decomposed letter
			continue
		}
		r = unicode.ToLower(r)
		if r < 0x80 && isAlnum(byte(r)) {
			if dash && b.Len() > 0 {
				b.WriteByte('-')
			}
			dash = false
			b.WriteRune(r)
			continue
		}
		dash = true
	}
	return b.String()
}
