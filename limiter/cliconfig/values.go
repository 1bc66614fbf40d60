package cliconfig

import (
	"errors"
	"flag"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
)

// Value is a flag's value, bound to a configuration field: a flag.Value
// whose Form says in words what Set accepts ("a duration such as 30s").
type Value interface {
	flag.Value
	Form() string
}

// boolValue marks values given as a bare --flag (true) or --flag=false.
type boolValue interface{ IsBoolFlag() bool }

// errForm is returned by Set when the text is not of the value's form; the
// table reports the form instead of the parser's words.
var errForm = errors.New("not of the expected form")

type stringValue struct{ p *string }

// String binds a text flag to p.
func String(p *string) Value { return stringValue{p} }

func (v stringValue) String() string {
	if v.p == nil {
		return ""
	}
	return *v.p
}
func (v stringValue) Set(s string) error { *v.p = s; return nil }
func (v stringValue) Form() string       { return "text" }

type durationValue struct{ p *time.Duration }

// Duration binds a duration flag (time.ParseDuration syntax) to p.
func Duration(p *time.Duration) Value { return durationValue{p} }

func (v durationValue) String() string {
	if v.p == nil {
		return "0s"
	}
	return v.p.String()
}

func (v durationValue) Set(s string) error {
	d, err := time.ParseDuration(strings.TrimSpace(s))
	if err != nil {
		return errForm
	}
	*v.p = d
	return nil
}
func (v durationValue) Form() string { return "a duration such as 30s, 2m or 1h" }

type intValue struct{ p *int }

// Int binds a whole-number flag to p.
func Int(p *int) Value { return intValue{p} }

func (v intValue) String() string {
	if v.p == nil {
		return "0"
	}
	return strconv.Itoa(*v.p)
}

func (v intValue) Set(s string) error {
	n, err := strconv.Atoi(strings.TrimSpace(s))
	if err != nil {
		return errForm
	}
	*v.p = n
	return nil
}
func (v intValue) Form() string { return "a whole number such as 3" }

type int64Value struct{ p *int64 }

// Int64 binds a 64-bit whole-number flag to p.
func Int64(p *int64) Value { return int64Value{p} }

func (v int64Value) String() string {
	if v.p == nil {
		return "0"
	}
	return strconv.FormatInt(*v.p, 10)
}

func (v int64Value) Set(s string) error {
	n, err := strconv.ParseInt(strings.TrimSpace(s), 10, 64)
	if err != nil {
		return errForm
	}
	*v.p = n
	return nil
}
func (v int64Value) Form() string { return "a whole number such as 3600" }

type floatValue struct{ p *float64 }

// Float binds a decimal-number flag to p; NaN and infinities are refused.
func Float(p *float64) Value { return floatValue{p} }

func (v floatValue) String() string {
	if v.p == nil {
		return "0"
	}
	return strconv.FormatFloat(*v.p, 'g', -1, 64)
}

func (v floatValue) Set(s string) error {
	f, err := strconv.ParseFloat(strings.TrimSpace(s), 64)
	if err != nil || math.IsNaN(f) || math.IsInf(f, 0) {
		return errForm
	}
	*v.p = f
	return nil
}
func (v floatValue) Form() string { return "a number such as 50 or 0.5" }

type boolFlagValue struct{ p *bool }

// Bool binds a boolean flag to p: --name alone sets true; --name=false,
// and a variable, take true/false, 1/0, yes/no (any case).
func Bool(p *bool) Value { return boolFlagValue{p} }

func (v boolFlagValue) String() string {
	if v.p == nil {
		return "false"
	}
	return strconv.FormatBool(*v.p)
}

func (v boolFlagValue) Set(s string) error {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "true", "1", "yes", "t":
		*v.p = true
	case "false", "0", "no", "f":
		*v.p = false
	default:
		return errForm
	}
	return nil
}
func (v boolFlagValue) Form() string     { return "true or false" }
func (v boolFlagValue) IsBoolFlag() bool { return true }

type listValue struct{ p *[]string }

// List binds a comma-separated list flag to p. Set replaces the list;
// items are trimmed and empty ones dropped.
func List(p *[]string) Value { return listValue{p} }

func (v listValue) String() string {
	if v.p == nil {
		return ""
	}
	return strings.Join(*v.p, ",")
}

func (v listValue) Set(s string) error {
	var out []string
	for _, item := range strings.Split(s, ",") {
		if item = strings.TrimSpace(item); item != "" {
			out = append(out, item)
		}
	}
	*v.p = out
	return nil
}
func (v listValue) Form() string { return "a comma-separated list" }

// AtLeast returns a Check that *p is at least least.
func AtLeast[T int | int64](p *T, least T) func() error {
	return func() error {
		if *p < least {
			return fmt.Errorf("must be at least %d, got %d", least, *p)
		}
		return nil
	}
}

// formError is a value that did not parse, in the user's words.
func formError(v Value, raw string, err error) error {
	if errors.Is(err, errForm) {
		return fmt.Errorf("%q is not %s", raw, v.Form())
	}
	return fmt.Errorf("%q: %w (want %s)", raw, err, v.Form())
}
