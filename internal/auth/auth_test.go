package auth_test

import (
	"context"
	"crypto/rand"
	"crypto/rsa"
	"encoding/json"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/labstack/echo/v4"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/internal/auth"
	"github.com/onceflow/onceflow/internal/httpapi"
)

// setup serves a dev issuer and returns it with a verifier of its tokens.
func setup(t testing.TB) (*auth.Issuer, *auth.Verifier, *httptest.Server) {
	t.Helper()
	return setupCache(t, 100)
}

// setupCache is setup with a verifier that caches cacheSize tokens.
func setupCache(t testing.TB, cacheSize int) (*auth.Issuer, *auth.Verifier, *httptest.Server) {
	t.Helper()
	var handler http.Handler
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { handler.ServeHTTP(w, r) }))
	t.Cleanup(srv.Close)
	iss, err := auth.NewIssuer(t.Context(), auth.IssuerConfig{Issuer: srv.URL, Audience: "onceflow", TTL: time.Hour})
	require.NoError(t, err)
	handler = iss.Handler()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	v, err := auth.NewVerifier(ctx, auth.Config{
		JWKSURL:   srv.URL + auth.JWKSPath,
		Issuer:    srv.URL,
		Audience:  "onceflow",
		Leeway:    5 * time.Second,
		CacheSize: cacheSize,
	}, slog.New(slog.DiscardHandler))
	require.NoError(t, err)
	return iss, v, srv
}

func TestVerifyAcceptsTheIssuersTokens(t *testing.T) {
	t.Parallel()
	iss, v, _ := setup(t)

	tok, err := iss.Token(auth.TokenRequest{Subject: "alice", Email: "alice@example.com"})
	require.NoError(t, err)
	id, err := v.Verify(t.Context(), tok)
	require.NoError(t, err)
	assert.Equal(t, "alice", id.Subject)
	assert.Equal(t, "alice@example.com", id.Email)
	assert.False(t, id.Admin)
	assert.WithinDuration(t, time.Now().Add(time.Hour), id.Expires, time.Minute)

	tok, err = iss.Token(auth.TokenRequest{Subject: "ops", Admin: true})
	require.NoError(t, err)
	id, err = v.Verify(t.Context(), tok)
	require.NoError(t, err)
	assert.True(t, id.Admin)
}

func TestVerifyRefusesForgedAndMisdirectedTokens(t *testing.T) {
	t.Parallel()
	iss, v, srv := setup(t)
	good, err := iss.Token(auth.TokenRequest{Subject: "alice"})
	require.NoError(t, err)
	kid := header(t, good)["kid"].(string)

	otherKey, err := rsa.GenerateKey(rand.Reader, 2048)
	require.NoError(t, err)
	valid := jwt.MapClaims{
		"iss": srv.URL, "aud": "onceflow", "sub": "alice",
		"iat": time.Now().Unix(), "exp": time.Now().Add(time.Hour).Unix(),
	}
	with := func(k string, val any) jwt.MapClaims {
		c := jwt.MapClaims{}
		for key, v := range valid {
			c[key] = v
		}
		if val == nil {
			delete(c, k)
		} else {
			c[k] = val
		}
		return c
	}
	sign := func(c jwt.MapClaims) string {
		tok := jwt.NewWithClaims(jwt.SigningMethodRS256, c)
		tok.Header["kid"] = kid
		s, err := tok.SignedString(otherKey)
		require.NoError(t, err)
		return s
	}
	// The same claims and key id as a good token, signed by another key.
	forged := sign(valid)
	// A good token with its payload swapped for an admin's.
	parts := strings.Split(good, ".")
	tampered := parts[0] + "." + strings.Split(sign(with("roles", []string{"admin"})), ".")[1] + "." + parts[2]
	// "none" and HMAC keyed with something public are never accepted.
	none, err := jwt.NewWithClaims(jwt.SigningMethodNone, valid).SignedString(jwt.UnsafeAllowNoneSignatureType)
	require.NoError(t, err)
	hmac, err := jwt.NewWithClaims(jwt.SigningMethodHS256, valid).SignedString([]byte(kid))
	require.NoError(t, err)

	for name, tok := range map[string]string{
		"forged signature": forged,
		"tampered payload": tampered,
		"alg none":         none,
		"alg HS256":        hmac,
		"garbage":          "not.a.token",
	} {
		_, err := v.Verify(t.Context(), tok)
		require.ErrorIs(t, err, auth.ErrInvalidToken, name)
	}

	// The issuer's own key, but claims the verifier must refuse.
	other, err := auth.NewIssuer(t.Context(), auth.IssuerConfig{Issuer: "http://elsewhere", Audience: "onceflow"})
	require.NoError(t, err)
	wrongIss, err := other.Token(auth.TokenRequest{Subject: "alice"})
	require.NoError(t, err)
	_, err = v.Verify(t.Context(), wrongIss)
	require.ErrorIs(t, err, auth.ErrInvalidToken, "a token of another issuer, unknown key")

	for name, c := range map[string]jwt.MapClaims{
		"wrong audience": with("aud", "someone-else"),
		"wrong issuer":   with("iss", "http://elsewhere"),
		"expired":        with("exp", time.Now().Add(-time.Minute).Unix()),
		"no expiry":      with("exp", nil),
		"not yet valid":  with("nbf", time.Now().Add(time.Minute).Unix()),
		"no subject":     with("sub", nil),
	} {
		_, err := v.Verify(t.Context(), signWithIssuerKey(t, iss, c))
		require.ErrorIs(t, err, auth.ErrInvalidToken, name)
	}
	// Within the leeway, a token just expired still passes.
	_, err = v.Verify(t.Context(), signWithIssuerKey(t, iss, with("exp", time.Now().Add(-2*time.Second).Unix())))
	require.NoError(t, err)
}

