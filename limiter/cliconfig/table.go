package cliconfig

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/agnivade/levenshtein"
)

// Flag is one setting of a binary, declared once.
type Flag struct {
	// Name is the flag's name without dashes, e.g. "redis-url".
	Name string
	// Placeholder names the value in --help ("URL"); ignored for booleans.
	Placeholder string
	// Help is what the flag means, one or two sentences: --help and the
	// README's meaning column.
	Help string
	// Default is the default in the value's own syntax, applied through
	// Value.Set by Table.SetDefaults; "" means the field's zero value.
	Default string
	// DefaultDoc, when set, is shown instead of Default in --help and the
	// README ("in-cluster config", "required").
	DefaultDoc string
	// Value is bound to the configuration field.
	Value Value
	// Check validates the parsed value and may read other fields; nil
	// checks nothing. Its error is reported as "--name (ENV): <error>".
	Check func() error
	// Redact returns the form of the value to log; nil logs it as it is.
	Redact func(string) string
}

// Table is the flag table of one binary. Its methods are not safe for
// concurrent use; a table is built, loaded and dropped by one goroutine.
type Table struct {
	// Program names the binary (and subcommand) in messages: "gpubroker serve".
	Program string
	// Summary opens --help: what the program does, in a few lines.
	Summary string
	// EnvPrefix starts every environment twin, e.g. "GPUBROKER_".
	EnvPrefix string
	// Flags are the settings, in --help and README order.
	Flags []Flag
	// Foreign are variable names, or prefixes ending in '_', under EnvPrefix
	// that belong to other programs and are never warned about.
	Foreign []string
	// Checks validate the configuration as a whole where no single flag owns
	// the problem; their errors come first and are reported as they are.
	Checks []func() error
}

// ErrHelp is returned by Load for -h, -help or --help: print Usage, exit 0.
var ErrHelp = errors.New("help requested")

// ErrVersion is returned by Load for --version: print BuildInfo, exit 0.
var ErrVersion = errors.New("version requested")

// EnvName returns the environment twin of a flag: EnvPrefix followed by the
// name in upper case with '-' turned into '_'.
func (t *Table) EnvName(flagName string) string {
	return t.EnvPrefix + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

// Lookup returns the flag of that name, or nil.
func (t *Table) Lookup(name string) *Flag {
	for i := range t.Flags {
		if t.Flags[i].Name == name {
			return &t.Flags[i]
		}
	}
	return nil
}

// SetDefaults sets every flag to its Default. A default that does not parse
// is a programming error, reported for every such flag.
func (t *Table) SetDefaults() error {
	var errs []error
	for _, f := range t.Flags {
		if f.Default == "" {
			continue
		}
		if err := f.Value.Set(f.Default); err != nil {
			errs = append(errs, fmt.Errorf("cliconfig: default of --%s: %w", f.Name, formError(f.Value, f.Default, err)))
		}
	}
	return errors.Join(errs...)
}

// Load sets the defaults, then each flag from its variable in environ
// ("NAME=value" strings, as os.Environ returns; an empty value counts as
// unset) unless args give that flag, then from args, and validates the
// result. It returns ErrHelp or ErrVersion when args ask for them (nothing
// is validated then). Otherwise the error joins every problem, one line
// each: command-line problems, then environment problems, then failed
// checks (a flag whose value did not parse is not checked again). Warnings
// name variables under EnvPrefix that no flag reads.
func (t *Table) Load(args, environ []string) (warnings []string, err error) {
	if err := t.SetDefaults(); err != nil {
		return nil, err
	}
	given, bad, errs, special := t.parseArgs(args)
	if special != nil {
		return nil, special
	}
	env := map[string]string{}
	for _, kv := range environ {
		if k, v, ok := strings.Cut(kv, "="); ok {
			env[k] = v
		}
	}
	for _, f := range t.Flags {
		name := t.EnvName(f.Name)
		v := env[name]
		if v == "" || given[f.Name] {
			continue
		}
		if err := f.Value.Set(v); err != nil {
			errs = append(errs, fmt.Errorf("%s=%s (for --%s)", name, formError(f.Value, v, err), f.Name))
			bad[f.Name] = true
		}
	}
	warnings = t.unknownEnv(env)
	errs = append(errs, t.validate(bad)...)
	return warnings, errors.Join(errs...)
}

// Validate runs every check on the values as they are (no parsing) and
// joins the problems, one line each.
func (t *Table) Validate() error { return errors.Join(t.validate(nil)...) }

func (t *Table) validate(skip map[string]bool) []error {
	var errs []error
	for _, check := range t.Checks {
		if err := check(); err != nil {
			errs = append(errs, Split(err)...)
		}
	}
	for _, f := range t.Flags {
		if f.Check == nil || skip[f.Name] {
			continue
		}
		if err := f.Check(); err != nil {
			for _, e := range Split(err) {
				errs = append(errs, fmt.Errorf("--%s (%s): %w", f.Name, t.EnvName(f.Name), e))
			}
		}
	}
	return errs
}

// Split returns the problems of an errors.Join, at every depth, so that
// each is one line; any other error comes back alone.
func Split(err error) []error {
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		var out []error
		for _, e := range j.Unwrap() {
			out = append(out, Split(e)...)
		}
		return out
	}
	return []error{err}
}

