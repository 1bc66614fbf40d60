package fleet

import (
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"
)

// MaxNameBytes is the longest user or server name accepted, in bytes of UTF-8.
const MaxNameBytes = 255

// ValidateName checks a user or server name: 1..MaxNameBytes bytes of valid
// UTF-8 without control characters, '/', surrounding spaces, or invisible
// and bidirectional-formatting characters (Unicode category Cf, such as
// U+200B and U+202E), which would let two names look alike in lists. Kubernetes
// names are derived from it by spawner.Slug, so any such name works there.
func ValidateName(kind, name string) error {
	switch {
	case name == "":
		return fmt.Errorf("%s name is empty", kind)
	case len(name) > MaxNameBytes:
		return fmt.Errorf("%s name is %d bytes long; the limit is %d", kind, len(name), MaxNameBytes)
	case !utf8.ValidString(name):
		return fmt.Errorf("%s name is not valid UTF-8", kind)
	case strings.TrimSpace(name) != name:
		return fmt.Errorf("%s name %q starts or ends with spaces", kind, name)
	case strings.ContainsRune(name, '/'):
		return fmt.Errorf("%s name %q contains '/'", kind, name)
	case strings.ContainsFunc(name, unicode.IsControl):
		return fmt.Errorf("%s name %q contains control characters", kind, name)
	case strings.ContainsFunc(name, isInvisible):
		return fmt.Errorf("%s name %q contains invisible or direction-changing characters", kind, name)
	}
	return nil
}

// isInvisible reports format characters (Unicode Cf): zero-width and
// bidirectional controls that change how a name looks without being seen.
func isInvisible(r rune) bool { return unicode.Is(unicode.Cf, r) }