// signWithIssuerKey signs c with iss's key, as a token of iss with those
// claims would be.
func signWithIssuerKey(t *testing.T, iss *auth.Issuer, c jwt.MapClaims) string {
	t.Helper()
	s, err := iss.SignClaims(c)
	require.NoError(t, err)
	return s
}

func header(t *testing.T, tok string) map[string]any {
	t.Helper()
	parsed, _, err := jwt.NewParser().ParseUnverified(tok, jwt.MapClaims{})
	require.NoError(t, err)
	return parsed.Header
}

func TestVerifyFollowsKeyRotation(t *testing.T) {
	t.Parallel()
	iss, v, _ := setup(t)
	before, err := iss.Token(auth.TokenRequest{Subject: "alice"})
	require.NoError(t, err)
	_, err = v.Verify(t.Context(), before)
	require.NoError(t, err) // the verifier has the first key set now

	require.NoError(t, iss.Rotate(t.Context()))
	after, err := iss.Token(auth.TokenRequest{Subject: "alice"})
	require.NoError(t, err)
	require.NotEqual(t, header(t, before)["kid"], header(t, after)["kid"])

	// An unknown key id makes the verifier fetch the set again.
	_, err = v.Verify(t.Context(), after)
	require.NoError(t, err)
	_, err = v.Verify(t.Context(), before)
	require.NoError(t, err, "tokens of the earlier key stay valid")
}

func TestMiddleware(t *testing.T) {
	t.Parallel()
	iss, v, _ := setup(t)
	e := httpapi.New(slog.New(slog.DiscardHandler))
	e.Use(v.Middleware(func(c echo.Context) bool { return c.Path() == "/public" }))
	e.GET("/public", func(c echo.Context) error { return c.String(http.StatusOK, "open") })
	e.GET("/me", func(c echo.Context) error {
		id, _ := auth.Caller(c)
		return c.String(http.StatusOK, id.Subject)
	})
	e.GET("/admin", func(c echo.Context) error { return c.String(http.StatusOK, "ok") }, auth.AdminOnly)

	call := func(path, authz string) *httptest.ResponseRecorder {
		req := httptest.NewRequest(http.MethodGet, path, nil)
		if authz != "" {
			req.Header.Set("Authorization", authz)
		}
		rec := httptest.NewRecorder()
		e.ServeHTTP(rec, req)
		return rec
	}
	alice, err := iss.Token(auth.TokenRequest{Subject: "alice"})
	require.NoError(t, err)
	admin, err := iss.Token(auth.TokenRequest{Subject: "ops", Admin: true})
	require.NoError(t, err)

	rec := call("/public", "")
	assert.Equal(t, http.StatusOK, rec.Code)

	for name, authz := range map[string]string{
		"no header":     "",
		"basic":         "Basic YWxpY2U6eA==",
		"empty bearer":  "Bearer ",
		"invalid token": "Bearer x.y.z",
	} {
		rec := call("/me", authz)
		require.Equal(t, http.StatusUnauthorized, rec.Code, name)
		assert.Equal(t, httpapi.ContentTypeProblem, rec.Header().Get("Content-Type"), name)
		assert.True(t, strings.HasPrefix(rec.Header().Get("WWW-Authenticate"), "Bearer "), name)
	}
	assert.Contains(t, call("/me", "Bearer x.y.z").Header().Get("WWW-Authenticate"), `error="invalid_token"`)

	rec = call("/me", "bearer "+alice) // the scheme is case-insensitive
	require.Equal(t, http.StatusOK, rec.Code)
	assert.Equal(t, "alice", rec.Body.String())

	assert.Equal(t, http.StatusForbidden, call("/admin", "Bearer "+alice).Code)
	assert.Equal(t, http.StatusOK, call("/admin", "Bearer "+admin).Code)
}

