package console

import (
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/internal/apptest"
	"github.com/onceflow/onceflow/internal/auth"
)

func TestTokenAuth(t *testing.T) {
	t.Parallel()
	a := TokenAuth{Token: "s3cret", Name: "ops"}
	who, err := a.Operator(t.Context(), "s3cret")
	require.NoError(t, err)
	require.Equal(t, Operator{Name: "ops"}, who)
	_, err = a.Operator(t.Context(), "")
	require.ErrorIs(t, err, ErrUnauthenticated)
	_, err = a.Operator(t.Context(), "s3cre")
	require.ErrorIs(t, err, ErrForbidden)
	_, err = TokenAuth{}.Operator(t.Context(), "anything")
	require.ErrorIs(t, err, ErrForbidden, "no token configured: nobody is an operator")
}

// An operator's JWT is what the services accept with role admin; a
// customer's is refused, and one that does not verify is no sign-in.
func TestJWTAuth(t *testing.T) {
	t.Parallel()
	issuer, url := apptest.StartIssuer(t)
	v, err := auth.NewVerifier(t.Context(), auth.Config{JWKSURL: url + auth.JWKSPath, Issuer: url, Audience: auth.DefaultAudience}, slog.New(slog.DiscardHandler))
	require.NoError(t, err)
	a := JWTAuth{Verifier: v}
	admin, err := issuer.Token(auth.TokenRequest{Subject: "ops", Admin: true})
	require.NoError(t, err)
	who, err := a.Operator(t.Context(), admin)
	require.NoError(t, err)
	require.Equal(t, "ops", who.Name)
	require.True(t, who.Expires.After(time.Now()), "the token's expiry")

	alice, err := issuer.Token(auth.TokenRequest{Subject: "alice"})
	require.NoError(t, err)
	_, err = a.Operator(t.Context(), alice)
	require.ErrorIs(t, err, ErrForbidden)
	_, err = a.Operator(t.Context(), "")
	require.ErrorIs(t, err, ErrUnauthenticated)
	_, err = a.Operator(t.Context(), admin[:len(admin)-4]+"AAAA")
	require.ErrorIs(t, err, ErrUnauthenticated, "a forged signature")

	// Beside the shared token: either signs in.
	both := AnyOf{TokenAuth{Token: "s3cret", Name: "shared"}, a}
	who, err = both.Operator(t.Context(), "s3cret")
	require.NoError(t, err)
	require.Equal(t, "shared", who.Name)
	who, err = both.Operator(t.Context(), admin)
	require.NoError(t, err)
	require.Equal(t, "ops", who.Name)
	_, err = both.Operator(t.Context(), alice)
	require.ErrorIs(t, err, ErrForbidden)
	_, err = both.Operator(t.Context(), "")
	require.ErrorIs(t, err, ErrUnauthenticated)
}

// A request's Authorization header is judged alone: a bearer token, or,
// of another scheme, no token and no session either.
func TestBearerToken(t *testing.T) {
	t.Parallel()
	r := httptest.NewRequest(http.MethodPost, "/dlq/1/replay", nil)
	_, ok := bearerToken(r)
	require.False(t, ok)
	r.Header.Set("Authorization", "Bearer from-header")
	token, ok := bearerToken(r)
	require.True(t, ok)
	require.Equal(t, "from-header", token)
	r.Header.Set("Authorization", "Basic Zm9vOmJhcg==")
	token, ok = bearerToken(r)
	require.True(t, ok, "another scheme is no token, and not the session's either")
	require.Empty(t, token)
}

// A form posted from another site is refused, whatever cookie it carries.
func TestSameOrigin(t *testing.T) {
	t.Parallel()
	for origin, want := range map[string]bool{
		"":                         true, // curl, or a browser that sends none
		"http://console.example":   true,
		"http://evil.example":      false,
		"null":                     false,
		"http://console.example:1": false,
	} {
		r := httptest.NewRequest(http.MethodPost, "http://console.example/dlq/1/replay", nil)
		if origin != "" {
			r.Header.Set("Origin", origin)
		}
		require.Equal(t, want, sameOrigin(r), origin)
	}
	r := httptest.NewRequest(http.MethodPost, "http://console.example/dlq/1/replay", nil)
	r.Header.Set("Sec-Fetch-Site", "cross-site")
	require.False(t, sameOrigin(r))
}
