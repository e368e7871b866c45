package console

import (
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"time"

	lru "github.com/hashicorp/golang-lru/v2"
)

// maxSessions bounds the sign-ins a console keeps: past it, the least
// recently used one ends. Only an operator's credentials start one, so the
// bound is memory's, not a stranger's lever.
const maxSessions = 1000

// sessions are the console's sign-ins, kept on the server. A browser's
// cookie holds only a session's random id, which stands for the token it
// signed in with until the session ends: at its expiry, at sign-out, or
// when maxSessions more recent ones push it out. An id is worth nothing
// after that, whoever kept a copy of the cookie.
type sessions struct {
	now  func() time.Time
	byID *lru.Cache[string, session]
}

// session is one sign-in: the token it was made with, re-judged on every
// request, and when it ends.
type session struct {
	token   string
	expires time.Time
}

// newSessions keeps at most size sessions, judging expiry by now.
func newSessions(size int, now func() time.Time) (*sessions, error) {
	byID, err := lru.New[string, session](size)
	if err != nil {
		return nil, fmt.Errorf("console: sessions: %w", err)
	}
	return &sessions{now: now, byID: byID}, nil
}

// start keeps a session for token until expires and returns its id.
func (ss *sessions) start(token string, expires time.Time) (string, error) {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("console: session id: %w", err)
	}
	id := base64.RawURLEncoding.EncodeToString(b)
	ss.byID.Add(id, session{token: token, expires: expires})
	return id, nil
}

// token is the token of the session id, if it has not ended.
func (ss *sessions) token(id string) (string, bool) {
	s, ok := ss.byID.Get(id)
	if !ok {
		return "", false
	}
	if !ss.now().Before(s.expires) {
		ss.byID.Remove(id)
		return "", false
	}
	return s.token, true
}

// end ends the session id, if there is one.
func (ss *sessions) end(id string) {
	ss.byID.Remove(id)
}
