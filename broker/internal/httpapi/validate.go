package httpapi

import (
	"fmt"
	"maps"
	"net/url"
	"regexp"
	"slices"
	"strings"

	"github.com/labstack/echo/v4"

	v1 "github.com/gpubroker/gpubroker/broker/api/v1"
	"github.com/gpubroker/gpubroker/broker/internal/fleet"
)

// Limits of what the edge accepts.
const (
	// MaxEnv bounds the entries of env plus secretEnv.
	MaxEnv = 256
	// MaxIdempotencyKeyBytes bounds the Idempotency-Key header.
	MaxIdempotencyKeyBytes = 255
)

// HeaderIdempotencyKey names the create request's idempotency key.
const HeaderIdempotencyKey = "Idempotency-Key"

// envNameRE is a POSIX environment variable name.
var envNameRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// validName checks a user, server, group or GPU name with
// fleet.ValidateName (any script, 1..255 bytes, no "/", control characters
// or surrounding spaces) and, since such a name travels in URL paths, also
// refuses "." and "..". Errors wrap fleet.ErrInvalid and say what is wrong.
func validName(what, s string) error {
	if err := fleet.ValidateName(what, s); err != nil {
		return fmt.Errorf("%w: %w", fleet.ErrInvalid, err)
	}
	if s == "." || s == ".." {
		return fmt.Errorf("%w: %s name %q is not allowed", fleet.ErrInvalid, what, s)
	}
	return nil
}

// pathName reads path parameter param as a what name, unescaping it when
// the router matched the escaped path (echo uses URL.RawPath when it is
// set, and then leaves parameters escaped).
func pathName(c echo.Context, param, what string) (string, error) {
	v := c.Param(param)
	if c.Request().URL.RawPath != "" {
		u, err := url.PathUnescape(v)
		if err != nil {
			return "", fmt.Errorf("%s name in the path is not properly escaped: %w", what, fleet.ErrInvalid)
		}
		v = u
	}
	if err := validName(what, v); err != nil {
		return "", err
	}
	return v, nil
}

// validCreate checks a create request's shape at the edge: a profile is
// named, every env and secretEnv name is a valid environment name that
// appears only once across both maps, and command and args are within
// their limits. All problems are reported at once.
func validCreate(req v1.CreateServerRequest) error {
	var problems []string
	if strings.TrimSpace(req.Profile) == "" {
		problems = append(problems, "profile is required")
	}
	if n := len(req.Env) + len(req.SecretEnv); n > MaxEnv {
		problems = append(problems, fmt.Sprintf("%d environment variables given, at most %d are allowed", n, MaxEnv))
	}
	for _, name := range sortedKeys(req.Env) {
		if p := envNameProblem("env", name); p != "" {
			problems = append(problems, p)
		}
	}
	for _, name := range sortedKeys(req.SecretEnv) {
		if p := envNameProblem("secretEnv", name); p != "" {
			problems = append(problems, p)
		}
		if _, dup := req.Env[name]; dup {
			problems = append(problems, fmt.Sprintf("%s is in both env and secretEnv", name))
		}
	}
	problems = append(problems, commandProblems(req.Command, req.Args)...)
	if len(problems) > 0 {
		return fmt.Errorf("%s: %w", strings.Join(problems, "; "), fleet.ErrInvalid)
	}
	return nil
}

// envNameProblem says what is wrong with an environment name, or "".
// Which names are reserved for gpubroker (GPUBROKER_*, NVIDIA_*, ...) is the
// servers service's rule; it refuses them with fleet.ErrInvalid.
func envNameProblem(field, name string) string {
	if !envNameRE.MatchString(name) {
		return fmt.Sprintf("%s name %q is not a valid environment variable name (letters, digits and _, not starting with a digit)", field, name)
	}
	return ""
}

// commandProblems says what is wrong with a create's command and args:
// more than v1.MaxCommandEntries entries together, an entry longer than
// v1.MaxCommandEntryBytes or holding a NUL byte (no exec argument can), or
// an empty program name in command[0]. Entries are named by field and index.
func commandProblems(command, args []string) []string {
	var problems []string
	if n := len(command) + len(args); n > v1.MaxCommandEntries {
		problems = append(problems, fmt.Sprintf("command and args have %d entries together, at most %d are allowed", n, v1.MaxCommandEntries))
	}
	if len(command) > 0 && command[0] == "" {
		problems = append(problems, "command[0] is empty; it names the program to run (leave command out to keep the image's entrypoint)")
	}
	for _, f := range []struct {
		name    string
		entries []string
	}{{"command", command}, {"args", args}} {
		for i, e := range f.entries {
			switch {
			case len(e) > v1.MaxCommandEntryBytes:
				problems = append(problems, fmt.Sprintf("%s[%d] is %d bytes long, at most %d are allowed", f.name, i, len(e), v1.MaxCommandEntryBytes))
			case strings.ContainsRune(e, 0):
				problems = append(problems, fmt.Sprintf("%s[%d] contains a NUL byte", f.name, i))
			}
		}
	}
	return problems
}

// idempotencyKey reads the optional Idempotency-Key header: printable
// ASCII, at most MaxIdempotencyKeyBytes; "" when absent.
func idempotencyKey(c echo.Context) (string, error) {
	k := c.Request().Header.Get(HeaderIdempotencyKey)
	if len(k) > MaxIdempotencyKeyBytes {
		return "", fmt.Errorf("header %s is %d bytes long, at most %d are allowed: %w", HeaderIdempotencyKey, len(k), MaxIdempotencyKeyBytes, fleet.ErrInvalid)
	}
	for i := 0; i < len(k); i++ {
		if k[i] < 0x21 || k[i] > 0x7e {
			return "", fmt.Errorf("header %s must be printable ASCII without spaces: %w", HeaderIdempotencyKey, fleet.ErrInvalid)
		}
	}
	return k, nil
}

// sortedKeys returns m's keys in order, so problems are listed stably.
func sortedKeys(m map[string]string) []string { return slices.Sorted(maps.Keys(m)) }

// fieldsError is a 400 that names each invalid field of a request body
// (v1.Error.Fields); its message sums them up. It matches
// fleet.ErrInvalid.
type fieldsError struct {
	problems []v1.FieldProblem
}

func (e *fieldsError) Error() string {
	parts := make([]string, len(e.problems))
	for i, p := range e.problems {
		parts[i] = p.Field + " " + p.Message
	}
	return strings.Join(parts, "; ")
}

// Is makes errors.Is(err, fleet.ErrInvalid) true.
func (e *fieldsError) Is(target error) bool { return target == fleet.ErrInvalid }

// sliceFields turns fleet's slice problems into field problems, or nil.
func sliceFields(s fleet.Slice) error {
	ps := fleet.SliceProblems(s)
	if len(ps) == 0 {
		return nil
	}
	out := make([]v1.FieldProblem, len(ps))
	for i, p := range ps {
		out[i] = v1.FieldProblem{Field: p.Field, Message: p.Message}
	}
	return &fieldsError{problems: out}
}
