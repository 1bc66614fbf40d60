// Package proxy is the broker's notebook proxy: it serves each running
// server's notebook to its owner, HTTP and WebSocket (kernel channels,
// terminals), through net/http/httputil.ReverseProxy with every write
// flushed (nothing is buffered) and upgrades tunnelled.
//
// # Addresses
//
// A server's notebook is always served under its base URL,
// spawner.BaseURL(user, server) = /user/<user slug>/<server slug>/, which
// the pod gives the notebook as its base_url (GPUBROKER_BASE_URL). Slugs
// are injective, need no escaping and are never "." or "..".
//
//   - Path mode: at <public URL>/user/<u>/<s>/ on the broker's own origin.
//     Every notebook shares that origin with every other and with the
//     broker's pages (see the README for what a notebook page can then do).
//   - Host mode: at <pod name>.<notebook domain>/user/<u>/<s>/, one host per
//     server (the pod name is the server's unique DNS label), so notebooks
//     never share an origin (ARCHITECTURE.md invariant 7). The broker's
//     origin keeps /user/<u>/<s>/... as the entry: the status page of a
//     server that is not running, else the hand-off below. OpenURL is the
//     entry in both modes.
//
// # Who passes
//
// The server's owner, with a web session (path mode; in host mode the
// host's own session, below) or an OIDC bearer token; admins only with
// Config.AdminAccess. Everyone else, the hub token included, gets 404, as
// for a server that does not exist. Without credentials a browser is sent
// to the sign-in (which comes back), a script gets 401. A server that is not
// running gets a page (stopped: start it; starting: the page follows the
// spawn and enters the notebook when it runs) or 503 for a script; a
// notebook that does not answer gets a page or 502.
//
// # Host mode's hand-off
//
// The broker's session cookie belongs to the broker's host and never goes
// to a notebook host. On the entry, a signed-in owner of a running server
// gets a one-time code (Handoffs, Config.HandoffTTL, stored under its
// digest) and a redirect to <host>/.gpubroker/handoff?code=…; the host
// takes the code (once), checks it was made for this host, stores a host
// session bound to the server's current spawn and to the web session it
// came from, sets its id in a host-only HttpOnly cookie (__Host- prefixed
// over https) and redirects to the path kept with the code. Each request
// on the host checks that session (a checked one is trusted for
// Config.SessionCheck): it must name this host's server and spawn, and its
// web session must still exist, so signing out of the broker ends it.
//
// # What passes
//
// Toward the notebook: the browser's Host (Jupyter checks WebSocket Origin
// against it), X-Forwarded-*, the spawn's notebook token as
// "Authorization: token …" (Tokens); never the caller's Authorization, the
// broker's cookies (gpubroker_*, the host cookie) or headers. Back to the
// browser: no Set-Cookie of a broker cookie name, no Service-Worker-Allowed
// in path mode, and the notebook token taken out of every text answer
// (Jupyter writes it into its pages; scrub.go), so the browser never sees
// it. Unsafe methods and WebSocket handshakes from another origin are
// refused (403): Jupyter skips its own XSRF check for token-authenticated
// requests, which every proxied request is.
//
// # Activity
//
// Per spawn, this replica's last proxied request and its open WebSockets;
// Run writes them every Config.ActivityFlush (ActivityStore), stamped, so
// the reclaimer sums the replicas' WebSockets and takes the latest request.
// They are one activity signal among others, never a reason to reclaim.
//
// Invariants:
//   - The notebook token never reaches the browser, and the broker's
//     credentials never reach the notebook.
//   - A request reaches a notebook only for its owner (or an allowed
//     admin), and only the notebook of the server its path and host name.
//   - Nothing is buffered: bodies stream, WebSockets are tunnelled; the
//     server's whole-request deadlines are lifted for proxied requests.
//   - Caches never widen access: slug pairs map to names (injective, never
//     stale); running records are kept for one second; tokens per spawn.
//
// Everything here is safe for concurrent use.
package proxy
