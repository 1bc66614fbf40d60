package arrows

// The rule table: which of the project's packages may import which, and
// what they must never reach. It is ARCHITECTURE.md's "Dependencies" section
// written as data; TestArrows holds the tree to it.
//
// Reading a row: pkgs are the packages it governs (a path, or path/... for
// the path and everything below it; the most specific row wins). may lists
// the project's packages their code may import directly; any other arrow
// into the project is a wrong one. never lists packages that must not be
// reached through any chain of imports, the project's or a library's.
// stdOnly: besides the project's own packages, only the standard library,
// through any chain of its code (tests may use go-cmp). tests: the package's test files are held to may
// (plus testMay) and never as well; elsewhere tests may reach further (the
// broker's tests run against the real Redis store), within reserved.
//
// Paths are relative to the module (github.com/gpubroker/gpubroker) when
// they start with one of its top-level folders; others are import paths.
// When a rule is wrong rather than the arrow, change the rule here and say
// why in its why; when a new package appears, give it a row (or let a
// path/... row cover it) — an unclassified package fails the test. A row or
// name that matches no package fails too, except a whole top-level folder
// ("deploy/..."): the layout's folders are fixed, whatever they hold.

// Infrastructure: storage, cluster, HTTP server framework, identity
// provider and GPU driver clients. Domain packages reach none of them.
var (
	redisClient = []string{"github.com/redis/go-redis/...", "github.com/alicebob/miniredis/..."}
	kubeClient  = []string{"k8s.io/client-go/..."}
	httpServer  = []string{"github.com/labstack/echo/..."}
	identity    = []string{"github.com/coreos/go-oidc/...", "github.com/go-jose/..."}
	gpuDriver   = []string{"github.com/NVIDIA/go-nvml/..."}

	infrastructure = join(redisClient, kubeClient, httpServer, identity, gpuDriver)
)

// Packages whose only job is to support tests, public so that every part's
// tests (and e2e) may use them.
var testSupport = []string{
	"broker/redistest", "broker/devissuer", "broker/jupytertest", "broker/api/v1/v1test",
	"e2e/testdeps", "limiter/hook/stubtest", "limiter/cliconfig/cliconfigtest",
	"spawner/jupyterhub/pytest",
	"deploy/...", // the chart's Go tooling (rendering it for tests)
}

