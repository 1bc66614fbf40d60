// Package config holds the configuration of the gpubroker binary: one Config
// struct for both modes (serve and dev), declared as one flag table
// (Config.Table, on limiter/cliconfig) and loaded from flags and GPUBROKER_*
// environment variables.
//
// Design notes:
//   - Each setting is declared once, in Table: name, variable, default,
//     help and check. The same declaration parses flags and variables,
//     prints --help (Usage), validates (Validate), logs the configuration
//     (LogValue) and is the README's configuration table (a test compares
//     them).
//   - Precedence is flag > environment > default. A flag given on the
//     command line wins and its variable is not parsed at all, so a bad
//     variable under a good flag is quiet. The variable of a flag is
//     EnvName(flag).
//   - The environment is injected (main passes os.Environ()); this package
//     reads none itself.
//   - Load tells the whole truth at once: unknown flags (with the closest
//     name), values that do not parse in flags or variables (naming the
//     form they want), and every failed check (missing required values, bad
//     URLs, files that do not exist), joined, one line each, naming the flag
//     as --name and its variable. GPUBROKER_ variables that no flag reads
//     come back as warnings with the closest name; those of the agent, the
//     hook, the stub driver and the tests are left alone. Validation has no
//     side effects: it only stats files.
//   - Secrets never sit in Config: it holds the paths of the files that do
//     (the Redis password file, HubTokenFile, ...). They are read into
//     cliconfig.Secret, which prints and logs as REDACTED; LogValue hides
//     the password of a Redis URL.
//   - Mode decides what is required: serve needs an OIDC issuer and
//     audience, a Redis (URL or Sentinel) and a profiles file; in dev mode
//     each of them may be empty, meaning the embedded one (miniredis,
//     devissuer, catalog.Default, a simulated cluster).
//
// Usage from main:
//
//	cfg, warnings, err := config.Load(config.ModeServe, os.Args[2:], os.Environ())
//	if errors.Is(err, cliconfig.ErrHelp) { print config.Usage(mode); exit 0 }
//	print each warning
//	if err != nil { print err; exit 2 }
//	if cfg.CheckConfig { print "configuration is valid"; exit 0 }
//	log := cfg.Logger(os.Stderr)
package config
