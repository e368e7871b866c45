package console

import (
	"context"
	"crypto/subtle"
	"errors"
	"net/http"
	"strings"

	"github.com/onceflow/onceflow/internal/auth"
)

// Errors an Authorizer returns.
var (
	// ErrUnauthenticated is a request without valid credentials.
	ErrUnauthenticated = errors.New("not signed in")
	// ErrForbidden is a request whose credentials are not an operator's.
	ErrForbidden = errors.New("not an operator")
)

// tokenCookie holds the token of a browser that signed in.
const tokenCookie = "onceflow_console_token"

// Authorizer decides who may act on the system (replay, discard): the seam
// where the console's authentication plugs in.
type Authorizer interface {
	// Operator returns the name of the operator whose credentials token
	// carries, or ErrUnauthenticated or ErrForbidden.
	Operator(ctx context.Context, token string) (string, error)
}

// TokenAuth accepts one shared operator token, configured when the console
// starts (CONSOLE_OPERATOR_TOKEN).
type TokenAuth struct {
	Token string
	// Name is who the token's holder is recorded as; default "operator".
	Name string
}

// Operator implements Authorizer.
func (a TokenAuth) Operator(_ context.Context, token string) (string, error) {
	switch {
	case token == "":
		return "", ErrUnauthenticated
	case a.Token == "" || subtle.ConstantTimeCompare([]byte(token), []byte(a.Token)) != 1:
		return "", ErrForbidden
	case a.Name != "":
		return a.Name, nil
	}
	return "operator", nil
}

// JWTAuth accepts the bearer JWTs the services accept (AUTH_*, verified by
// auth.Verifier) whose roles make their subject an operator (role admin),
// recorded by that subject.
type JWTAuth struct {
	Verifier *auth.Verifier
}

// Operator implements Authorizer. A token that does not verify (expired,
// forged, not a JWT) is no sign-in, a customer's is refused.
func (a JWTAuth) Operator(ctx context.Context, token string) (string, error) {
	if token == "" {
		return "", ErrUnauthenticated
	}
	id, err := a.Verifier.Verify(ctx, token)
	switch {
	case errors.Is(err, auth.ErrInvalidToken):
		return "", ErrUnauthenticated
	case err != nil:
		return "", err
	case !id.Admin:
		return "", ErrForbidden
	}
	return id.Subject, nil
}

// AnyOf accepts the credentials that one of its Authorizers accepts, trying
// them in turn: e.g. the operators' JWTs and the shared operator token.
// Refused by all, it says ErrForbidden if one of them knew the credentials
// and refused them, else ErrUnauthenticated.
type AnyOf []Authorizer

// Operator implements Authorizer.
func (as AnyOf) Operator(ctx context.Context, token string) (string, error) {
	refusal := ErrUnauthenticated
	for _, a := range as {
		who, err := a.Operator(ctx, token)
		switch {
		case err == nil:
			return who, nil
		case errors.Is(err, ErrForbidden):
			refusal = ErrForbidden
		case !errors.Is(err, ErrUnauthenticated):
			return "", err
		}
	}
	return "", refusal
}

// requestToken is the bearer token of r's Authorization header, else the
// token its browser signed in with.
func requestToken(r *http.Request) string {
	if h := r.Header.Get("Authorization"); h != "" {
		if t, ok := strings.CutPrefix(h, "Bearer "); ok {
			return strings.TrimSpace(t)
		}
		return ""
	}
	if c, err := r.Cookie(tokenCookie); err == nil {
		return c.Value
	}
	return ""
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
