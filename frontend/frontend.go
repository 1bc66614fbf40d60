package frontend

import (
	"bytes"
	"context"
	"crypto/subtle"
	"embed"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"time"
)

//go:embed templates/*.html
var templateFS embed.FS

//go:embed static
var staticFS embed.FS

// Paths of the web login that pages link to (served by the auth package).
const (
	LoginPath  = "/auth/login"
	LogoutPath = "/auth/logout"
)

// csrfField is the form field holding the session's CSRF token; the API
// calls carry it in csrfHeader. Both match the auth package's names.
const (
	csrfField  = "csrf"
	csrfHeader = "X-CSRF-Token"
)

// FragmentHeader asks a page for the content of its main element only
// (value "main"), rendered from the same template as the whole page: the
// pages' script fetches it to keep a live page equal to a fresh load.
const FragmentHeader = "X-Gpubroker-Fragment"

// ErrSignedOut means the request has no live session: the page redirects
// to the sign-in.
var ErrSignedOut = errors.New("frontend: not signed in")

// Viewer is the signed-in user of a request.
type Viewer struct {
	User   string
	Groups []string
	Admin  bool
	// CSRF is the session's token for forms and API writes.
	CSRF string
}

// Sessions says who is signed in.
type Sessions interface {
	// Viewer returns the request's signed-in user; ErrSignedOut (matched
	// with errors.Is) when there is no live session; any other error means
	// it cannot tell now (a 503 page).
	Viewer(ctx context.Context, r *http.Request) (Viewer, error)
}

// Sample is one usage reading of a server's slice.
type Sample struct {
	Time time.Time
	// SMPercent is the SM utilization of the whole GPU, 0..100.
	SMPercent float64
	// MemoryMiB is device memory in use, MiB.
	MemoryMiB int64
}

// Usage reads a server's usage samples. Optional: nil means the samples are
// not available (yet), and pages say "no data yet".
type Usage interface {
	// Samples returns the samples of the server's current spawn, oldest
	// first, from the last window (e.g. 1 h); none is not an error.
	Samples(ctx context.Context, user, server, spawnID string) ([]Sample, error)
	// Current returns the spawn's newest sample when it is fresh and
	// complete; ok is false when there is none (unknown, never zero).
	Current(ctx context.Context, user, server, spawnID string) (s Sample, ok bool, err error)
}

// Deps are what the pages need. API and Sessions are required.
type Deps struct {
	// API is the broker's REST API; pages call it in-process.
	API http.Handler
	// Sessions tells who is signed in.
	Sessions Sessions
	// Usage reads usage samples; nil: "no data yet".
	Usage Usage
	// Log receives page errors; nil discards.
	Log *slog.Logger
	// Notice is shown at the top of every page (dev mode says what is
	// simulated); "" shows none.
	Notice string
	// Now is the clock; nil means time.Now.
	Now func() time.Time
}

// Handler serves the pages. Create it with New.
type Handler struct {
	deps  Deps
	api   apiClient
	pages map[string]*template.Template
	mux   *http.ServeMux
}

