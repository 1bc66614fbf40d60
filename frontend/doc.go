// Package frontend serves gpubroker's web pages: my servers (the caller's
// quota and its use, launch, spawn progress, open, stop, start again,
// remove), a server's slice and usage, and for admins the idle-reclaim
// settings, the fleet and the audit log. Pages are rendered on the server
// with html/template from embedded templates and assets; there is no
// JavaScript build step and no CDN. One small script (static/app.js) keeps
// a live server's page current; every page works without it.
//
// # Live pages equal reloaded pages
//
// A page answers the request header FragmentHeader ("main") with the
// content of its main element alone, from the same template as the whole
// page. The server page of a live server (anything but stopped or failed)
// follows the server's event stream and, on every event (and every 30 s),
// fetches that fragment of its own URL and swaps it in: what the page shows
// is always what a fresh load would, at every state (step bar only while
// starting, resize, extend and the idle state once running, "Start again"
// and "Remove" once stopped). Forms the user is working in (focused,
// changed or showing problems) are kept as they are across an update.
//
// # Forms keep the user where they were
//
// A refused form renders its own page again (never an error page): every
// problem at once, next to its field (aria-invalid, an error paragraph
// named by aria-describedby), one message per problem, the input as typed,
// in the form's units: GiB and percent for resize, minutes for extend. The
// API's refusals are turned into those units from the answer's structured
// fields and limit (v1.Error.Fields and Limit), never shown in MiB or
// seconds the user did not type. Launching a running server's name shows
// that server; starting a stopped one with another profile asks first.
//
// # Phone
//
// Below 40rem wide, tables of class "stack" become one card per row with
// each cell labelled, and UUIDs are one line with an ellipsis (the full
// UUID is their title): nothing is wider than a 390 px screen.
//
// # Shape
//
// New(Deps) returns a *Handler, an http.Handler for every path outside
// /api/ and /auth/. It depends on three things only (STYLE B: the frontend
// shares broker/api/v1 and nothing else of the broker):
//
//   - Deps.API, the broker's REST API as an http.Handler. Pages call it
//     in-process with the browser's own cookie (and, on writes, the
//     session's CSRF token in X-CSRF-Token), so the API's authorization,
//     validation and wording apply to pages unchanged: "errors shown as the
//     API words them".
//   - Deps.Sessions, which says who is signed in (Viewer) or that nobody is
//     (ErrSignedOut: the page redirects to the sign-in).
//   - The browser talks to the API directly for one thing: the server's
//     event stream (EventSource sends the session cookie).
//
// *Handler also renders the web login's pages (LoginFailed, SignedOut),
// matching the auth package's Pages interface without importing it, and
// the notebook proxy's (Notebook: a server that is stopped, with a start
// that comes back to the notebook's address; starting, following the spawn
// and reloading into the notebook once it runs; not answering; and Error).
//
// # Honesty
//
// Parts of the product that do not exist yet are shown as such, never
// faked: a usage chart says "no data yet" until the node agent has reported
// samples for the slice (or when Deps.Usage is nil); a sample with a
// missing reading is left out, never drawn as zero.
//
// The server page's forms are in resize.go and idle.go, the launch form
// in pages.go; the shared field templates in templates/fields.html.
//
// The idle-reclaim settings page (reclaim.go, its form in policyform.go)
// edits every field of the policy in the form's units, sends every field
// on save, and previews what the reclaimer would do now to every running
// server under the edited, unsaved policy. A running server's page shows
// the reclaimer's idle state (active, idle since, unknown with the reason,
// not checked yet) and countdown from GET …/idle, and extends it (POST
// /servers/{name}/extend → POST …/extend); it resizes its slice (POST
// /servers/{name}/resize → PATCH …/slice); a refusal is shown in the API's
// words. The audit page shows the one audit log, filterable by source,
// user, server, actor, action and target.
//
// # Invariants
//
//   - Every POST checks the form's CSRF field against the session's token
//     (constant time) before anything else; a missing or wrong token is a
//     403 page and nothing changes.
//   - Every page sends a Content-Security-Policy without inline scripts or
//     styles, X-Content-Type-Options, Referrer-Policy and frame denial, and
//     Cache-Control: no-store.
//   - An expired or missing session on a page is a redirect to the sign-in
//     (with ?next= back to the page), never a 500.
//   - Admin pages answer 403 to non-admins (the API also refuses them).
//
// A *Handler is safe for concurrent use.
package frontend
