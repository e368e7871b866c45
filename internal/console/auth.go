package console

import (
	"cmp"
	"context"
	"crypto/subtle"
	"errors"
	"net/http"
	"strings"
	"time"

	"github.com/onceflow/onceflow/internal/auth"
)

// Errors an Authorizer returns.
var (
	// ErrUnauthenticated is a request without valid credentials.
	ErrUnauthenticated = errors.New("not signed in")
	// ErrForbidden is a request whose credentials are not an operator's.
	ErrForbidden = errors.New("not an operator")
)

// sessionCookieName is the cookie that holds a signed-in browser's
// session id (see sessions).
const sessionCookieName = "onceflow_console_session"

// Authorizer decides who is an operator, the only one the console shows
// anything to or lets act: the seam where the console's authentication
// plugs in.
type Authorizer interface {
	// Operator returns the operator whose credentials token carries, or
	// ErrUnauthenticated or ErrForbidden.
	Operator(ctx context.Context, token string) (Operator, error)
}

// Operator is who signed in.
type Operator struct {
	// Name is whom their actions are recorded by.
	Name string
	// Expires is when their credentials stop being valid (a JWT's exp);
	// zero when they do not say.
	Expires time.Time
}

// TokenAuth accepts one shared operator token, configured when the console
// starts (CONSOLE_OPERATOR_TOKEN).
type TokenAuth struct {
	Token string
	// Name is who the token's holder is recorded as; default "operator".
	Name string
}

// Operator implements Authorizer.
func (a TokenAuth) Operator(_ context.Context, token string) (Operator, error) {
	switch {
	case token == "":
		return Operator{}, ErrUnauthenticated
	case a.Token == "" || subtle.ConstantTimeCompare([]byte(token), []byte(a.Token)) != 1:
		return Operator{}, ErrForbidden
	}
	return Operator{Name: cmp.Or(a.Name, "operator")}, nil
}

// JWTAuth accepts the bearer JWTs the services accept (AUTH_*, verified by
// auth.Verifier) whose roles make their subject an operator (role admin),
// recorded by that subject.
type JWTAuth struct {
	Verifier *auth.Verifier
}

// Operator implements Authorizer. A token that does not verify (expired,
// forged, not a JWT) is no sign-in, a customer's is refused.
func (a JWTAuth) Operator(ctx context.Context, token string) (Operator, error) {
	if token == "" {
		return Operator{}, ErrUnauthenticated
	}
	id, err := a.Verifier.Verify(ctx, token)
	switch {
	case errors.Is(err, auth.ErrInvalidToken):
		return Operator{}, ErrUnauthenticated
	case err != nil:
		return Operator{}, err
	case !id.Admin:
		return Operator{}, ErrForbidden
	}
	return Operator{Name: id.Subject, Expires: id.Expires}, nil
}

// AnyOf accepts the credentials that one of its Authorizers accepts, trying
// them in turn: e.g. the operators' JWTs and the shared operator token.
// Refused by all, it says ErrForbidden if one of them knew the credentials
// and refused them, else ErrUnauthenticated.
type AnyOf []Authorizer

// Operator implements Authorizer.
func (as AnyOf) Operator(ctx context.Context, token string) (Operator, error) {
	refusal := ErrUnauthenticated
	for _, a := range as {
		op, err := a.Operator(ctx, token)
		switch {
		case err == nil:
			return op, nil
		case errors.Is(err, ErrForbidden):
			refusal = ErrForbidden
		case !errors.Is(err, ErrUnauthenticated):
			return Operator{}, err
		}
	}
	return Operator{}, refusal
}

// operatorOf is the operator r's credentials name: the bearer token of
// its Authorization header, judged alone, else the token its browser's
// session was started with, while the session lasts.
func (s *Server) operatorOf(r *http.Request) (Operator, error) {
	if s.cfg.Auth == nil {
		return Operator{}, ErrForbidden
	}
	token, ok := bearerToken(r)
	if !ok {
		token = s.sessionToken(r)
	}
	return s.cfg.Auth.Operator(r.Context(), token)
}

// sessionToken is the token of r's session, or "" when it has none or it
// has ended.
func (s *Server) sessionToken(r *http.Request) string {
	c, err := r.Cookie(sessionCookieName)
	if err != nil {
		return ""
	}
	token, _ := s.sessions.token(c.Value)
	return token
}

// startSession starts a session for op, signed in with token, and returns
// the cookie that keeps its id in their browser: for this site's own
// requests only (SameSite=Strict), out of scripts' reach (HttpOnly), over
// TLS only when the console is served over TLS. The session and its cookie
// end with the token, or after the session limit if sooner.
func (s *Server) startSession(r *http.Request, token string, op Operator) (*http.Cookie, error) {
	now := s.sessions.now()
	expires := now.Add(s.cfg.SessionTTL)
	if !op.Expires.IsZero() && op.Expires.Before(expires) {
		expires = op.Expires
	}
	id, err := s.sessions.start(token, expires)
	if err != nil {
		return nil, err
	}
	return &http.Cookie{
		Name: sessionCookieName, Value: id, Path: "/",
		Expires: expires, MaxAge: max(1, int(expires.Sub(now).Seconds())),
		HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: s.secure(r),
	}, nil
}

// endSession ends r's session, if it has one, and returns the cookie that
// removes its id from the browser.
func (s *Server) endSession(r *http.Request) *http.Cookie {
	if c, err := r.Cookie(sessionCookieName); err == nil {
		s.sessions.end(c.Value)
	}
	return &http.Cookie{Name: sessionCookieName, Path: "/", MaxAge: -1, HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: s.secure(r)}
}

// secure reports whether the console's cookies are marked Secure for r.
func (s *Server) secure(r *http.Request) bool { return r.TLS != nil || s.cfg.SecureCookie }

// bearerToken is the bearer token of r's Authorization header, and whether
// it has that header at all: one of another scheme is no token, and no
// session either.
func bearerToken(r *http.Request) (string, bool) {
	h := r.Header.Get("Authorization")
	if h == "" {
		return "", false
	}
	t, ok := strings.CutPrefix(h, "Bearer ")
	if !ok {
		return "", true
	}
	return strings.TrimSpace(t), true
}

// sameOrigin reports whether a form post comes from the console's own
// pages: the browser's Origin header, when it sends one, names this host.
// With the SameSite=Strict cookie it keeps other sites from acting with an
// operator's session.
func sameOrigin(r *http.Request) bool {
	origin := r.Header.Get("Origin")
	if origin == "" {
		return r.Header.Get("Sec-Fetch-Site") != "cross-site"
	}
	_, host, _ := strings.Cut(origin, "://")
	return host == r.Host
}
