package harness

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
)

// Tools are the paths of the binaries and files the cluster needs.
type Tools struct {
	KubeAPIServer string
	Etcd          string
	Kwok          string
	// KwokStages is the multi-document kwok Stage file passed with --config.
	KwokStages string
	// RedisServer is Debian's redis-server, used by the tests through
	// broker/redistest; listed here so one check covers every missing part.
	RedisServer string
}

// ErrToolsMissing is wrapped by FindTools when a binary or file is missing.
var ErrToolsMissing = errors.New("e2e tools missing")

// FindTools looks for kube-apiserver, etcd, kwok and kwok-stages.yaml in
// binDir (normally e2e/.bin, filled by `go tool task e2e:tools`) and for
// redis-server on PATH and in /usr/bin. The error wraps ErrToolsMissing and
// names every missing part and how to get it.
func FindTools(binDir string) (Tools, error) {
	abs, err := filepath.Abs(binDir)
	if err != nil {
		return Tools{}, fmt.Errorf("tools dir %s: %w", binDir, err)
	}
	t := Tools{
		KubeAPIServer: filepath.Join(abs, "kube-apiserver"),
		Etcd:          filepath.Join(abs, "etcd"),
		Kwok:          filepath.Join(abs, "kwok"),
		KwokStages:    filepath.Join(abs, "kwok-stages.yaml"),
	}
	var missing []error
	for _, p := range []string{t.KubeAPIServer, t.Etcd, t.Kwok, t.KwokStages} {
		if _, err := os.Stat(p); err != nil {
			missing = append(missing, fmt.Errorf("%s (run `go tool task e2e:tools`)", p))
		}
	}
	if p, err := exec.LookPath("redis-server"); err == nil {
		t.RedisServer = p
	} else if _, err := os.Stat("/usr/bin/redis-server"); err == nil {
		t.RedisServer = "/usr/bin/redis-server"
	} else {
		missing = append(missing, errors.New("redis-server (apt-get install redis-server)"))
	}
	if len(missing) > 0 {
		return t, fmt.Errorf("%w: %w", ErrToolsMissing, errors.Join(missing...))
	}
	return t, nil
}
