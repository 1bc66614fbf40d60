package config_test

import (
	"strings"
	"testing"
	"time"

	"github.com/gpubroker/gpubroker/broker/internal/config"
	"github.com/gpubroker/gpubroker/limiter/cliconfig"
	"github.com/gpubroker/gpubroker/limiter/cliconfig/cliconfigtest"
)

func TestWebLoginSettings(t *testing.T) {
	c, _, err := config.Load(config.ModeServe, []string{"--oidc-audience=aud", "--session-ttl=30s"},
		cliconfigtest.Environ(map[string]string{"GPUBROKER_OIDC_CLIENT_SECRET_FILE": "/nonexistent/secret"}))
	if c.ClientID() != "aud" || c.SessionTTL != 30*time.Second {
		t.Errorf("client id %q ttl %s, want the audience and 30s", c.ClientID(), c.SessionTTL)
	}
	for _, want := range []string{
		"--session-ttl (GPUBROKER_SESSION_TTL): must be at least 1m0s, got 30s",
		"--oidc-client-secret-file (GPUBROKER_OIDC_CLIENT_SECRET_FILE)",
	} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Validate() = %v, want it to mention %q", err, want)
		}
	}
	c.OIDCClientID = "web"
	if c.ClientID() != "web" {
		t.Errorf("client id %q, want web", c.ClientID())
	}
	c.OIDCClientSecretFile = writeFile(t, "secret", "s3cret\n")
	if s, err := c.ClientSecret(); err != nil || s.Reveal() != "s3cret" || s.String() != cliconfig.Redacted {
		t.Errorf("ClientSecret() = %v, %v", s.Reveal(), err)
	}
}
