package console

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/labstack/echo/v4"
	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/internal/apptest"
	"github.com/onceflow/onceflow/internal/auth"
)

const consoleHost = "console.example"

// newTestServer is a console with auth and no databases: enough for what
// is decided before a page reads anything.
func newTestServer(t *testing.T, a Authorizer, logs *bytes.Buffer) (*Server, *echo.Echo) {
	t.Helper()
	pages, err := parsePages()
	require.NoError(t, err)
	if logs == nil {
		logs = &bytes.Buffer{}
	}
	sessions, err := newSessions(maxSessions, time.Now)
	require.NoError(t, err)
	s := &Server{cfg: Config{Auth: a, Live: time.Second, SessionTTL: 12 * time.Hour}, logger: slog.New(slog.NewTextHandler(logs, nil)), pages: pages, sessions: sessions}
	return s, s.Handler(consoleHost).(*echo.Echo)
}

// do serves a request of method for target on the console at consoleHost,
// as a page of that console would send it, with the extra headers kv.
func do(e http.Handler, method, target string, form url.Values, kv ...string) *httptest.ResponseRecorder {
	var body *strings.Reader
	if form != nil {
		body = strings.NewReader(form.Encode())
	} else {
		body = strings.NewReader("")
	}
	r := httptest.NewRequest(method, "http://"+consoleHost+target, body)
	if form != nil {
		r.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	if method == http.MethodPost {
		r.Header.Set("Origin", "http://"+consoleHost)
	}
	for i := 0; i+1 < len(kv); i += 2 {
		if kv[i] == "Host" {
			r.Host = kv[i+1]
			continue
		}
		r.Header.Set(kv[i], kv[i+1])
	}
	rr := httptest.NewRecorder()
	e.ServeHTTP(rr, r)
	return rr
}

// Every route but /healthz and the sign-in shows a stranger nothing: a
// page sends them to the sign-in page (which brings them back), anything
// else is refused; a customer's credentials are a stranger's. The routes
// are the handler's own, so a page added later is checked too.
func TestEveryPageNeedsAnOperator(t *testing.T) {
	t.Parallel()
	_, e := newTestServer(t, TokenAuth{Token: "s3cret"}, nil)
	open := map[string]bool{"GET /healthz": true, "GET /login": true, "POST /login": true, "POST /logout": true}
	var checked int
	for _, rt := range e.Routes() {
		if open[rt.Method+" "+rt.Path] || strings.HasPrefix(rt.Name, "github.com/labstack") {
			continue
		}
		path := strings.ReplaceAll(rt.Path, ":id", "1")
		for _, creds := range [][]string{nil, {"Cookie", sessionCookieName + "=not-the-token"}, {"Authorization", "Bearer customer"}} {
			rr := do(e, rt.Method, path+"?q=x", url.Values{}, creds...)
			if rt.Method == http.MethodGet {
				require.Equal(t, http.StatusSeeOther, rr.Code, "%s %s %v", rt.Method, path, creds)
				require.Equal(t, "/login?next="+url.QueryEscape(path+"?q=x"), rr.Header().Get("Location"))
			} else {
				require.Contains(t, []int{http.StatusUnauthorized, http.StatusForbidden}, rr.Code, "%s %s %v", rt.Method, path, creds)
			}
			require.NotContains(t, rr.Body.String(), "<table", "a refusal shows no data")
		}
		checked++
	}
	require.GreaterOrEqual(t, checked, 12, "the console's routes")
	require.Equal(t, http.StatusOK, do(e, http.MethodGet, "/healthz", nil).Code)
	require.Equal(t, http.StatusOK, do(e, http.MethodGet, "/login", nil).Code)
}

// A request for a host the console was not configured for is refused (DNS
// rebinding), whatever its credentials; /healthz answers probes by address.
func TestHostsTheConsoleAnswers(t *testing.T) {
	t.Parallel()
	_, e := newTestServer(t, TokenAuth{Token: "s3cret"}, nil)
	for host, want := range map[string]int{
		consoleHost:                    http.StatusSeeOther,
		"CONSOLE.example:80":           http.StatusSeeOther,
		"evil.example":                 http.StatusMisdirectedRequest,
		"console.example.evil.example": http.StatusMisdirectedRequest,
		"127.0.0.1:8090":               http.StatusMisdirectedRequest,
		"":                             http.StatusMisdirectedRequest,
	} {
		if want == http.StatusSeeOther {
			require.Equal(t, want, do(e, http.MethodGet, "/orders", nil, "Host", host).Code, host)
			require.Equal(t, http.StatusOK, do(e, http.MethodGet, "/login", nil, "Host", host).Code, host)
			continue
		}
		rr := do(e, http.MethodGet, "/orders", nil, "Host", host, "Cookie", sessionCookieName+"=s3cret")
		require.Equal(t, want, rr.Code, host)
		if host != "" {
			require.NotContains(t, rr.Body.String(), host, "the refusal does not repeat the name")
		}
		require.Equal(t, want, do(e, http.MethodPost, "/login", url.Values{"token": {"s3cret"}}, "Host", host).Code, host)
		require.Equal(t, http.StatusOK, do(e, http.MethodGet, "/healthz", nil, "Host", host).Code, host)
	}

	addr := func(s string) net.Addr { a, err := net.ResolveTCPAddr("tcp", s); require.NoError(t, err); return a }
	require.ElementsMatch(t, hostSet{"127.0.0.1:8090", "localhost:8090", "127.0.0.1:8090", "[::1]:8090"}, defaultHosts(addr("127.0.0.1:8090")))
	require.ElementsMatch(t, hostSet{"0.0.0.0:8090", "localhost:8090", "127.0.0.1:8090", "[::1]:8090"}, defaultHosts(addr("0.0.0.0:8090")))
	require.Equal(t, hostSet{"192.0.2.7:8090"}, defaultHosts(addr("192.0.2.7:8090")))
	require.False(t, defaultHosts(addr("127.0.0.1:8090")).allows("localhost:8091"))
}

// Every answer keeps the console out of frames and scripts out of its
// pages but its own.
func TestSecurityHeaders(t *testing.T) {
	t.Parallel()
	_, e := newTestServer(t, TokenAuth{Token: "s3cret"}, nil)
	for _, path := range []string{"/login", "/orders", "/no/such/page"} {
		rr := do(e, http.MethodGet, path, nil)
		require.Equal(t, "DENY", rr.Header().Get("X-Frame-Options"), path)
		csp := rr.Header().Get("Content-Security-Policy")
		require.Contains(t, csp, "frame-ancestors 'none'", path)
		require.Contains(t, csp, "default-src 'none'", path)
		require.Contains(t, csp, "script-src 'nonce-", path)
		require.Equal(t, "nosniff", rr.Header().Get("X-Content-Type-Options"), path)
	}
	rr := do(e, http.MethodGet, "/login", nil)
	nonce := strings.TrimSuffix(strings.SplitN(strings.SplitN(rr.Header().Get("Content-Security-Policy"), "'nonce-", 2)[1], "'", 2)[0], "'")
	require.Contains(t, rr.Body.String(), `<script nonce="`+nonce+`">`, "the page's own script runs")
	require.NotEqual(t, nonce, strings.SplitN(do(e, http.MethodGet, "/login", nil).Header().Get("Content-Security-Policy"), "'nonce-", 2)[1][:len(nonce)], "a nonce per answer")
}

// After signing in, the browser goes on to a path of this site only.
func TestSignInGoesOnToLocalPathsOnly(t *testing.T) {
	t.Parallel()
	_, e := newTestServer(t, TokenAuth{Token: "s3cret"}, nil)
	for next, want := range map[string]string{
		"/dlq/7":                  "/dlq/7",
		"/orders?q=alice&status=": "/orders?q=alice&status=",
		"":                        "/orders",
		"//evil.example":          "/orders",
		"//evil.example/dlq":      "/orders",
		`/\evil.example`:          "/orders",
		`/\/evil.example`:         "/orders",
		`/dlq\..\..\evil`:         "/orders",
		"https://evil.example/":   "/orders",
		"javascript:alert(1)":     "/orders",
		"evil.example":            "/orders",
		"/\t/evil.example":        "/orders",
		"/\n/evil.example":        "/orders",
		"///evil.example":         "/orders",
	} {
		rr := do(e, http.MethodPost, "/login", url.Values{"token": {"s3cret"}, "next": {next}})
		require.Equal(t, http.StatusSeeOther, rr.Code, next)
		require.Equal(t, want, rr.Header().Get("Location"), "next=%q", next)
		page := do(e, http.MethodGet, "/login?next="+url.QueryEscape(next), nil).Body.String()
		if want == "/orders" {
			require.NotContains(t, page, "evil", "the sign-in form carries no foreign next=%q", next)
		}
	}
}

// POST /login from another site's page is refused and signs nobody in
// (login CSRF: a victim signed in as the attacker).
func TestSignInOnlyFromTheConsolesOwnPages(t *testing.T) {
	t.Parallel()
	_, e := newTestServer(t, TokenAuth{Token: "s3cret"}, nil)
	form := url.Values{"token": {"s3cret"}}
	for name, headers := range map[string][]string{
		"another origin":        {"Origin", "http://evil.example"},
		"an opaque origin":      {"Origin", "null"},
		"another port":          {"Origin", "http://" + consoleHost + ":8443"},
		"cross-site, no origin": {"Origin", "", "Sec-Fetch-Site", "cross-site"},
	} {
		rr := do(e, http.MethodPost, "/login", form, headers...)
		require.Equal(t, http.StatusForbidden, rr.Code, name)
		require.Empty(t, rr.Result().Cookies(), name)
	}
	rr := do(e, http.MethodPost, "/login", form)
	require.Equal(t, http.StatusSeeOther, rr.Code)
	require.Len(t, rr.Result().Cookies(), 1)
	rr = do(e, http.MethodPost, "/logout", nil, "Origin", "http://evil.example")
	require.Equal(t, http.StatusForbidden, rr.Code, "nor signs anybody out")
}

// The sign-in cookie is out of scripts' reach, this site's only, expires
// with the token (or the session limit, if sooner), and is Secure over TLS.
func TestSessionCookie(t *testing.T) {
	t.Parallel()
	issuer, jwks := apptest.StartIssuer(t)
	v, err := auth.NewVerifier(t.Context(), auth.Config{JWKSURL: jwks + auth.JWKSPath, Issuer: jwks, Audience: auth.DefaultAudience}, slog.New(slog.DiscardHandler))
	require.NoError(t, err)
	_, e := newTestServer(t, AnyOf{TokenAuth{Token: "s3cret"}, JWTAuth{Verifier: v}}, nil)
	admin, err := issuer.Token(auth.TokenRequest{Subject: "ops", Admin: true})
	require.NoError(t, err)
	id, err := v.Verify(t.Context(), admin)
	require.NoError(t, err)

	for name, tc := range map[string]struct {
		token   string
		scheme  string
		expires time.Time
	}{
		"operator's JWT":      {admin, "http", id.Expires},
		"shared token":        {"s3cret", "http", time.Now().Add(12 * time.Hour)},
		"operator's JWT, TLS": {admin, "https", id.Expires},
	} {
		r := httptest.NewRequest(http.MethodPost, tc.scheme+"://"+consoleHost+"/login", strings.NewReader(url.Values{"token": {tc.token}}.Encode()))
		r.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		r.Header.Set("Origin", tc.scheme+"://"+consoleHost)
		rr := httptest.NewRecorder()
		e.ServeHTTP(rr, r)
		require.Equal(t, http.StatusSeeOther, rr.Code, name)
		cookies := rr.Result().Cookies()
		require.Len(t, cookies, 1, name)
		c := cookies[0]
		require.Equal(t, sessionCookieName, c.Name)
		require.True(t, c.HttpOnly, name)
		require.Equal(t, http.SameSiteStrictMode, c.SameSite, name)
		require.Equal(t, tc.scheme == "https", c.Secure, name)
		require.WithinDuration(t, tc.expires, c.Expires, 2*time.Second, name)
		require.False(t, c.Expires.After(tc.expires.Add(time.Second)), "%s: never beyond the token", name)
		require.InDelta(t, time.Until(tc.expires).Seconds(), c.MaxAge, 2, name)
	}
}

// An error the browser sees says that something failed, not what: the
// detail is logged.
func TestErrorsShowNoInternalDetail(t *testing.T) {
	t.Parallel()
	var logs bytes.Buffer
	_, e := newTestServer(t, failingAuth{errors.New("dial tcp 10.1.2.3:5432: password authentication failed for user onceflow")}, &logs)
	for _, rr := range []*httptest.ResponseRecorder{
		do(e, http.MethodGet, "/orders", nil, "Cookie", sessionCookieName+"=x"),
		do(e, http.MethodPost, "/login", url.Values{"token": {"x"}}),
		do(e, http.MethodPost, "/dlq/1/replay", url.Values{}, "Cookie", sessionCookieName+"=x"),
	} {
		require.Equal(t, http.StatusInternalServerError, rr.Code)
		require.NotContains(t, rr.Body.String(), "10.1.2.3")
		require.NotContains(t, rr.Body.String(), "password")
		require.Contains(t, rr.Body.String(), "internal error")
	}
	require.Contains(t, logs.String(), "10.1.2.3", "the operator finds it in the log")
}

type failingAuth struct{ err error }

func (a failingAuth) Operator(context.Context, string) (Operator, error) { return Operator{}, a.err }

// A search that no order id or customer id could match is a 400, before
// anything reaches the database (which refuses NUL and invalid UTF-8 as a
// 500's error).
func TestOrdersSearchIsAnIDOrACustomer(t *testing.T) {
	t.Parallel()
	_, e := newTestServer(t, TokenAuth{Token: "s3cret"}, nil)
	cookie := signIn(t, e, "s3cret")
	for _, q := range []string{"%00", "%ff", "a%00b", "two%20words", "%c3%28"} {
		for _, path := range []string{"/orders", "/orders/rows"} {
			rr := do(e, http.MethodGet, path+"?q="+q, nil, "Cookie", cookie)
			require.Equal(t, http.StatusBadRequest, rr.Code, "%s?q=%s", path, q)
		}
	}
	rr := do(e, http.MethodGet, "/orders?q=0190c1d8-7d2e-7a3b-8c4d-5e6f7a8b9c0d", nil, "Cookie", cookie)
	require.Equal(t, http.StatusSeeOther, rr.Code, "an order id goes to its page")
}
