// Package config holds the configuration of the gpubroker binary: one Config
// struct for both modes (serve and dev), loaded from flags and GPUBROKER_*
// environment variables and validated in one pass.
//
// Design notes:
//   - Precedence is flag > environment > default. Load applies defaults,
//     then every non-empty GPUBROKER_<FLAG> variable through the flag's own
//     parser, then the command-line flags, so a value is parsed the same way
//     wherever it comes from. The variable of a flag is EnvName(flag).
//   - getenv is injected; this is the only package that reads the
//     environment, and main passes os.Getenv.
//   - Load reports syntax problems (unknown flags, unparsable durations);
//     Validate reports semantic ones (missing required values, bad URLs,
//     files that do not exist). Both return every problem at once with
//     errors.Join, one line per problem, naming the flag and its variable.
//     Validate has no side effects: it only stats files.
//   - Secrets never sit in Config: it holds the paths of the files that do
//     (RedisPasswordFile, HubTokenFile). ReadSecret returns a Secret, which
//     prints and logs as REDACTED. Config.LogValue redacts the password of
//     a Redis URL.
//   - Mode decides what is required: serve needs an OIDC issuer and
//     audience, a Redis (URL or Sentinel) and a profiles file; in dev mode
//     each of them may be empty, meaning the embedded one (miniredis,
//     devissuer, catalog.Default, a simulated cluster).
//
// Usage from main:
//
//	cfg, err := config.Load(config.ModeServe, os.Args[2:], os.Getenv, os.Stdout)
//	if errors.Is(err, flag.ErrHelp) { exit 0 } // the help text went to os.Stdout
//	if err == nil { err = cfg.Validate() }
//	if err != nil { print err; exit 2 }
//	if cfg.CheckConfig { print "configuration is valid"; exit 0 }
//	log := cfg.Logger(os.Stderr)
package config
