package catalog

import (
	"encoding/json"
	"os"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"sigs.k8s.io/yaml"
)

// chartDir is the Helm chart, whose values carry the profiles file.
const chartDir = "../../../deploy/helm/gpubroker/"

// TestChartSchemaIsTheFileFormat keeps the chart's values.schema.json true
// to this package's file format: a profile, a slice, the quotas and a quota
// have exactly the fields the file has, so a field added here is refused by
// helm until the schema has it, and a typo is refused before install.
func TestChartSchemaIsTheFileFormat(t *testing.T) {
	b, err := os.ReadFile(chartDir + "values.schema.json")
	if err != nil {
		t.Fatal(err)
	}
	var schema struct {
		Definitions map[string]struct {
			Properties map[string]json.RawMessage `json:"properties"`
		} `json:"definitions"`
		Properties map[string]struct {
			Properties map[string]json.RawMessage `json:"properties"`
		} `json:"properties"`
	}
	if err := json.Unmarshal(b, &schema); err != nil {
		t.Fatal(err)
	}
	var profile struct {
		Properties map[string]struct {
			Properties map[string]json.RawMessage `json:"properties"`
		} `json:"properties"`
	}
	prof, _ := json.Marshal(schema.Definitions["profile"])
	if err := json.Unmarshal(prof, &profile); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name   string
		schema []string
		doc    reflect.Type
	}{
		{"profile", keys(schema.Definitions["profile"].Properties), reflect.TypeFor[profileDoc]()},
		{"profile slice", keys(profile.Properties["slice"].Properties), reflect.TypeFor[sliceDoc]()},
		{"quotas", keys(schema.Properties["quotas"].Properties), reflect.TypeFor[quotasDoc]()},
		{"quota", keys(schema.Definitions["quota"].Properties), reflect.TypeFor[quotaDoc]()},
	}
	for _, tc := range tests {
		var fields []string
		for f := range tc.doc.Fields() {
			fields = append(fields, strings.Split(f.Tag.Get("json"), ",")[0])
		}
		slices.Sort(fields)
		if diff := cmp.Diff(fields, tc.schema); diff != "" {
			t.Errorf("%s: the chart's schema and the file format differ (-file +schema):\n%s", tc.name, diff)
		}
	}
}

// TestChartDefaultProfilesParse: the profiles and quotas the chart installs
// by default are a valid file.
func TestChartDefaultProfilesParse(t *testing.T) {
	b, err := os.ReadFile(chartDir + "values.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var v struct {
		Profiles any `json:"profiles"`
		Quotas   any `json:"quotas"`
	}
	if err := yaml.Unmarshal(b, &v); err != nil {
		t.Fatal(err)
	}
	file, err := yaml.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Parse(file); err != nil {
		t.Errorf("the chart's default profiles and quotas do not parse: %v", err)
	}
}

func keys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}