var rules = []rule{
	// The contracts.
	{
		group: "wire contract", pkgs: []string{"broker/api/v1", "broker/api/redisschema"}, stdOnly: true,
		never: []string{"net/http"},
		why: "the two contract packages every part shares (REST and pod names; Redis key names): " +
			"std only, so that the agent, the spawner, the frontend and e2e can import them and nothing else of the broker",
	},

	// The domain: pure, table-tested, no infrastructure.
	{
		group: "fleet", pkgs: []string{"broker/internal/fleet"}, stdOnly: true,
		may:   []string{"broker/api/v1"},
		never: []string{"net/http"},
		why:   "the domain everything points at (GPUs, slices, placement, quotas, servers, errors): std only",
	},
	{
		group: "audit", pkgs: []string{"broker/internal/audit"}, stdOnly: true,
		may:   []string{"broker/api/v1"},
		never: []string{"net/http"},
		why:   "the audit record and its query (ARCHITECTURE.md invariant 6): a value type, std only",
	},
	{
		group: "reclaim", pkgs: []string{"broker/internal/reclaim"},
		may:   []string{"broker/api/v1", "broker/internal/fleet", "broker/internal/audit"},
		never: join(infrastructure, []string{"broker/internal/redisstore"}),
		why: "the reclaim domain: policy, evidence, decision, ladder; storage is behind its own interfaces, the Lease is the composition root's. " +
			"net/http stays allowed: its two evidence sources, the notebook server's and JupyterHub's REST APIs, are " +
			"plain HTTP clients in this package (Prober, Hub), the only way that evidence exists",
	},
	{
		group: "catalog", pkgs: []string{"broker/internal/catalog"},
		may:   []string{"broker/api/v1", "broker/internal/fleet"},
		never: join(infrastructure, []string{"net/http"}),
		why: "the profiles-and-quotas file: parses YAML (sigs.k8s.io/yaml) and Kubernetes quantities " +
			"(k8s.io/apimachinery/pkg/api/resource, the units a pod spec uses); no client",
	},

	// Services: they coordinate the domain with the parts behind their interfaces.
	{
		group: "servers", pkgs: []string{"broker/internal/servers"},
		may: []string{"broker/api/v1", "broker/internal/audit", "broker/internal/fleet", "spawner",
			"limiter/agent/agentstore"},
		never: join(httpServer, identity, gpuDriver, []string{"broker/internal/redisstore"}),
		why: "the server lifecycle; its interfaces name the spawner's pod types and the agent contract's quota and " +
			"sample types (agentstore, the contract's one reader), whose concrete stores the composition root passes in; " +
			"it audits each lifecycle action with who acted (audit)",
	},
	{
		group: "reconcile", pkgs: []string{"broker/internal/reconcile"},
		may:   []string{"broker/api/v1", "broker/internal/fleet", "spawner"},
		never: join(redisClient, httpServer, identity, gpuDriver),
		why:   "pods versus the allocation records: fleet's store and the spawner's pods behind its interfaces",
	},
	{
		group: "leader", pkgs: []string{"broker/internal/leader"},
		never: join(redisClient, httpServer, identity, gpuDriver),
		why:   "one replica at a time through a Kubernetes Lease: client-go is its job, nothing of the project",
	},

	// Adapters: they implement the domain's interfaces on one technology each.
	{
		group: "redisstore", pkgs: []string{"broker/internal/redisstore"},
		may: []string{"broker/api/redisschema", "broker/api/v1", "broker/internal/fleet", "broker/internal/audit",
			"broker/internal/reclaim", "limiter/agent/agentstore"},
		never: join(kubeClient, httpServer, identity, gpuDriver, []string{"github.com/alicebob/miniredis/..."}),
		why: "the broker's Redis code: implements the stores fleet, reclaim, audit and auth declare, with keys from " +
			"redisschema; reads the agents' samples through agentstore",
	},
	{
		group: "auth", pkgs: []string{"broker/internal/auth"},
		may:   []string{"broker/api/v1"},
		never: join(redisClient, kubeClient, httpServer, gpuDriver),
		why:   "OIDC login and bearer verification (go-oidc, oauth2); sessions are stored behind its own interface",
	},
	{
		group: "httpapi", pkgs: []string{"broker/internal/httpapi"},
		may: []string{"broker/api/v1", "broker/internal/fleet", "broker/internal/audit", "broker/internal/auth",
			"broker/internal/reclaim"},
		never: join(redisClient, kubeClient, gpuDriver, []string{"broker/internal/redisstore", "limiter/agent/agentstore",
			"broker/internal/servers", "spawner"}),
		why: "the REST API (echo): domain types in, wire types out; every store and service is behind deps.go's " +
			"interfaces, so it reaches no store, no Redis and no Kubernetes client",
	},
	{
		group: "proxy", pkgs: []string{"broker/internal/proxy"},
		may: []string{"broker/api/v1", "broker/internal/fleet", "broker/internal/auth", "spawner"},
		never: join(redisClient, httpServer, gpuDriver, []string{"broker/internal/redisstore", "broker/internal/servers",
			"broker/internal/httpapi", "frontend"}),
		why: "the notebook proxy (net/http's ReverseProxy): it checks web sessions and bearer tokens through auth, " +
			"reads servers (fleet) and their pods and notebook tokens (the spawner's cache); its hand-off codes, host " +
			"sessions and activity are behind its own interfaces (redisstore implements them), its pages behind Pages",
	},
	{
		group: "frontend", pkgs: []string{"frontend/..."}, tests: true, testMay: testSupport,
		may:   []string{"broker/api/v1"},
		never: join(infrastructure, []string{"broker/internal/..."}),
		why: "the web pages call the API in-process through the interfaces they declare: the broker's API types " +
			"and nothing else of it",
	},
	{
		group: "metrics", pkgs: []string{"broker/internal/metrics"},
		may:   []string{},
		never: join(kubeClient, httpServer, identity, gpuDriver, []string{"github.com/alicebob/miniredis/..."}),
		why: "the broker's Prometheus series (client_golang): implements the Metrics interfaces servers, reconcile, " +
			"reclaim and httpapi declare with plain arguments, so it imports nothing of the project; go-redis for its " +
			"command hook, net/http for the Kubernetes transport wrapper and the handler, not client-go",
	},
	{
		group: "config", pkgs: []string{"broker/internal/config"},
		may:   []string{"broker/internal/fleet", "spawner", "limiter/cliconfig"},
		never: join(httpServer, identity, gpuDriver, []string{"broker/internal/redisstore"}),
		why:   "the broker's one flag table (on cliconfig); it names the spawner's and fleet's settings types",
	},

	// The composition roots and the mains.
	{
		group: "app", pkgs: []string{"broker/internal/app"},
		may: []string{"broker/api/v1", "broker/internal/...", "frontend", "spawner",
			"limiter/agent/agentstore", "limiter/cliconfig"},
		never: join(gpuDriver, []string{"github.com/alicebob/miniredis/...", "k8s.io/client-go/kubernetes/fake/...",
			"broker/internal/app/dev", "broker/devissuer", "spawner/devcluster", "limiter/agent", "net/http/httptest"}),
		why: "the broker's composition root, the only package that sees every concrete type; " +
			"it links no simulation (that is app/dev's)",
	},
	{
		group: "app/dev", pkgs: []string{"broker/internal/app/dev"},
		may: []string{"broker/api/v1", "broker/internal/...", "broker/devissuer", "spawner/...", "limiter/agent",
			"limiter/agent/agentstore", "limiter/cliconfig"},
		why: "dev mode's composition root: app.Run on embedded and simulated parts (miniredis, the dev issuer, " +
			"the spawner's simulated cluster and pod runner, the node agent with its store on go-nvml's mock GPUs)",
	},
	{
		group: "broker main", pkgs: []string{"broker/cmd/gpubroker"},
		may: []string{"broker/internal/app", "broker/internal/config", "limiter/cliconfig"},
		why: "the production broker's main: parse, build, run; with dev main, the only importer of the composition root",
	},
	{
		group: "dev main", pkgs: []string{"broker/cmd/gpubroker-dev"},
		may: []string{"broker/internal/app", "broker/internal/app/dev", "limiter/cliconfig"},
		why: "gpubroker-dev's main, the one importer of app/dev",
	},
	{
		group: "agent main", pkgs: []string{"limiter/cmd/..."}, tests: true, testMay: testSupport,
		may:   []string{"limiter/agent", "limiter/agent/agentstore", "limiter/cliconfig"},
		never: join(httpServer, identity, []string{"broker/internal/..."}),
		why:   "gpubroker-agent's main: the agent's own composition root (NVML, client-go, Redis, metrics)",
	},

	// The parts outside the broker: they share broker/api/v1 (and the agent
	// redisschema) with it and nothing else; their tests too.
	{
		group: "spawner", pkgs: []string{"spawner/..."}, tests: true, testMay: testSupport,
		may:   []string{"broker/api/v1", "spawner"},
		never: join(redisClient, httpServer, identity, gpuDriver, []string{"broker/internal/..."}),
		why:   "pod spec and lifecycle on client-go; shares only the API types with the broker",
	},
	{
		group: "spawner/devcluster", pkgs: []string{"spawner/devcluster"}, tests: true, testMay: testSupport,
		may:   []string{"broker/api/v1", "spawner"},
		never: join(redisClient, httpServer, identity, gpuDriver, []string{"broker/internal/..."}),
		why:   "dev mode's simulated cluster: client-go's fake clientset plays the API server and the kubelet",
	},
	{
		group: "limiter", pkgs: []string{"limiter/..."}, tests: true, testMay: testSupport,
		may:   []string{"broker/api/v1", "limiter/region", "limiter/agent/agentstore", "limiter/cliconfig"},
		never: join(httpServer, identity, []string{"broker/internal/..."}),
		why: "the hook's Go side, the agent and the flag tables: they share with the broker only the wire " +
			"contract (v1) and, through agentstore, the Redis schema",
	},
	{
		group: "limiter/hook/podhook", pkgs: []string{"limiter/hook/podhook"}, tests: true,
		may:     []string{"broker/api/v1", "limiter/agent", "limiter/hook/stubtest"},
		testMay: join(testSupport, []string{"limiter/region", "spawner", "spawner/runner"}),
		never:   join(httpServer, identity, []string{"broker/internal/..."}),
		why: "the pod runner's limiter (the real hook over the stub driver, the slice laid out by the agent's own " +
			"code): it hands the runner a Wrap function and never imports it, so spawner and limiter stay apart; " +
			"its test runs pods through the runner",
	},
	{
		group: "limiter/agent/agentstore", pkgs: []string{"limiter/agent/agentstore"}, tests: true, testMay: testSupport,
		may:   []string{"broker/api/v1", "broker/api/redisschema"},
		never: join(kubeClient, httpServer, identity, gpuDriver, []string{"broker/internal/..."}),
		why:   "the agent contract (ARCHITECTURE.md, Redis): written by the agent, read by the broker, so it imports neither",
	},
	{
		group: "limiter/region", pkgs: []string{"limiter/region"}, stdOnly: true, tests: true,
		may:     []string{},
		testMay: join(testSupport, []string{"broker/api/v1"}),
		why: "the Go mirror of the region ABI (the C header is the truth), read by the agent; std only. " +
			"Its layout test compares the header's default paths with the pod contract's (v1)",
	},

	// The chart.
	{
		group: "deploy", pkgs: []string{"deploy/..."}, tests: true,
		testMay: join(testSupport, []string{"broker/api/v1", "spawner"}),
		never:   []string{"broker/internal/..."},
		why: "Go beside the Helm chart renders and checks it (Helm's SDK) and imports nothing of the project; " +
			"its tests hold the chart to the pod contract (v1) and the spawner's pods",
	},

	// Test support and e2e.
	{
		group: "test support", pkgs: []string{"broker/redistest", "broker/devissuer", "broker/jupytertest", "broker/api/v1/v1test",
			"e2e/testdeps", "limiter/hook/stubtest", "limiter/cliconfig/cliconfigtest", "spawner/jupyterhub/pytest"},
		may:   []string{"broker/api/v1", "e2e/testdeps", "limiter/cliconfig"},
		never: []string{"broker/internal/..."},
		why: "public helpers for every part's tests: a real redis-server, a real OIDC issuer, Debian's Jupyter notebook " +
			"server with a kernel client, fixtures, the Debian package list",
	},
	{
		group: "serverstest", pkgs: []string{"broker/internal/servers/serverstest"},
		may: []string{"broker/api/v1", "broker/internal/audit", "broker/internal/catalog", "broker/internal/fleet",
			"broker/internal/redisstore", "broker/internal/servers", "broker/redistest", "spawner"},
		why: "the broker's lifecycle on real parts for the broker's own tests, wired as the composition root wires it " +
			"(with its audit log, and the actor its tests act as)",
	},
	{
		group: "e2e", pkgs: []string{"e2e/..."}, tests: true, testMay: testSupport,
		may:   []string{"broker/api/v1", "e2e/harness", "limiter/agent/agentstore", "limiter/hook/podhook", "spawner", "spawner/runner"},
		never: []string{"broker/internal/..."},
		why: "end-to-end tests through public interfaces only: the binaries, the REST API (v1), client-go, " +
			"the agent contract, the public test helpers, the pod runner that plays the kubelet for the notebook " +
			"pods, its limiter (limiter/hook/podhook: the real hook over the stub driver) and the spawner's names of the pod contract (PodName, SecretName)",
	},
}

// reserved are packages only the named groups may import, from their code
// or from their tests (a package's own tests excepted).
var reserved = []reservation{
	{
		pkgs: []string{"broker/internal/app"}, by: []string{"broker main", "dev main", "app/dev"},
		why: "nothing imports the composition root except the mains (and dev mode's root, which builds on it)",
	},
	{
		pkgs: []string{"broker/internal/app/dev"}, by: []string{"dev main"},
		why: "dev mode's composition root belongs to gpubroker-dev alone; the production binary never links it",
	},
}