func TestIssuerTokenEndpoint(t *testing.T) {
	t.Parallel()
	iss, v, srv := setup(t)
	post := func(form url.Values, kv ...string) (*http.Response, auth.TokenResponse) {
		t.Helper()
		req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, srv.URL+auth.TokenPath, strings.NewReader(form.Encode()))
		require.NoError(t, err)
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		for i := 0; i+1 < len(kv); i += 2 {
			if kv[i] == "Host" {
				req.Host = kv[i+1]
				continue
			}
			req.Header.Set(kv[i], kv[i+1])
		}
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		var tr auth.TokenResponse
		if resp.StatusCode == http.StatusOK {
			require.NoError(t, decode(resp, &tr))
		}
		return resp, tr
	}

	// A customer's token, for anyone who asks.
	resp, tr := post(url.Values{"sub": {"bob"}, "email": {"bob@example.com"}})
	require.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Equal(t, "Bearer", tr.TokenType)
	assert.Equal(t, int64(3600), tr.ExpiresIn)
	id, err := v.Verify(t.Context(), tr.AccessToken)
	require.NoError(t, err)
	assert.Equal(t, auth.Identity{Subject: "bob", Email: "bob@example.com", Expires: id.Expires}, id)

	// An admin's, only for the holder of the operator secret.
	admin := url.Values{"sub": {"ops"}, "role": {"admin"}}
	require.NotEmpty(t, iss.OperatorSecret())
	for name, kv := range map[string][]string{
		"no secret":          nil,
		"a wrong secret":     {"Authorization", "Bearer " + iss.OperatorSecret() + "x"},
		"another scheme":     {"Authorization", "Basic " + iss.OperatorSecret()},
		"a customer's token": {"Authorization", "Bearer " + tr.AccessToken},
	} {
		resp, _ := post(admin, kv...)
		require.Equal(t, http.StatusUnauthorized, resp.StatusCode, name)
	}
	resp, tr = post(admin, "Authorization", "Bearer "+iss.OperatorSecret())
	require.Equal(t, http.StatusOK, resp.StatusCode)
	id, err = v.Verify(t.Context(), tr.AccessToken)
	require.NoError(t, err)
	assert.True(t, id.Admin)

	// Only for its own host names: a page whose name resolves to the
	// issuer (DNS rebinding) gets nothing; the keys stay public.
	_, port, err := net.SplitHostPort(strings.TrimPrefix(srv.URL, "http://"))
	require.NoError(t, err)
	for host, want := range map[string]int{
		"localhost:" + port:    http.StatusOK,
		"evil.example:" + port: http.StatusMisdirectedRequest,
		"evil.example":         http.StatusMisdirectedRequest,
		"127.0.0.1:1":          http.StatusMisdirectedRequest,
	} {
		resp, _ := post(url.Values{"sub": {"bob"}}, "Host", host)
		require.Equal(t, want, resp.StatusCode, host)
	}
	keys, err := http.NewRequestWithContext(t.Context(), http.MethodGet, srv.URL+auth.JWKSPath, nil)
	require.NoError(t, err)
	keys.Host = "issuer:8084"
	kresp, err := http.DefaultClient.Do(keys)
	require.NoError(t, err)
	kresp.Body.Close()
	require.Equal(t, http.StatusOK, kresp.StatusCode)

	for name, form := range map[string]url.Values{
		"no sub":     {"role": {"admin"}},
		"other role": {"sub": {"bob"}, "role": {"root"}},
	} {
		resp, _ := post(form, "Authorization", "Bearer "+iss.OperatorSecret())
		assert.Equal(t, http.StatusBadRequest, resp.StatusCode, name)
	}
}

// The operator secret is the configured one, else a fresh one per issuer;
// the issuer answers the names configured beside its own.
func TestIssuerSecretAndHosts(t *testing.T) {
	t.Parallel()
	a, err := auth.NewIssuer(t.Context(), auth.IssuerConfig{Issuer: "http://127.0.0.1:8084"})
	require.NoError(t, err)
	b, err := auth.NewIssuer(t.Context(), auth.IssuerConfig{Issuer: "http://127.0.0.1:8084"})
	require.NoError(t, err)
	require.NotEqual(t, a.OperatorSecret(), b.OperatorSecret())
	require.GreaterOrEqual(t, len(a.OperatorSecret()), 20)
	c, err := auth.NewIssuer(t.Context(), auth.IssuerConfig{Issuer: "https://id.example", OperatorSecret: "s3cret", Hosts: []string{"issuer:8084"}})
	require.NoError(t, err)
	require.Equal(t, "s3cret", c.OperatorSecret())
	for host, want := range map[string]int{"id.example": http.StatusOK, "issuer:8084": http.StatusOK, "localhost": http.StatusMisdirectedRequest} {
		r := httptest.NewRequest(http.MethodPost, "http://"+host+auth.TokenPath, strings.NewReader("sub=bob"))
		r.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		rr := httptest.NewRecorder()
		c.Handler().ServeHTTP(rr, r)
		require.Equal(t, want, rr.Code, host)
	}
}