// parseArgs applies the command line. It accepts -name and --name,
// --name=value and --name value, a bare --name for booleans and -- to end
// the flags; it goes on after every problem, so all are reported.
func (t *Table) parseArgs(args []string) (given, bad map[string]bool, errs []error, special error) {
	given, bad = map[string]bool{}, map[string]bool{}
	var stray []string
	for i := 0; i < len(args); i++ {
		arg := args[i]
		if arg == "--" {
			stray = append(stray, args[i+1:]...)
			break
		}
		if len(arg) < 2 || arg[0] != '-' {
			stray = append(stray, arg)
			continue
		}
		name := strings.TrimPrefix(strings.TrimPrefix(arg, "-"), "-")
		name, value, hasValue := strings.Cut(name, "=")
		switch name {
		case "h", "help":
			return nil, nil, nil, ErrHelp
		case "version":
			return nil, nil, nil, ErrVersion
		}
		f := t.Lookup(name)
		if f == nil {
			errs = append(errs, fmt.Errorf("--%s: no such flag%s (see %s --help)", name, t.closestFlag(name), t.Program))
			continue
		}
		if b, ok := f.Value.(boolValue); ok && b.IsBoolFlag() && !hasValue {
			value, hasValue = "true", true
		}
		if !hasValue {
			if i+1 >= len(args) {
				errs = append(errs, fmt.Errorf("--%s needs a value (%s)", name, f.Value.Form()))
				bad[name] = true
				continue
			}
			i++
			value = args[i]
		}
		given[name] = true
		if err := f.Value.Set(value); err != nil {
			errs = append(errs, fmt.Errorf("--%s %s", name, formError(f.Value, value, err)))
			bad[name] = true
		}
	}
	if len(stray) > 0 {
		errs = append(errs, fmt.Errorf("unexpected arguments %q: %s takes only flags (see %s --help)", stray, t.Program, t.Program))
	}
	return given, bad, errs, nil
}

// closestFlag suggests the flag nearest to a misspelled name, or "".
func (t *Table) closestFlag(name string) string {
	names := make([]string, len(t.Flags))
	for i, f := range t.Flags {
		names[i] = f.Name
	}
	if s := closest(name, names); s != "" {
		return "; did you mean --" + s + "?"
	}
	return ""
}

// unknownEnv warns about variables under EnvPrefix that no flag reads and
// that are not Foreign, sorted by name.
func (t *Table) unknownEnv(env map[string]string) []string {
	known := make([]string, len(t.Flags))
	for i, f := range t.Flags {
		known[i] = t.EnvName(f.Name)
	}
	var out []string
	for _, k := range slices.Sorted(maps.Keys(env)) {
		if !strings.HasPrefix(k, t.EnvPrefix) || slices.Contains(known, k) || t.foreign(k) {
			continue
		}
		w := fmt.Sprintf("%s is set, but %s has no such setting", k, t.Program)
		if s := closest(k, known); s != "" {
			w += "; did you mean " + s + "?"
		} else {
			w += fmt.Sprintf(" (see %s --help)", t.Program)
		}
		out = append(out, w)
	}
	return out
}

func (t *Table) foreign(name string) bool {
	for _, f := range t.Foreign {
		if name == f || (strings.HasSuffix(f, "_") && strings.HasPrefix(name, f)) {
			return true
		}
	}
	return false
}

// closest returns the candidate nearest to s by edit distance, when it is
// near enough to be a misspelling (at most a third of its length, and 3).
func closest(s string, candidates []string) string {
	best, bestD := "", 0
	for _, c := range candidates {
		d := levenshtein.ComputeDistance(strings.ToLower(s), strings.ToLower(c))
		if best == "" || d < bestD {
			best, bestD = c, d
		}
	}
	if best == "" || bestD > 3 || bestD*3 > len(best) {
		return ""
	}
	return best
}
