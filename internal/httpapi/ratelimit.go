package httpapi

import (
	"net/http"
	"sync"
	"time"

	"github.com/hashicorp/golang-lru/v2/simplelru"
	"github.com/labstack/echo/v4"
	"golang.org/x/time/rate"
)

// maxRateCallers bounds the callers a PerCaller limiter remembers, as many
// as the token cache's default (auth.Config.CacheSize): some 350 bytes
// each at most, 3.5 MB.
const maxRateCallers = 10_000

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
	l := newCallerLimits(rate.Limit(perSecond), burst, maxRateCallers)
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

// callerLimits are the callers' token buckets: the size most recently
// seen. A full set forgets the caller least recently seen, whose bucket
// has had the longest to refill (forgetting a full bucket changes
// nothing); a caller who keeps calling is never forgotten unless size
// others call in between, so no crowd of made-up callers empties the
// buckets of the ones being limited.
type callerLimits struct {
	limit rate.Limit
	burst int

	mu      sync.Mutex
	callers *simplelru.LRU[string, *rate.Limiter]
}

// newCallerLimits remembers size callers (at least one).
func newCallerLimits(limit rate.Limit, burst, size int) *callerLimits {
	callers, _ := simplelru.NewLRU[string, *rate.Limiter](max(size, 1), nil) // fails only for a size below 1
	return &callerLimits{limit: limit, burst: max(burst, 1), callers: callers}
}

// take takes one of who's tokens at now, or returns how long until there
// is one (taking nothing).
func (l *callerLimits) take(who string, now time.Time) time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	lim, ok := l.callers.Get(who)
	if !ok {
		lim = rate.NewLimiter(l.limit, l.burst)
		l.callers.Add(who, lim)
	}
	r := lim.ReserveN(now, 1)
	if d := r.DelayFrom(now); d > 0 {
		r.CancelAt(now)
		return d
	}
	return 0
}
