// Package arrows holds the project's allowed dependencies between its own
// packages as a table (rules_test.go) and the test that holds the import
// graph to it (go list -deps -test -json ./...), so that a wrong arrow fails
// `go tool task test` instead of rotting the layout. ARCHITECTURE.md
// ("Dependencies") is the prose of the same table.
//
// The checks, each naming the package, the import's file and line and the
// whole import chain:
//   - every package of the module is governed by one row (the most specific
//     of its pkgs patterns); a new package without one fails;
//   - its direct imports of the project's packages are in the row's may;
//   - nothing in the row's never is reached through any chain of imports,
//     and a stdOnly row reaches no library outside the standard one;
//   - rows with tests hold the package's test files to the same (plus
//     testMay, the public test support);
//   - reserved packages (the composition roots) are imported, from code or
//     tests, only by the groups named for them.
//
// The package has no code of its own; it imports nothing of the project.
package arrows
