package outbox

import (
	"context"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

const (
	// notifyChannel is the channel the outbox trigger notifies on every
	// commit that inserted rows (see the platform migration).
	notifyChannel = "onceflow_outbox"
	// listenApplicationName names the relay's LISTEN session in
	// pg_stat_activity.
	listenApplicationName = "onceflow-outbox-relay"

	connectTimeout = 10 * time.Second
	closeTimeout   = 5 * time.Second
	// The delay between attempts to re-establish a broken session doubles
	// from the first to the last.
	firstReconnectDelay = 100 * time.Millisecond
	lastReconnectDelay  = 30 * time.Second
	// drainTime bounds the reading of notifications that are already on the
	// wire when the relay wakes up.
	drainTime = time.Millisecond
)

// listener is the relay's LISTEN session on the outbox channel. It has a
// connection of its own rather than one of the pool's: a pooled connection
// is handed to others between uses, and this one must stay LISTENing. When
// the session breaks the relay keeps polling, and the session is
// re-established with a bounded backoff. It is used by one goroutine.
type listener struct {
	config *pgx.ConnConfig
	logger *slog.Logger

	conn        *pgx.Conn     // nil while not listening
	nextAttempt time.Time     // earliest next connection attempt
	delay       time.Duration // after the next failed attempt
	broken      bool          // the last session broke or could not start
}

func newListener(pool *pgxpool.Pool, logger *slog.Logger) *listener {
	config := pool.Config().ConnConfig // a copy
	if config.RuntimeParams == nil {
		config.RuntimeParams = make(map[string]string)
	}
	config.RuntimeParams["application_name"] = listenApplicationName
	return &listener{config: config, logger: logger, delay: firstReconnectDelay}
}

// connect opens the session and LISTENs. On failure it schedules the next
// attempt and reports false.
func (l *listener) connect(ctx context.Context) bool {
	connCtx, cancel := context.WithTimeout(ctx, connectTimeout)
	defer cancel()
	conn, err := pgx.ConnectConfig(connCtx, l.config)
	if err == nil {
		if _, err = conn.Exec(connCtx, "LISTEN "+notifyChannel); err != nil {
			l.closeConn(conn)
		}
	}
	if err != nil {
		if ctx.Err() == nil {
			l.logger.WarnContext(ctx, "cannot listen for outbox commits; polling meanwhile",
				"error", err, "retry_in", l.delay)
		}
		l.broken = true
		l.nextAttempt = time.Now().Add(l.delay)
		l.delay = min(2*l.delay, lastReconnectDelay)
		return false
	}
	if l.broken {
		l.logger.InfoContext(ctx, "listening for outbox commits again")
	}
	l.conn, l.broken, l.delay = conn, false, firstReconnectDelay
	return true
}

// wait returns after d, when ctx is done, or, if wake is set, as soon as a
// commit is notified or the session is re-established (commits may have
// gone unnoticed while it was down). Notifications that arrive while wake is
// not set are read and dropped all the same: the server's notification
// queue, shared by the whole cluster, cannot move past a session that does
// not read.
func (l *listener) wait(ctx context.Context, d time.Duration, wake bool) {
	deadline := time.Now().Add(d)
	for ctx.Err() == nil && time.Now().Before(deadline) {
		if l.conn == nil {
			if time.Now().Before(l.nextAttempt) {
				sleepUntil(ctx, earliest(deadline, l.nextAttempt))
				continue
			}
			if l.connect(ctx) && wake {
				return
			}
			continue
		}
		if l.receive(ctx, deadline) && wake {
			l.drain(ctx)
			return
		}
	}
}

// receive waits until deadline for one notification and reports whether one
// came. A session that broke is closed and its replacement scheduled at once.
func (l *listener) receive(ctx context.Context, deadline time.Time) bool {
	waitCtx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	_, err := l.conn.WaitForNotification(waitCtx)
	switch {
	case err == nil:
		return true
	case waitCtx.Err() != nil && !l.conn.IsClosed():
		return false // the deadline passed, or ctx is done
	}
	l.lost(ctx, err)
	return false
}

// lost ends a session that failed and schedules its replacement at once;
// the relay polls meanwhile.
func (l *listener) lost(ctx context.Context, err error) {
	if ctx.Err() == nil {
		l.logger.WarnContext(ctx, "outbox LISTEN session lost; polling meanwhile", "error", err)
	}
	l.closeConn(l.conn)
	l.conn, l.broken, l.nextAttempt = nil, true, time.Now()
}

// drain reads the notifications that are already on the wire. One flush
// covers every commit notified before it starts, so a burst of commits
// costs one flush instead of one each.
func (l *listener) drain(ctx context.Context) {
	drainCtx, cancel := context.WithTimeout(ctx, drainTime)
	defer cancel()
	for {
		if _, err := l.conn.WaitForNotification(drainCtx); err != nil {
			// A session that broke meanwhile is noticed by the next receive.
			return
		}
	}
}

// listening reports whether the session is up: commits notified while it
// is down go unheard.
func (l *listener) listening() bool { return l.conn != nil }

func (l *listener) close() {
	if l.conn != nil {
		l.closeConn(l.conn)
		l.conn = nil
	}
}

// closeConn ends a session. Its error is of no use: the server ends the
// session when the connection goes, whichever way it goes.
func (l *listener) closeConn(conn *pgx.Conn) {
	ctx, cancel := context.WithTimeout(context.Background(), closeTimeout)
	defer cancel()
	_ = conn.Close(ctx)
}

func sleepUntil(ctx context.Context, t time.Time) {
	timer := time.NewTimer(time.Until(t))
	defer timer.Stop()
	select {
	case <-ctx.Done():
	case <-timer.C:
	}
}

func earliest(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}