// New parses the embedded templates and returns the pages' handler. It
// fails when API or Sessions is nil, or a template does not parse.
func New(deps Deps) (*Handler, error) {
	var errs []error
	if deps.API == nil {
		errs = append(errs, errors.New("frontend: Deps.API is nil"))
	}
	if deps.Sessions == nil {
		errs = append(errs, errors.New("frontend: Deps.Sessions is nil"))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	if deps.Log == nil {
		deps.Log = slog.New(slog.DiscardHandler)
	}
	if deps.Now == nil {
		deps.Now = time.Now
	}
	h := &Handler{deps: deps, api: apiClient{h: deps.API}, pages: map[string]*template.Template{}}
	names, err := fs.Glob(templateFS, "templates/*.html")
	if err != nil {
		return nil, fmt.Errorf("frontend: templates: %w", err)
	}
	for _, n := range names {
		base := strings.TrimSuffix(strings.TrimPrefix(n, "templates/"), ".html")
		if base == "layout" || base == "fields" {
			continue
		}
		t, err := template.New("layout.html").Funcs(funcs).ParseFS(templateFS, "templates/layout.html", "templates/fields.html", n)
		if err != nil {
			return nil, fmt.Errorf("frontend: template %s: %w", n, err)
		}
		h.pages[base] = t
	}
	static, err := fs.Sub(staticFS, "static")
	if err != nil {
		return nil, fmt.Errorf("frontend: static: %w", err)
	}
	mux := http.NewServeMux()
	mux.Handle("GET /static/", http.StripPrefix("/static/", staticHandler(http.FileServerFS(static))))
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, "/servers", http.StatusFound)
	})
	for _, rt := range pageRoutes {
		mux.HandleFunc(rt.pattern, h.page(rt.admin, func(w http.ResponseWriter, r *http.Request, v Viewer) { rt.serve(h, w, r, v) }))
	}
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		h.errorPage(w, r, nil, http.StatusNotFound, "There is no page at "+r.URL.Path+".")
	})
	h.mux = mux
	return h, nil
}

// ServeHTTP serves the pages and their assets.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	hd := w.Header()
	hd.Set("Content-Security-Policy", "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; base-uri 'none'; frame-ancestors 'none'")
	hd.Set("X-Content-Type-Options", "nosniff")
	hd.Set("Referrer-Policy", "same-origin")
	hd.Set("X-Frame-Options", "DENY")
	h.mux.ServeHTTP(w, r)
}

// staticHandler adds caching to the embedded assets (they change only with
// the binary).
func staticHandler(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Cache-Control", "public, max-age=300")
		next.ServeHTTP(w, r)
	})
}

// pageFunc renders one page for a signed-in viewer.
type pageFunc func(w http.ResponseWriter, r *http.Request, v Viewer)

// pageRoutes are the pages and their forms: a ServeMux pattern, whether
// only admins may use it, and its handler. The README's "Web pages" table
// describes every GET one (readme_test.go).
var pageRoutes = []struct {
	pattern string
	admin   bool
	serve   func(*Handler, http.ResponseWriter, *http.Request, Viewer)
}{
	{"GET /servers", false, (*Handler).serversPage},
	{"POST /servers", false, (*Handler).launch},
	{"GET /servers/{name}", false, (*Handler).serverPage},
	{"POST /servers/{name}/stop", false, (*Handler).stop},
	{"POST /servers/{name}/remove", false, (*Handler).remove},
	{"POST /servers/{name}/resize", false, (*Handler).resize},
	{"POST /servers/{name}/extend", false, (*Handler).extend},
	{"GET /admin/reclaim", true, (*Handler).policyPage},
	{"POST /admin/reclaim", true, (*Handler).savePolicy},
	{"GET /admin/fleet", true, (*Handler).fleetPage},
	{"GET /admin/audit", true, (*Handler).auditPage},
}

// page wraps a pageFunc: it finds the viewer (or redirects to the sign-in),
// refuses non-admins on admin pages and checks the CSRF field of POSTs.
func (h *Handler) page(admin bool, f pageFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		v, err := h.deps.Sessions.Viewer(r.Context(), r)
		switch {
		case errors.Is(err, ErrSignedOut):
			next := r.URL.RequestURI()
			if r.Method != http.MethodGet {
				next = r.URL.Path
			}
			http.Redirect(w, r, LoginPath+"?next="+url.QueryEscape(next), http.StatusSeeOther)
			return
		case err != nil:
			h.deps.Log.WarnContext(r.Context(), "page: session lookup failed", "err", err)
			h.errorPage(w, r, nil, http.StatusServiceUnavailable, "Signing in is unavailable right now. Try again in a few seconds.")
			return
		}
		if admin && !v.Admin {
			h.errorPage(w, r, &v, http.StatusForbidden, "This page is for administrators (members of the admin group).")
			return
		}
		if r.Method == http.MethodPost {
			if err := r.ParseForm(); err != nil {
				h.errorPage(w, r, &v, http.StatusBadRequest, "The form could not be read.")
				return
			}
			if v.CSRF == "" || subtle.ConstantTimeCompare([]byte(r.PostForm.Get(csrfField)), []byte(v.CSRF)) != 1 {
				h.errorPage(w, r, &v, http.StatusForbidden, "This form was not sent by this page, or the page is too old (its security token is missing or wrong). Reload the page and try again.")
				return
			}
		}
		f(w, r, v)
	}
}

