package cliconfig

import (
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"strings"
)

// Secret is a credential read from a file. It prints and logs as Redacted;
// Reveal returns the value.
type Secret string

// Redacted is what a Secret prints as.
const Redacted = "REDACTED"

// Reveal returns the secret value.
func (s Secret) Reveal() string { return string(s) }

// String returns Redacted, so fmt never prints the value.
func (s Secret) String() string { return Redacted }

// GoString returns Redacted, for %#v.
func (s Secret) GoString() string { return Redacted }

// LogValue returns Redacted, so slog never prints the value.
func (s Secret) LogValue() slog.Value { return slog.StringValue(Redacted) }

// ReadSecret reads a secret file; trailing newlines are dropped. A missing
// or empty file is an error naming the path, never the content.
func ReadSecret(path string) (Secret, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("read secret: %w", err)
	}
	s := strings.TrimRight(string(b), "\r\n")
	if s == "" {
		return "", fmt.Errorf("secret file %s is empty", path)
	}
	return Secret(s), nil
}

// RedactURL hides the password of a URL, for logs and messages: "" stays "",
// text that is not a URL becomes "(not a URL)".
func RedactURL(raw string) string {
	if raw == "" {
		return ""
	}
	u, err := url.Parse(raw)
	if err != nil {
		return "(not a URL)"
	}
	return u.Redacted()
}

// CheckFile reports whether path names an existing regular file. It only
// stats the file.
func CheckFile(path string) error {
	fi, err := os.Stat(path)
	if err != nil {
		return fmt.Errorf("cannot use %s: %w", path, err)
	}
	if !fi.Mode().IsRegular() {
		return fmt.Errorf("%s is not a regular file", path)
	}
	return nil
}
