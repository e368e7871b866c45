package console

import (
	"net/http"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// clock is a time that a test moves on.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// signIn posts the sign-in form with token and returns the "Cookie" header
// of the session it starts.
func signIn(t *testing.T, e http.Handler, token string) string {
	t.Helper()
	rr := do(e, http.MethodPost, "/login", url.Values{"token": {token}})
	require.Equal(t, http.StatusSeeOther, rr.Code)
	cookies := rr.Result().Cookies()
	require.Len(t, cookies, 1)
	require.NotContains(t, cookies[0].Value, token, "the cookie holds a session id, not the token")
	return cookies[0].Name + "=" + cookies[0].Value
}

// A session's cookie signs in until sign-out, and not after: a copy kept
// from before (stolen, or the browser's own) is refused.
func TestSessionEndsAtSignOut(t *testing.T) {
	t.Parallel()
	_, e := newTestServer(t, TokenAuth{Token: "s3cret"}, nil)
	cookie := signIn(t, e, "s3cret")
	require.Equal(t, http.StatusOK, do(e, http.MethodGet, "/audit", nil, "Cookie", cookie).Code)

	rr := do(e, http.MethodPost, "/logout", nil, "Cookie", cookie)
	require.Equal(t, http.StatusSeeOther, rr.Code)
	require.Negative(t, rr.Result().Cookies()[0].MaxAge, "the browser forgets it")
	rr = do(e, http.MethodGet, "/audit", nil, "Cookie", cookie)
	require.Equal(t, http.StatusSeeOther, rr.Code, "the cookie replayed after sign-out")
	require.Equal(t, "/login?next=%2Faudit", rr.Header().Get("Location"))
	require.Equal(t, http.StatusUnauthorized, do(e, http.MethodPost, "/audit", url.Values{}, "Cookie", cookie).Code)

	// Another session of the same token is not ended with it.
	other := signIn(t, e, "s3cret")
	require.NotEqual(t, cookie, other)
	require.Equal(t, http.StatusOK, do(e, http.MethodGet, "/audit", nil, "Cookie", other).Code)
}

// A session ends at its TTL on the server, whatever the browser does with
// its cookie's expiry.
func TestSessionEndsAtItsTTL(t *testing.T) {
	t.Parallel()
	s, e := newTestServer(t, TokenAuth{Token: "s3cret"}, nil)
	c := &clock{t: time.Now()}
	var err error
	s.sessions, err = newSessions(maxSessions, c.now)
	require.NoError(t, err)
	cookie := signIn(t, e, "s3cret")

	c.advance(s.cfg.SessionTTL - time.Second)
	require.Equal(t, http.StatusOK, do(e, http.MethodGet, "/audit", nil, "Cookie", cookie).Code, "a second before its TTL")
	c.advance(time.Second)
	require.Equal(t, http.StatusSeeOther, do(e, http.MethodGet, "/audit", nil, "Cookie", cookie).Code, "at its TTL")
	c.advance(-time.Hour)
	require.Equal(t, http.StatusSeeOther, do(e, http.MethodGet, "/audit", nil, "Cookie", cookie).Code, "ended for good, even if the clock steps back")
}

// The console keeps at most its bound of sessions: past it, the least
// recently used ends.
func TestSessionsAreBounded(t *testing.T) {
	t.Parallel()
	ss, err := newSessions(2, time.Now)
	require.NoError(t, err)
	expires := time.Now().Add(time.Hour)
	first, err := ss.start("a", expires)
	require.NoError(t, err)
	second, err := ss.start("b", expires)
	require.NoError(t, err)
	_, ok := ss.token(first) // used: the second is now the least recent
	require.True(t, ok)
	_, err = ss.start("c", expires)
	require.NoError(t, err)
	_, ok = ss.token(second)
	require.False(t, ok)
	token, ok := ss.token(first)
	require.True(t, ok)
	require.Equal(t, "a", token)
	require.Equal(t, 2, ss.byID.Len())
}
