package console

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestTokenAuth(t *testing.T) {
	t.Parallel()
	a := TokenAuth{Token: "s3cret", Name: "ops"}
	who, err := a.Operator(t.Context(), "s3cret")
	require.NoError(t, err)
	require.Equal(t, "ops", who)
	_, err = a.Operator(t.Context(), "")
	require.ErrorIs(t, err, ErrUnauthenticated)
	_, err = a.Operator(t.Context(), "s3cre")
	require.ErrorIs(t, err, ErrForbidden)
	_, err = TokenAuth{}.Operator(t.Context(), "anything")
	require.ErrorIs(t, err, ErrForbidden, "no token configured: nobody is an operator")
}

func TestRequestToken(t *testing.T) {
	t.Parallel()
	r := httptest.NewRequest(http.MethodPost, "/dlq/1/replay", nil)
	require.Empty(t, requestToken(r))
	r.AddCookie(&http.Cookie{Name: tokenCookie, Value: "from-cookie"})
	require.Equal(t, "from-cookie", requestToken(r))
	r.Header.Set("Authorization", "Bearer from-header")
	require.Equal(t, "from-header", requestToken(r))
	r.Header.Set("Authorization", "Basic Zm9vOmJhcg==")
	require.Empty(t, requestToken(r), "another scheme is no token, and not the cookie's either")
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
