package catalog

import (
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"reflect"
	"regexp"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/api/resource"
	"sigs.k8s.io/yaml"

	v1 "github.com/gpubroker/gpubroker/broker/api/v1"
	"github.com/gpubroker/gpubroker/broker/internal/fleet"
)

//go:embed default.yaml
var defaultYAML []byte

// DefaultArgs returns the notebook container's args for a profile that sets
// neither command nor args: the Jupyter docker-stacks images' start script
// (kept as a wrapper in every image since the move to start-notebook.py),
// which serves on 0.0.0.0:8888 and reads its token from JUPYTER_TOKEN,
// under the base URL the broker's proxy uses.
func DefaultArgs() []string {
	return []string{"start-notebook.sh", "--ServerApp.base_url=$(" + v1.EnvBaseURL + ")"}
}

// Catalog is a parsed profiles-and-quotas file. It is immutable and safe for
// concurrent use; accessors return copies.
type Catalog struct {
	profiles []fleet.Profile
	quotas   fleet.Quotas
}

// fileDoc and the types below mirror the file format; see the package doc.
type fileDoc struct {
	Profiles []profileDoc `json:"profiles"`
	Quotas   quotasDoc    `json:"quotas"`
}

type profileDoc struct {
	Name        string    `json:"name"`
	DisplayName string    `json:"displayName"`
	Description string    `json:"description"`
	Image       string    `json:"image"`
	CPU         string    `json:"cpu"`
	Memory      string    `json:"memory"`
	Slice       *sliceDoc `json:"slice"` // nil: omitted (exclusive, mig)
	Sharing     string    `json:"sharing"`
	MIGProfile  string    `json:"migProfile"`
	Model       string    `json:"model"`
	Groups      []string  `json:"groups"`
	// Command and Args: nil (absent) takes DefaultArgs; [] keeps the
	// image's own.
	Command *[]string `json:"command"`
	Args    *[]string `json:"args"`
}

type sliceDoc struct {
	MemoryMiB           int64 `json:"memoryMiB"`
	ComputePercent      int   `json:"computePercent"`
	ComputeLimitPercent *int  `json:"computeLimitPercent"` // nil: = computePercent
}

type quotasDoc struct {
	DefaultUser quotaDoc            `json:"defaultUser"`
	Users       map[string]quotaDoc `json:"users"`
	Groups      map[string]quotaDoc `json:"groups"`
}

type quotaDoc struct {
	Servers        int   `json:"servers"`
	MemoryMiB      int64 `json:"memoryMiB"`
	ComputePercent int   `json:"computePercent"`
}

// Load reads and parses the file at path. Errors name the path and, for an
// invalid file, list every problem (see Parse).
func Load(path string) (*Catalog, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("profiles file: %w", err)
	}
	c, err := Parse(data)
	if err != nil {
		return nil, fmt.Errorf("profiles file %s: %w", path, err)
	}
	return c, nil
}

// Default returns the embedded dev-mode catalog (default.yaml). The file is
// part of the binary and tested, so Default panics only if it was broken at
// build time.
func Default() *Catalog {
	c, err := Parse(defaultYAML)
	if err != nil {
		panic(fmt.Sprintf("catalog: embedded default.yaml is invalid: %v", err))
	}
	return c
}

// Parse parses a profiles-and-quotas file. It returns every problem at once,
// joined with errors.Join, each naming its place in the file.
func Parse(data []byte) (*Catalog, error) {
	js, err := yaml.YAMLToJSONStrict(data)
	if err != nil {
		return nil, fmt.Errorf("not valid YAML: %w", err)
	}
	var generic any
	if err := json.Unmarshal(js, &generic); err != nil {
		return nil, fmt.Errorf("not valid YAML: %w", err)
	}
	if generic == nil {
		return nil, errors.New("the file is empty")
	}
	if errs := shapeErrors(generic, reflect.TypeFor[fileDoc](), ""); len(errs) > 0 {
		// Validating half-decoded values would add misleading errors.
		return nil, errors.Join(errs...)
	}
	var doc fileDoc
	if err := yaml.UnmarshalStrict(data, &doc); err != nil {
		// shapeErrors accepted the shape, so this is unexpected.
		return nil, fmt.Errorf("cannot decode: %w", err)
	}
	c, errs := build(doc)
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return c, nil
}

