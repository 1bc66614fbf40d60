package redisschema_test

import (
	"crypto/sha256"
	"encoding/hex"
	"reflect"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/gpubroker/gpubroker/broker/api/redisschema"
)

// TestKeys pins every key's exact name: a rename is a schema change that
// the broker and the agents must make together.
func TestKeys(t *testing.T) {
	k := redisschema.New("p:")
	tests := []struct {
		name string
		got  string
		want string
	}{
		{"marker", k.Marker(), "p:{gpubroker}:marker"},
		{"gpus", k.GPUs(), "p:{gpubroker}:gpus"},
		{"gpu", k.GPU("GPU-1"), "p:{gpubroker}:gpu:GPU-1"},
		{"gpu prefix", k.GPUPrefix(), "p:{gpubroker}:gpu:"},
		{"index prefix", k.IndexPrefix(), "p:{gpubroker}:idx:"},
		{"avail index", k.AvailIndex("sliced", "H200"), "p:{gpubroker}:idx:sliced:a:m:H200"},
		{"full index", k.FullIndex(redisschema.Pool("mig", "3g.71gb"), ""), "p:{gpubroker}:idx:mig:3g.71gb:f:m:"},
		{"all avail", k.AllAvail("mps"), "p:{gpubroker}:idx:mps:a:all"},
		{"all full", k.AllFull("exclusive"), "p:{gpubroker}:idx:exclusive:f:all"},
		{"mode prefix", k.ModePrefix(), "p:{gpubroker}:mode:"},
		{"mode gpus", k.ModeGPUs("mig"), "p:{gpubroker}:mode:mig"},
		{"allocs", k.Allocs(), "p:{gpubroker}:allocs"},
		{"usage", k.Usage(), "p:{gpubroker}:usage"},
		{"marker epoch", k.MarkerEpoch(), "p:{gpubroker}:marker:epoch"},
		{"server", k.Server("a:b", "c d"), "p:{gpubroker}:srv:a%3Ab:c+d"},
		{"previous server record", k.ServerPrevious("a:b", "c d"), "p:{gpubroker}:srvprev:a%3Ab:c+d"},
		{"events", k.Events("alice", ""), "p:{gpubroker}:ev:alice:"},
		{"user servers", k.UserServers("alice"), "p:{gpubroker}:usrv:alice"},
		{"all servers", k.AllServers(), "p:{gpubroker}:srvs"},
		{"login", k.Login("st"), "p:{gpubroker}:web:" + sha("st") + ":login"},
		{"session", k.Session("id"), "p:{gpubroker}:web:" + sha("id") + ":session"},
		{"session refresh", k.SessionRefresh("id"), "p:{gpubroker}:web:" + sha("id") + ":refresh"},
		{"session by digest", k.SessionByDigest(sha("id")), "p:{gpubroker}:web:" + sha("id") + ":session"},
		{"hand-off", k.Handoff("code"), "p:{gpubroker}:nb:" + sha("code") + ":handoff"},
		{"host session", k.HostSession("id"), "p:{gpubroker}:nb:" + sha("id") + ":host"},
		{"proxy activity", k.ProxyActivity("sp1"), "p:{gpubroker}:nb:act:sp1"},
		{"reclaim policy", k.ReclaimPolicy(), "p:{gpubroker}:reclaim:policy"},
		{"reclaim policy version", k.ReclaimPolicyVersion(), "p:{gpubroker}:reclaim:policy:version"},
		{"reclaim policy history", k.ReclaimPolicyHistory(), "p:{gpubroker}:reclaim:policy:history"},
		{"idle state", k.IdleState("sp1"), "p:{gpubroker}:reclaim:spawn:sp1"},
		{"audit", k.Audit(), "p:{gpubroker}:audit"},
		{"agent nodes", k.AgentNodes(), "p:{gpubroker}:agent:nodes"},
		{"agent node", k.AgentNode("n"), "p:{gpubroker}:agent:node:n"},
		{"samples", k.Samples("s"), "p:{gpubroker}:agent:s:s"},
		{"desired quota", k.DesiredQuota("s"), "p:{gpubroker}:agent:qd:s"},
		{"applied quota", k.AppliedQuota("s"), "p:{gpubroker}:agent:qa:s"},
		{"agent audit", k.AgentAudit(), "p:{gpubroker}:agent:audit"},
		{"quota changed", k.QuotaChanged(), "p:{gpubroker}:agent:quota-changed"},
		{"agent modes", k.AgentModes("n"), "p:{gpubroker}:agent:modes:n"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, tc.got); diff != "" {
				t.Errorf("key (-want +got):\n%s", diff)
			}
		})
	}
	if n, m := len(tests), reflect.TypeFor[redisschema.Keys]().NumMethod(); n != m {
		t.Errorf("%d keys pinned, Keys has %d methods: pin the new key here", n, m)
	}
}

// TestPool: a pool is a sharing mode, "sliced" for none, and a MIG
// instance's pool names its profile.
func TestPool(t *testing.T) {
	for _, tc := range []struct{ mode, mig, want string }{
		{"", "", "sliced"}, {"sliced", "", "sliced"}, {"mps", "", "mps"}, {"exclusive", "", "exclusive"}, {"mig", "1g.18gb", "mig:1g.18gb"},
	} {
		if got := redisschema.Pool(tc.mode, tc.mig); got != tc.want {
			t.Errorf("Pool(%q, %q) = %q, want %q", tc.mode, tc.mig, got, tc.want)
		}
	}
}

// sha is the hex SHA-256 that session keys hold instead of the value.
func sha(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])
}

// TestEveryKeyHasTheOneHashTag calls every method of Keys (with "x" for
// each argument): each key starts with the prefix and the hash tag and
// holds no other '{' or '}', so no key escapes the one Cluster slot.
func TestEveryKeyHasTheOneHashTag(t *testing.T) {
	k := reflect.ValueOf(redisschema.New("pre:"))
	for i := range k.NumMethod() {
		m := k.Type().Method(i)
		args := make([]reflect.Value, m.Type.NumIn()-1)
		for j := range args {
			args[j] = reflect.ValueOf("x")
		}
		key := k.Method(i).Call(args)[0].String()
		rest, ok := strings.CutPrefix(key, "pre:"+redisschema.HashTag+":")
		if !ok || strings.ContainsAny(rest, "{}") {
			t.Errorf("%s = %q, want pre:%s:<rest> without braces in <rest>", m.Name, key, redisschema.HashTag)
		}
	}
}

// TestSessionKeysHideTheValue: a key never contains the cookie value or
// the OAuth state it stands for.
func TestSessionKeysHideTheValue(t *testing.T) {
	k := redisschema.New("")
	secret := "cookie-value-123"
	for _, key := range []string{k.Login(secret), k.Session(secret), k.SessionRefresh(secret)} {
		if strings.Contains(key, secret) {
			t.Errorf("key %q contains the value", key)
		}
	}
}

// TestServerKeysDoNotCollide: names with the separator map to different keys.
func TestServerKeysDoNotCollide(t *testing.T) {
	k := redisschema.New("")
	if a, b := k.Server("a:b", "c"), k.Server("a", "b:c"); a == b {
		t.Errorf("a:b/c and a/b:c share %q", a)
	}
}
