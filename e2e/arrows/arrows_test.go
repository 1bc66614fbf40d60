package arrows

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"go/parser"
	"go/token"
	"io"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// rule governs a group of the project's packages; see the top of
// rules_test.go for how to read one.
type rule struct {
	group   string
	pkgs    []string
	may     []string
	never   []string
	stdOnly bool
	tests   bool
	testMay []string
	why     string
}

// reservation names packages that only the rules of groups by may import.
type reservation struct {
	pkgs []string
	by   []string
	why  string
}

func join(lists ...[]string) []string { return slices.Concat(lists...) }

// topFolders are the module's top-level folders; a pattern that starts with
// one of them is relative to the module.
var topFolders = []string{"broker", "spawner", "limiter", "frontend", "deploy", "e2e"}

// node is one package of the build graph.
type node struct {
	path        string
	std         bool
	imports     []string // of its non-test files
	testImports []string // of its test files, itself left out
	dir         string
	files       []string // non-test Go files (cgo ones included)
	testFiles   []string
}

// graph is every package the project's packages and their tests depend on.
type graph struct {
	module string
	nodes  map[string]*node
	own    []string // the project's packages, sorted
}

// listJSON is the part of `go list -json` output the checker reads.
type listJSON struct {
	ImportPath   string
	Dir          string
	Standard     bool
	ForTest      string
	Module       *struct{ Path string }
	Imports      []string
	TestImports  []string
	XTestImports []string
	GoFiles      []string
	CgoFiles     []string
	TestGoFiles  []string
	XTestGoFiles []string
}

// loadGraph runs `go list -deps -test -json ./...` at the module root.
func loadGraph(t *testing.T) *graph {
	t.Helper()
	mod, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		t.Fatalf("go env GOMOD: %v", err)
	}
	root := filepath.Dir(strings.TrimSpace(string(mod)))
	cmd := exec.Command("go", "list", "-deps", "-test", "-json", "./...")
	cmd.Dir = root
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, stderr.String())
	}
	modPath, err := exec.Command("go", "list", "-m").Output()
	if err != nil {
		t.Fatalf("go list -m: %v", err)
	}
	g := &graph{module: strings.TrimSpace(string(modPath)), nodes: map[string]*node{}}
	dec := json.NewDecoder(bytes.NewReader(out))
	for {
		var p listJSON
		if err := dec.Decode(&p); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatalf("go list output: %v", err)
		}
		// Test variants ("p [q.test]") and test mains repeat packages that
		// are listed plainly too; the checker reads each package once.
		if p.ForTest != "" || strings.Contains(p.ImportPath, " ") || strings.HasSuffix(p.ImportPath, ".test") {
			continue
		}
		n := &node{path: p.ImportPath, std: p.Standard, imports: p.Imports, dir: p.Dir,
			files: join(p.GoFiles, p.CgoFiles), testFiles: join(p.TestGoFiles, p.XTestGoFiles)}
		for _, imp := range join(p.TestImports, p.XTestImports) {
			if imp != p.ImportPath && !slices.Contains(n.testImports, imp) {
				n.testImports = append(n.testImports, imp)
			}
		}
		g.nodes[n.path] = n
		if g.isOwn(n.path) {
			g.own = append(g.own, n.path)
		}
	}
	slices.Sort(g.own)
	return g
}

func (g *graph) isOwn(path string) bool {
	return path == g.module || strings.HasPrefix(path, g.module+"/")
}

// rel names a package for messages: module-relative when it is the project's.
func (g *graph) rel(path string) string {
	if r, ok := strings.CutPrefix(path, g.module+"/"); ok {
		return r
	}
	return path
}

// abs turns a module-relative pattern into an import-path pattern.
func (g *graph) abs(pattern string) string {
	first, _, _ := strings.Cut(pattern, "/")
	if slices.Contains(topFolders, first) {
		return g.module + "/" + pattern
	}
	return pattern
}

// score says how specifically pattern names path: 0 when it does not
// match, else longer bases score higher and an exact name beats "/...".
func (g *graph) score(pattern, path string) int {
	pattern = g.abs(pattern)
	if base, tree := strings.CutSuffix(pattern, "/..."); tree {
		if path == base || strings.HasPrefix(path, base+"/") {
			return 2 * len(base)
		}
		return 0
	}
	if path == pattern {
		return 2*len(pattern) + 1
	}
	return 0
}

