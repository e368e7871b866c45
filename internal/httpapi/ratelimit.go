package httpapi

import (
	"net/http"
	"sync"
	"time"

	"github.com/labstack/echo/v4"
	"golang.org/x/time/rate"
)

// maxRateCallers bounds the callers a PerCaller limiter remembers.
const maxRateCallers = 100_000

// TooManyRequests is a 429 problem: the caller sent more than its share,
// and may send again after retryAfter.
func TooManyRequests(retryAfter time.Duration, format string, args ...any) *Problem {
	p := NewProblem(http.StatusTooManyRequests, format, args...)
	p.RetryAfter = retryAfter
	return p
}

// PerCaller returns the middleware that lets each caller, as key names it
// (e.g. the token's subject), through at most perSecond times a second on
// average, burst at once, and answers the rest 429 with the Retry-After
// that their next request needs. A request key names no one ("") passes:
// the limit is for callers already authenticated. The count is this
// process's: replicas each allow as much.
func PerCaller(perSecond float64, burst int, key func(echo.Context) string) echo.MiddlewareFunc {
	l := &callerLimits{limit: rate.Limit(perSecond), burst: max(burst, 1), max: maxRateCallers, callers: map[string]*rate.Limiter{}}
	return func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) error {
			who := key(c)
			if who == "" {
				return next(c)
			}
			if wait := l.take(who, time.Now()); wait > 0 {
				return TooManyRequests(wait, "more than %g requests a second: send again later", perSecond)
			}
			return next(c)
		}
	}
}

// callerLimits are the callers' token buckets.
type callerLimits struct {
	limit rate.Limit
	burst int
	max   int // callers remembered

	mu      sync.Mutex
	callers map[string]*rate.Limiter
}

// take takes one of who's tokens at now, or returns how long until there
// is one (taking nothing).
func (l *callerLimits) take(who string, now time.Time) time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	lim, ok := l.callers[who]
	if !ok {
		l.makeRoom(now)
		lim = rate.NewLimiter(l.limit, l.burst)
		l.callers[who] = lim
	}
	r := lim.ReserveN(now, 1)
	if d := r.DelayFrom(now); d > 0 {
		r.CancelAt(now)
		return d
	}
	return 0
}

// makeRoom forgets, when the map is full, the callers whose buckets have
// refilled (forgetting them changes nothing), and everyone if none has: a
// bound on memory that only ever errs towards letting requests through.
func (l *callerLimits) makeRoom(now time.Time) {
	if len(l.callers) < l.max {
		return
	}
	for who, lim := range l.callers {
		if lim.TokensAt(now) >= float64(l.burst) {
			delete(l.callers, who)
		}
	}
	if len(l.callers) >= l.max {
		clear(l.callers)
	}
}