// view is what every template gets.
type view struct {
	Title  string
	Nav    string // the nav entry to mark current
	Viewer *Viewer
	Notice string
	Data   any
}

// render executes page with data and writes it with status.
func (h *Handler) render(w http.ResponseWriter, r *http.Request, status int, page string, v view) {
	t, ok := h.pages[page]
	if !ok {
		h.deps.Log.ErrorContext(r.Context(), "page: no template", "page", page)
		http.Error(w, "internal error", http.StatusInternalServerError)
		return
	}
	v.Notice = h.deps.Notice
	var buf bytes.Buffer
	var err error
	if r.Header.Get(FragmentHeader) == "main" {
		// The live page's update: the main element's content alone, from
		// the same template as the whole page.
		err = t.ExecuteTemplate(&buf, "content", v)
	} else {
		err = t.Execute(&buf, v)
	}
	if err != nil {
		h.deps.Log.ErrorContext(r.Context(), "page: render failed", "page", page, "err", err)
		http.Error(w, "internal error", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	// A write error means the browser went away.
	_, _ = w.Write(buf.Bytes())
}

// errorData is the error page's data.
type errorData struct {
	Status  int
	Heading string
	Message string
	Login   bool // offer a fresh sign-in
}

func (h *Handler) errorPage(w http.ResponseWriter, r *http.Request, v *Viewer, status int, msg string) {
	heading := http.StatusText(status)
	switch status {
	case http.StatusForbidden:
		heading = "Not allowed"
	case http.StatusNotFound:
		heading = "Not found"
	}
	h.render(w, r, status, "error", view{Title: heading, Viewer: v, Data: errorData{Status: status, Heading: heading, Message: msg}})
}

// LoginFailed renders a sign-in that could not complete: the reason and a
// fresh sign-in button. It implements the web login's Pages.
func (h *Handler) LoginFailed(w http.ResponseWriter, r *http.Request, status int, reason string) {
	h.render(w, r, status, "error", view{Title: "Sign-in did not complete",
		Data: errorData{Status: status, Heading: "Sign-in did not complete", Message: sentence(reason), Login: true}})
}

// SignedOut renders the page after logout. It implements the web login's
// Pages.
func (h *Handler) SignedOut(w http.ResponseWriter, r *http.Request) {
	h.render(w, r, http.StatusOK, "signedout", view{Title: "Signed out"})
}

// apiFailed renders an API error as a page with the API's own words.
func (h *Handler) apiFailed(w http.ResponseWriter, r *http.Request, v Viewer, err error) {
	var ae *apiError
	if errors.As(err, &ae) {
		if ae.Status == http.StatusUnauthorized {
			http.Redirect(w, r, LoginPath+"?next="+url.QueryEscape(r.URL.Path), http.StatusSeeOther)
			return
		}
		h.errorPage(w, r, &v, ae.Status, sentence(ae.Body.Message))
		return
	}
	h.deps.Log.ErrorContext(r.Context(), "page: api call failed", "err", err)
	h.errorPage(w, r, &v, http.StatusInternalServerError, "Something went wrong on our side.")
}

// sentence capitalizes msg and ends it with a period.
func sentence(msg string) string {
	msg = strings.TrimSpace(msg)
	if msg == "" {
		return ""
	}
	msg = capitalize(msg)
	if !strings.HasSuffix(msg, ".") {
		msg += "."
	}
	return msg
}