func (g *graph) matchesAny(patterns []string, path string) bool {
	for _, p := range patterns {
		if g.score(p, path) > 0 {
			return true
		}
	}
	return false
}

// ruleFor returns the most specific rule that governs path, or an error
// when none does or two are equally specific.
func (g *graph) ruleFor(rules []rule, path string) (*rule, error) {
	var best *rule
	bestScore, tie := 0, false
	for i := range rules {
		for _, p := range rules[i].pkgs {
			switch s := g.score(p, path); {
			case s > bestScore:
				best, bestScore, tie = &rules[i], s, false
			case s > 0 && s == bestScore && best != &rules[i]:
				tie = true
			}
		}
	}
	switch {
	case best == nil:
		return nil, fmt.Errorf("%s: no rule governs it; give it a row in e2e/arrows/rules_test.go", g.rel(path))
	case tie:
		return nil, fmt.Errorf("%s: two rules govern it equally; make one more specific", g.rel(path))
	}
	return best, nil
}

// where finds the import of imp in the package's files: "file.go:12".
func (g *graph) where(n *node, imp string, tests bool) string {
	files := n.files
	if tests {
		files = n.testFiles
	}
	fset := token.NewFileSet()
	for _, f := range files {
		af, err := parser.ParseFile(fset, filepath.Join(n.dir, f), nil, parser.ImportsOnly)
		if err != nil {
			continue
		}
		for _, is := range af.Imports {
			if p, err := strconv.Unquote(is.Path.Value); err == nil && p == imp {
				pos := fset.Position(is.Pos())
				return fmt.Sprintf("%s:%d", f, pos.Line)
			}
		}
	}
	return "?"
}

// reach walks the imports from start (breadth first, so each chain found is
// a shortest one) and calls hit for each package reached; hit returns
// whether to walk on from it. chain gives the path from start to a package.
func (g *graph) reach(start []string, hit func(path string) bool) (chain func(string) []string) {
	parent := map[string]string{}
	queue := []string{}
	for _, s := range start {
		if _, seen := parent[s]; !seen {
			parent[s] = ""
			queue = append(queue, s)
		}
	}
	for len(queue) > 0 {
		p := queue[0]
		queue = queue[1:]
		if !hit(p) {
			continue
		}
		if n := g.nodes[p]; n != nil {
			for _, imp := range n.imports {
				if _, seen := parent[imp]; !seen {
					parent[imp] = p
					queue = append(queue, imp)
				}
			}
		}
	}
	return func(p string) []string {
		var c []string
		for ; p != ""; p = parent[p] {
			c = append(c, g.rel(p))
		}
		slices.Reverse(c)
		return c
	}
}

// check returns every wrong arrow in g, one sentence each.
func check(g *graph, rules []rule, reserved []reservation) []string {
	var problems []string
	add := func(format string, args ...any) { problems = append(problems, fmt.Sprintf(format, args...)) }
	groups := map[string]bool{}
	for _, r := range rules {
		groups[r.group] = true
	}
	for _, path := range g.own {
		n := g.nodes[path]
		r, err := g.ruleFor(rules, path)
		if err != nil {
			add("%v", err)
			continue
		}
		for _, side := range []struct {
			tests   bool
			imports []string
			may     []string
			label   string
		}{
			{false, n.imports, r.may, ""},
			{true, n.testImports, join(r.may, r.testMay), " (tests)"},
		} {
			for _, imp := range side.imports {
				for _, res := range reserved {
					if g.matchesAny(res.pkgs, imp) && !g.matchesAny(res.pkgs, path) && !slices.Contains(res.by, r.group) {
						add("%s%s imports %s (%s): only %s may: %s", g.rel(path), side.label, g.rel(imp),
							g.where(n, imp, side.tests), strings.Join(res.by, ", "), res.why)
					}
				}
			}
			if side.tests && !r.tests {
				continue
			}
			for _, imp := range side.imports {
				if g.isOwn(imp) && !g.matchesAny(side.may, imp) {
					add("%s%s imports %s (%s), which the rule %q does not allow (it may import %v): %s",
						g.rel(path), side.label, g.rel(imp), g.where(n, imp, side.tests), r.group, side.may, r.why)
				}
			}
			for _, pattern := range r.never {
				found := []string{}
				chain := g.reach(side.imports, func(p string) bool {
					if g.score(pattern, p) > 0 {
						found = append(found, p)
						return false
					}
					return true
				})
				for _, f := range found {
					c := chain(f)
					add("%s%s reaches %s, which the rule %q forbids: %s → %s (first arrow at %s): %s",
						g.rel(path), side.label, g.rel(f), r.group, g.rel(path), strings.Join(c, " → "),
						g.where(n, g.abs(c[0]), side.tests), r.why)
				}
			}
			if r.stdOnly && !side.tests {
				found := []string{}
				chain := g.reach(side.imports, func(p string) bool {
					if n := g.nodes[p]; n != nil && n.std || g.isOwn(p) {
						return true
					}
					found = append(found, p)
					return false
				})
				for _, f := range found {
					c := chain(f)
					add("%s%s reaches %s, but the rule %q allows only the standard library: %s → %s (first arrow at %s): %s",
						g.rel(path), side.label, f, r.group, g.rel(path), strings.Join(c, " → "),
						g.where(n, g.abs(c[0]), side.tests), r.why)
				}
			}
		}
	}
	slices.Sort(problems)
	return slices.Compact(problems)
}