// dns1123Label is a Kubernetes DNS-1123 label: what a profile name may be.
var dns1123Label = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`)

// build validates doc and converts it. It returns every problem.
func build(doc fileDoc) (*Catalog, []error) {
	var errs []error
	if len(doc.Profiles) == 0 {
		errs = append(errs, errors.New("profiles: at least one profile is required"))
	}
	c := &Catalog{}
	seen := map[string]int{}
	for i, pd := range doc.Profiles {
		place := fmt.Sprintf("profiles[%d]", i)
		if pd.Name != "" {
			place += " (" + pd.Name + ")"
		}
		add := func(err error) { errs = append(errs, fmt.Errorf("%s: %w", place, err)) }
		switch {
		case pd.Name == "":
			add(errors.New("name is empty"))
		case len(pd.Name) > 63 || !dns1123Label.MatchString(pd.Name):
			add(fmt.Errorf("name %q must be a DNS-1123 label: at most 63 lowercase letters, digits and '-', starting and ending with a letter or digit", pd.Name))
		}
		if j, dup := seen[pd.Name]; dup && pd.Name != "" {
			add(fmt.Errorf("name %q is already used by profiles[%d]", pd.Name, j))
		} else {
			seen[pd.Name] = i
		}
		if strings.TrimSpace(pd.DisplayName) == "" {
			add(errors.New("displayName is empty"))
		}
		switch {
		case strings.TrimSpace(pd.Image) == "":
			add(errors.New("image is empty"))
		case strings.ContainsAny(pd.Image, " \t\n"):
			add(fmt.Errorf("image %q contains whitespace", pd.Image))
		}
		if err := checkQuantity("cpu", pd.CPU, `"2", "500m"`); err != nil {
			add(err)
		}
		if err := checkQuantity("memory", pd.Memory, `"8Gi", "512Mi"`); err != nil {
			add(err)
		}
		var s fleet.Slice
		if pd.Slice != nil {
			s = fleet.Slice{MemoryMiB: pd.Slice.MemoryMiB, ComputePercent: pd.Slice.ComputePercent, ComputeLimitPercent: pd.Slice.ComputePercent}
			if pd.Slice.ComputeLimitPercent != nil {
				s.ComputeLimitPercent = *pd.Slice.ComputeLimitPercent
			}
		}
		mode := fleet.ModeOf(fleet.SharingMode(pd.Sharing))
		for _, err := range fleet.ValidateSharing(mode, pd.MIGProfile, s, pd.Slice != nil) {
			add(err)
		}
		for j, g := range pd.Groups {
			if strings.TrimSpace(g) == "" {
				add(fmt.Errorf("groups[%d] is empty", j))
			}
		}
		command, args := commandOf(pd, add)
		c.profiles = append(c.profiles, fleet.Profile{
			Command:     command,
			Args:        args,
			Name:        pd.Name,
			DisplayName: pd.DisplayName,
			Description: pd.Description,
			Image:       pd.Image,
			CPU:         pd.CPU,
			Memory:      pd.Memory,
			Slice:       s,
			Sharing:     mode,
			MIGProfile:  pd.MIGProfile,
			Model:       pd.Model,
			Groups:      slices.Clone(pd.Groups),
		})
	}
	c.quotas.DefaultUser, errs = quota("quotas.defaultUser", doc.Quotas.DefaultUser, errs)
	c.quotas.Users, errs = quotaMap("quotas.users", "user", doc.Quotas.Users, errs)
	c.quotas.Groups, errs = quotaMap("quotas.groups", "group", doc.Quotas.Groups, errs)
	return c, errs
}

// commandOf returns a profile's notebook command and args (DefaultArgs when
// it sets neither), reporting entries no container could run.
func commandOf(pd profileDoc, add func(error)) (command, args []string) {
	if pd.Command == nil && pd.Args == nil {
		return nil, DefaultArgs()
	}
	if pd.Command != nil {
		command = append([]string{}, *pd.Command...)
	}
	if pd.Args != nil {
		args = append([]string{}, *pd.Args...)
	}
	if len(command) > 0 && strings.TrimSpace(command[0]) == "" {
		add(errors.New("command[0] is empty"))
	}
	if n := len(command) + len(args); n > v1.MaxCommandEntries {
		add(fmt.Errorf("command and args have %d entries; the limit is %d", n, v1.MaxCommandEntries))
	}
	for i, a := range slices.Concat(command, args) {
		if len(a) > v1.MaxCommandEntryBytes || strings.ContainsRune(a, 0) {
			add(fmt.Errorf("command/args entry %d is longer than %d bytes or contains a NUL byte", i, v1.MaxCommandEntryBytes))
		}
	}
	return command, args
}

func checkQuantity(field, v, examples string) error {
	if strings.TrimSpace(v) == "" {
		return fmt.Errorf("%s is empty", field)
	}
	q, err := resource.ParseQuantity(v)
	if err != nil {
		return fmt.Errorf("%s %q is not a Kubernetes quantity (for example %s)", field, v, examples)
	}
	if q.Sign() <= 0 {
		return fmt.Errorf("%s must be > 0, got %q", field, v)
	}
	return nil
}

func quota(place string, d quotaDoc, errs []error) (fleet.Quota, []error) {
	if d.Servers < 0 {
		errs = append(errs, fmt.Errorf("%s: servers must be >= 0 (0 = unlimited), got %d", place, d.Servers))
	}
	if d.MemoryMiB < 0 {
		errs = append(errs, fmt.Errorf("%s: memoryMiB must be >= 0 (0 = unlimited), got %d", place, d.MemoryMiB))
	}
	if d.ComputePercent < 0 {
		errs = append(errs, fmt.Errorf("%s: computePercent must be >= 0 (0 = unlimited), got %d", place, d.ComputePercent))
	}
	return fleet.Quota{Servers: d.Servers, MemoryMiB: d.MemoryMiB, ComputePercent: d.ComputePercent}, errs
}

func quotaMap(place, what string, m map[string]quotaDoc, errs []error) (map[string]fleet.Quota, []error) {
	if len(m) == 0 {
		return nil, errs
	}
	out := make(map[string]fleet.Quota, len(m))
	for _, name := range slices.Sorted(maps.Keys(m)) {
		if strings.TrimSpace(name) == "" {
			errs = append(errs, fmt.Errorf("%s: a %s name is empty", place, what))
			continue
		}
		out[name], errs = quota(place+"."+name, m[name], errs)
	}
	return out, errs
}

// shapeErrors walks the decoded JSON v against the document type t and
// reports every object key that t has no field for and every value of the
// wrong kind, each with its path. null is accepted anywhere (the zero value).
// It works on the untyped JSON form, so that every problem is found, not
// only the first one the typed decoder meets.
func shapeErrors(v any, t reflect.Type, path string) []error {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if v == nil {
		return nil
	}
	where := path
	if where == "" {
		where = "top level"
	}
	wrong := func(want string) []error {
		return []error{fmt.Errorf("%s: must be %s, got %s", where, want, jsonKind(v))}
	}
	var errs []error
	switch {
	case t.Kind() == reflect.String:
		// Scalars become strings in the typed decode, as in kubectl
		// (cpu: 2 is "2"; note that YAML 1.1 reads an unquoted yes, no,
		// on, off, y or n as a boolean, so it becomes "true" or "false").
		switch v.(type) {
		case string, float64, bool:
		default:
			return wrong("a string")
		}
	case t.Kind() == reflect.Int || t.Kind() == reflect.Int64:
		f, ok := v.(float64)
		if !ok || f != float64(int64(f)) {
			return wrong("a whole number")
		}
	case t.Kind() == reflect.Struct:
		m, ok := v.(map[string]any)
		if !ok {
			return wrong("a mapping")
		}
		fields := map[string]reflect.Type{}
		for f := range t.Fields() {
			name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
			fields[name] = f.Type
		}
		for _, k := range slices.Sorted(maps.Keys(m)) {
			ft, ok := fields[k]
			if !ok {
				errs = append(errs, fmt.Errorf("%s: unknown field %q (known: %s)", where, k, strings.Join(slices.Sorted(maps.Keys(fields)), ", ")))
				continue
			}
			errs = append(errs, shapeErrors(m[k], ft, joinPath(path, k))...)
		}
	case t.Kind() == reflect.Slice:
		l, ok := v.([]any)
		if !ok {
			return wrong("a list")
		}
		for i, e := range l {
			errs = append(errs, shapeErrors(e, t.Elem(), fmt.Sprintf("%s[%d]", path, i))...)
		}
	case t.Kind() == reflect.Map:
		m, ok := v.(map[string]any)
		if !ok {
			return wrong("a mapping")
		}
		for _, k := range slices.Sorted(maps.Keys(m)) {
			errs = append(errs, shapeErrors(m[k], t.Elem(), joinPath(path, k))...)
		}
	}
	return errs
}

// jsonKind names the kind of a decoded JSON value for messages.
func jsonKind(v any) string {
	switch x := v.(type) {
	case string:
		return fmt.Sprintf("the string %q", x)
	case float64:
		return fmt.Sprintf("the number %v", x)
	case bool:
		return fmt.Sprintf("%v", x)
	case []any:
		return "a list"
	case map[string]any:
		return "a mapping"
	default:
		return fmt.Sprintf("%T", v)
	}
}

func joinPath(path, k string) string {
	if path == "" {
		return k
	}
	return path + "." + k
}

// Profiles returns every profile in file order.
func (c *Catalog) Profiles() []fleet.Profile {
	out := make([]fleet.Profile, len(c.profiles))
	for i, p := range c.profiles {
		out[i] = clone(p)
	}
	return out
}

// Profile returns the profile called name, and whether there is one.
func (c *Catalog) Profile(name string) (fleet.Profile, bool) {
	for _, p := range c.profiles {
		if p.Name == name {
			return clone(p), true
		}
	}
	return fleet.Profile{}, false
}

// For returns the profiles that a member of groups may use (see
// fleet.Profile.Allows), in file order; never nil.
func (c *Catalog) For(groups []string) []fleet.Profile {
	out := []fleet.Profile{}
	for _, p := range c.profiles {
		if p.Allows(groups) {
			out = append(out, clone(p))
		}
	}
	return out
}

// Quotas returns the configured caps. Users and Groups are nil when the file
// has none.
func (c *Catalog) Quotas() fleet.Quotas {
	return fleet.Quotas{
		DefaultUser: c.quotas.DefaultUser,
		Users:       maps.Clone(c.quotas.Users),
		Groups:      maps.Clone(c.quotas.Groups),
	}
}

func clone(p fleet.Profile) fleet.Profile {
	p.Groups = slices.Clone(p.Groups)
	p.Command, p.Args = slices.Clone(p.Command), slices.Clone(p.Args)
	return p
}
