package outbox

import (
	"context"
	"errors"
	"time"
)

// The pause of a relay that found nothing to publish while commits were in
// progress doubles from the first to the last.
const (
	minBusyPause = time.Millisecond
	maxBusyPause = 16 * time.Millisecond
)

// sleepOp is what a flush does with the relay's sleep lock, in the round
// trip of its first claim.
type sleepOp int

const (
	stayAwake sleepOp = iota
	// goToSleep tries the sleep lock ahead of the claim (and the marks),
	// which then sees every row committed without a notification. While
	// commits in progress hold the lock shared it is not had, and the claim
	// and the marks run all the same.
	goToSleep
	// wakeUp releases the sleep lock: commits stop notifying while the
	// relay works.
	wakeUp
)

// errCommitting is a flush's answer when it found nothing more to publish
// but could not take the sleep lock because producers are committing; it
// is no failure.
var errCommitting = errors.New("outbox commits in progress")

// sleeper is what Run keeps from one flush to the next.
type sleeper struct {
	next  sleepOp       // what the next flush does with the sleep lock
	pause time.Duration // the next wait while commits are in progress
}

// rest waits after flush f for as long as what f found calls for — a
// notification, the poll interval, or a short pause while commits are in
// progress — and sets what the next flush does with the sleep lock.
func (r *Relay) rest(ctx context.Context, l *listener, s *sleeper, f flushed) {
	switch {
	case errors.Is(f.err, errCommitting):
		// Producers are committing and will not notify: look again
		// shortly, later each time in a row this happens without
		// anything to publish (a long transaction must not make the
		// relay spin).
		if f.sent > 0 {
			s.pause = minBusyPause
		}
		l.wait(ctx, s.pause, true)
		s.pause = min(2*s.pause, maxBusyPause, r.cfg.PollInterval)
		s.next = goToSleep
	case f.err != nil:
		// Pause for a whole interval instead of trying again at the
		// next commit: a broker or database that fails is not helped
		// by a batch per commit. The sleep lock went with the session's
		// relay lock.
		r.logger.WarnContext(ctx, "relay outbox", "error", f.err, "retry_in", r.cfg.PollInterval)
		l.wait(ctx, r.cfg.PollInterval, false)
		s.next = stayAwake
	case !f.locked:
		// Another relay publishes. Commits do not notify while it
		// works, so only the poll notices when it is gone.
		l.wait(ctx, r.cfg.PollInterval, true)
		s.next = stayAwake
	case f.asleep:
		// Commits notify from now on, and the claim that took the
		// lock saw the rows of those that held it before. The next
		// flush releases the lock with its first claim.
		s.pause = minBusyPause
		l.wait(ctx, r.cfg.PollInterval, true)
		s.next = wakeUp
	case !l.listening():
		// No session to be notified on: poll until there is one.
		l.wait(ctx, r.cfg.PollInterval, true)
		s.next = stayAwake
	default:
		// The flush ended with a claim that found nothing: sleep.
		if f.sent > 0 {
			s.pause = minBusyPause
		}
		s.next = goToSleep
	}
}