// TestArrows holds the project's import graph, its tests' included, to the
// rule table, and keeps the table from rotting: every row governs at least
// one package, and every project package a row names exists.
func TestArrows(t *testing.T) {
	g := loadGraph(t)
	if len(g.own) < 20 {
		t.Fatalf("go list found only %d of the project's packages: %v", len(g.own), g.own)
	}
	t.Run("no wrong arrow", func(t *testing.T) {
		for _, p := range check(g, rules, reserved) {
			t.Error(p)
		}
	})
	t.Run("rules name real packages", func(t *testing.T) {
		exists := func(pattern string) bool {
			if top, ok := strings.CutSuffix(pattern, "/..."); ok && slices.Contains(topFolders, top) {
				return true // a top-level folder of the fixed layout, whatever it holds now
			}
			return slices.ContainsFunc(g.own, func(p string) bool { return g.score(pattern, p) > 0 })
		}
		for _, r := range rules {
			governs := slices.ContainsFunc(r.pkgs, func(p string) bool {
				top, ok := strings.CutSuffix(p, "/...")
				return ok && slices.Contains(topFolders, top)
			}) || slices.ContainsFunc(g.own, func(p string) bool {
				got, err := g.ruleFor(rules, p)
				return err == nil && got.group == r.group
			})
			if !governs {
				t.Errorf("rule %q governs no package: remove it or fix its pkgs %v", r.group, r.pkgs)
			}
			for _, p := range join(r.pkgs, r.may, r.never, r.testMay) {
				if g.isOwn(g.abs(p)) && !exists(p) {
					t.Errorf("rule %q names %s, which is no package of the project", r.group, p)
				}
			}
		}
		for _, res := range reserved {
			for _, p := range res.pkgs {
				if !exists(p) {
					t.Errorf("reservation names %s, which is no package of the project", p)
				}
			}
		}
	})
}

// fakeGraph builds a graph of module example.com/m from "pkg: imp imp |
// testimp" lines; paths starting with a top-level folder are the module's,
// and a path without a dot in its first element is the standard library's.
func fakeGraph(lines ...string) *graph {
	g := &graph{module: "example.com/m", nodes: map[string]*node{}}
	name := func(p string) string { return g.abs(p) }
	get := func(p string) *node {
		if n := g.nodes[p]; n != nil {
			return n
		}
		first, _, _ := strings.Cut(p, "/")
		n := &node{path: p, std: !strings.Contains(first, ".")}
		g.nodes[p] = n
		if g.isOwn(p) {
			g.own = append(g.own, p)
		}
		return n
	}
	for _, l := range lines {
		pkg, rest, _ := strings.Cut(l, ":")
		code, tests, _ := strings.Cut(rest, "|")
		n := get(name(strings.TrimSpace(pkg)))
		for _, imp := range strings.Fields(code) {
			n.imports = append(n.imports, get(name(imp)).path)
		}
		for _, imp := range strings.Fields(tests) {
			n.testImports = append(n.testImports, get(name(imp)).path)
		}
	}
	slices.Sort(g.own)
	return g
}

