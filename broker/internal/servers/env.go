package servers

import (
	"crypto/rand"
	"errors"
	"fmt"
	"regexp"
	"strings"

	v1 "github.com/gpubroker/gpubroker/broker/api/v1"
)

var envName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// reservedEnvPrefixes are set by gpubroker on every pod; a request may not
// override them, or a notebook could lift its own limits.
var reservedEnvPrefixes = []string{"GPUBROKER_", "NVIDIA_", "CUDA_VISIBLE_DEVICES", "CUDA_MPS_", "LD_PRELOAD", v1.EnvNotebookToken}

// hubEnvPrefix marks the variables JupyterHub gives the servers it spawns
// (JUPYTERHUB_SERVICE_PREFIX, JUPYTERHUB_API_TOKEN, ...). Only the hub may
// set them: the broker takes a server whose pod carries them for one the
// hub started (spawner.Client.NotebookPrefix), and a user's own server must
// not pass for one.
const hubEnvPrefix = "JUPYTERHUB_"

// secretWords mark an env name as a credential: its value goes into the
// server's Secret even when the caller sent it as plain env (JupyterHub
// sends JUPYTERHUB_API_TOKEN among its plain spawner environment).
var secretWords = []string{"TOKEN", "SECRET", "PASSWORD", "KEY", "CREDENTIAL"}

// MaxEnv is the most environment variables a create may carry, plain and
// secret together; MaxEnvValueBytes bounds each value.
const (
	MaxEnv           = 256
	MaxEnvValueBytes = 32 << 10
)

// splitEnv validates a create's environment and returns the plain and the
// secret parts; hub says the hub asks (JUPYTERHUB_* names are allowed).
// Every problem is reported at once.
func splitEnv(env, secretEnv map[string]string, hub bool) (plain, secret map[string]string, err error) {
	var errs []error
	if n := len(env) + len(secretEnv); n > MaxEnv {
		errs = append(errs, fmt.Errorf("%d environment variables given; the limit is %d", n, MaxEnv))
	}
	plain, secret = map[string]string{}, map[string]string{}
	check := func(name, value string) bool {
		ok := true
		if !envName.MatchString(name) {
			errs = append(errs, fmt.Errorf("environment variable name %q is not a valid name (letters, digits and '_', not starting with a digit)", name))
			ok = false
		}
		for _, p := range reservedEnvPrefixes {
			if strings.HasPrefix(strings.ToUpper(name), p) {
				errs = append(errs, fmt.Errorf("environment variable %s is set by gpubroker and cannot be overridden", name))
				ok = false
			}
		}
		if !hub && strings.HasPrefix(strings.ToUpper(name), hubEnvPrefix) {
			errs = append(errs, fmt.Errorf("environment variable %s is JupyterHub's to set; only a server the hub starts carries it", name))
			ok = false
		}
		if len(value) > MaxEnvValueBytes {
			errs = append(errs, fmt.Errorf("environment variable %s is %d bytes long; the limit is %d", name, len(value), MaxEnvValueBytes))
			ok = false
		}
		return ok
	}
	for name, value := range env {
		if !check(name, value) {
			continue
		}
		if looksSecret(name) {
			secret[name] = value
		} else {
			plain[name] = value
		}
	}
	for name, value := range secretEnv {
		if _, dup := env[name]; dup {
			errs = append(errs, fmt.Errorf("environment variable %s is given both as env and as secretEnv", name))
			continue
		}
		if check(name, value) {
			secret[name] = value
		}
	}
	return plain, secret, errors.Join(errs...)
}

func looksSecret(name string) bool {
	upper := strings.ToUpper(name)
	for _, w := range secretWords {
		if strings.Contains(upper, w) {
			return true
		}
	}
	return false
}

// newNotebookToken returns a fresh notebook token: 26 base32 characters
// from crypto/rand (130 bits).
func newNotebookToken() string { return rand.Text() }