func decode(resp *http.Response, v any) error { return json.NewDecoder(resp.Body).Decode(v) }

// BenchmarkVerify is the cost of verifying one request's token: an RS256
// signature check and the claims' validation (uncached), or a hash and a
// map look-up (cached: the client's token was seen before).
func BenchmarkVerify(b *testing.B) {
	for name, size := range map[string]int{"uncached": 0, "cached": 100} {
		b.Run(name, func(b *testing.B) {
			iss, v, _ := setupCache(b, size)
			tok, err := iss.Token(auth.TokenRequest{Subject: "alice"})
			require.NoError(b, err)
			ctx := context.Background()
			_, err = v.Verify(ctx, tok)
			require.NoError(b, err)
			b.ReportAllocs()
			for b.Loop() {
				if _, err := v.Verify(ctx, tok); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// A token the cache holds stands for itself only: a copy with its
// signature replaced, stripped, or its header and payload with another
// token's signature, is verified afresh and refused.
func TestVerifyCachesTheWholeToken(t *testing.T) {
	t.Parallel()
	iss, v, _ := setup(t)
	tok, err := iss.Token(auth.TokenRequest{Subject: "ops", Admin: true})
	require.NoError(t, err)
	other, err := iss.Token(auth.TokenRequest{Subject: "alice"})
	require.NoError(t, err)
	for range 2 { // verified, then from the cache
		id, err := v.Verify(t.Context(), tok)
		require.NoError(t, err)
		require.True(t, id.Admin)
	}
	signed := tok[:strings.LastIndexByte(tok, '.')]
	otherSig := other[strings.LastIndexByte(other, '.')+1:]
	for name, forged := range map[string]string{
		"forged signature":          signed + "." + strings.Repeat("A", len(otherSig)),
		"stripped signature":        signed + ".",
		"no signature part":         signed,
		"another token's signature": signed + "." + otherSig,
	} {
		_, err := v.Verify(t.Context(), forged)
		require.ErrorIs(t, err, auth.ErrInvalidToken, name)
	}
}

// An e-mail the token says is not verified is no address of the caller's;
// one it says nothing about, or says is verified, is. An e-mail longer
// than an address can be refuses the token: the cache keeps what Verify
// returns, and no more than that.
func TestVerifyKeepsOnlyAVerifiedEmail(t *testing.T) {
	t.Parallel()
	iss, v, srv := setup(t)
	for verified, want := range map[any]string{
		nil: "carol@example.com", true: "carol@example.com", "true": "carol@example.com",
		false: "", "false": "", 0: "", "": "",
	} {
		c := jwt.MapClaims{
			"iss": srv.URL, "aud": "onceflow", "sub": "carol", "email": "carol@example.com",
			"iat": time.Now().Unix(), "exp": time.Now().Add(time.Hour).Unix(),
		}
		if verified != nil {
			c["email_verified"] = verified
		}
		tok, err := iss.SignClaims(c)
		require.NoError(t, err)
		for range 2 { // verified, then from the cache
			id, err := v.Verify(t.Context(), tok)
			require.NoError(t, err)
			require.Equal(t, want, id.Email, "email_verified %#v", verified)
		}
	}
	unverified := false
	tok, err := iss.Token(auth.TokenRequest{Subject: "carol", Email: "carol@example.com", EmailVerified: &unverified})
	require.NoError(t, err)
	id, err := v.Verify(t.Context(), tok)
	require.NoError(t, err)
	require.Empty(t, id.Email, "the dev issuer's email_verified false")

	long := strings.Repeat("a", auth.MaxEmailLength) + "@example.com"
	_, err = iss.Token(auth.TokenRequest{Subject: "carol", Email: long})
	require.Error(t, err, "the issuer signs no such address")
	tok, err = iss.SignClaims(jwt.MapClaims{
		"iss": srv.URL, "aud": "onceflow", "sub": "carol", "email": long,
		"iat": time.Now().Unix(), "exp": time.Now().Add(time.Hour).Unix(),
	})
	require.NoError(t, err)
	_, err = v.Verify(t.Context(), tok)
	require.ErrorIs(t, err, auth.ErrInvalidToken)
}