// TestCheckNamesWrongArrows runs the real table over small graphs: a clean
// one passes, and each kind of wrong arrow is reported with its chain.
func TestCheckNamesWrongArrows(t *testing.T) {
	clean := []string{
		"broker/api/v1: strings",
		"broker/internal/fleet: broker/api/v1 errors",
		"broker/internal/reclaim: broker/internal/fleet broker/api/v1 net/http",
		"broker/internal/httpapi: broker/internal/reclaim github.com/labstack/echo/v4 | broker/internal/redisstore",
		"broker/internal/redisstore: broker/internal/fleet github.com/redis/go-redis/v9",
		"frontend: broker/api/v1 net/http | broker/api/v1/v1test",
		"broker/api/v1/v1test: broker/api/v1",
		"broker/internal/app: broker/internal/httpapi broker/internal/redisstore frontend",
		"broker/cmd/gpubroker: broker/internal/app",
		"e2e: | broker/api/v1 e2e/harness k8s.io/client-go/kubernetes",
		"e2e/harness: broker/api/v1",
	}
	if got := check(fakeGraph(clean...), rules, reserved); len(got) != 0 {
		t.Fatalf("the clean graph has problems:\n%s", strings.Join(got, "\n"))
	}
	tests := []struct {
		name  string
		extra []string // lines added to the clean graph
		want  []string // substrings of problems that must be reported
	}{
		{
			name:  "a domain package reaching Redis through another",
			extra: []string{"broker/internal/reclaim: broker/internal/audit", "broker/internal/audit: github.com/redis/go-redis/v9"},
			want: []string{
				"broker/internal/reclaim reaches github.com/redis/go-redis/v9, which the rule \"reclaim\" forbids: broker/internal/reclaim → broker/internal/audit → github.com/redis/go-redis/v9",
				"broker/internal/httpapi reaches github.com/redis/go-redis/v9, which the rule \"httpapi\" forbids: broker/internal/httpapi → broker/internal/reclaim → broker/internal/audit → github.com/redis/go-redis/v9",
				"broker/internal/audit reaches github.com/redis/go-redis/v9, but the rule \"audit\" allows only the standard library",
			},
		},
		{
			name:  "httpapi importing the store",
			extra: []string{"broker/internal/httpapi: broker/internal/redisstore"},
			want: []string{
				"broker/internal/httpapi imports broker/internal/redisstore (?), which the rule \"httpapi\" does not allow",
				"broker/internal/httpapi reaches broker/internal/redisstore, which the rule \"httpapi\" forbids: broker/internal/httpapi → broker/internal/redisstore",
			},
		},
		{
			name:  "the frontend importing the domain",
			extra: []string{"frontend: broker/internal/fleet"},
			want:  []string{"frontend imports broker/internal/fleet (?), which the rule \"frontend\" does not allow (it may import [broker/api/v1])"},
		},
		{
			name:  "a test importing the composition root",
			extra: []string{"broker/internal/httpapi: | broker/internal/app"},
			want:  []string{"broker/internal/httpapi (tests) imports broker/internal/app (?): only broker main, dev main, app/dev may"},
		},
		{
			name:  "e2e reaching broker/internal through a helper",
			extra: []string{"e2e/harness: broker/internal/fleet"},
			want: []string{
				"e2e (tests) reaches broker/internal/fleet, which the rule \"e2e\" forbids: e2e → e2e/harness → broker/internal/fleet",
				"e2e/harness imports broker/internal/fleet (?), which the rule \"e2e\" does not allow",
			},
		},
		{
			name:  "a package no rule governs",
			extra: []string{"broker/internal/newpart: broker/api/v1"},
			want:  []string{"broker/internal/newpart: no rule governs it; give it a row in e2e/arrows/rules_test.go"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := check(fakeGraph(append(slices.Clone(clean), tc.extra...)...), rules, reserved)
			for _, w := range tc.want {
				if !slices.ContainsFunc(got, func(p string) bool { return strings.Contains(p, w) }) {
					t.Errorf("no problem says %q; got:\n%s", w, strings.Join(got, "\n"))
				}
			}
		})
	}
}
