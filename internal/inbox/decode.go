package inbox

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/onceflow/onceflow/internal/event"
	"github.com/onceflow/onceflow/internal/panics"
	"github.com/onceflow/onceflow/internal/streams"
)

// decode reads msg's envelope and checks it against its owner (owner.go)
// and the retention guard. It returns the delivery, which is never nil, and
// why it cannot be processed: a permanent error for an envelope that will
// never do, a panics.Error when the decoder panicked (retried: the fault may
// be the decoder's).
func (c *Consumer) decode(ctx context.Context, msg jetstream.Msg) (d *delivery, err error) {
	d = &delivery{msg: msg}
	if d.meta, err = msg.Metadata(); err != nil {
		// Only a message that did not come from a consumer lacks metadata;
		// fail logs it, as it cannot be acked either.
		return d, fmt.Errorf("no JetStream metadata: %w", err)
	}
	if err := panics.Recover(func() error {
		d.ev, err = c.fromMsg(msg.Headers(), msg.Data())
		return err
	}); err != nil {
		if panics.Stack(err) != nil {
			return d, fmt.Errorf("decode: %w", err)
		}
		return d, Permanent(fmt.Errorf("decode: %w", err))
	}
	if err := c.fromOwner(d); err != nil {
		return d, Permanent(err)
	}
	d.pastRetention = c.replayPastRetention(msg)
	if err := c.inTime(d.ev, d.pastRetention); err != nil {
		return d, Permanent(err)
	}
	return d, nil
}

// inTime is the retention guard. The maintenance drops the processed_events
// partition of events minted more than the retention period (and its
// margin) ago, so a redelivery of such an event would not be recognised:
// it is refused. An event whose own time is that old is too, whatever its
// id says, so that an event that claims to be ancient is never processed
// blindly.
//
// An event from the future is processed: it is the saga's own when its
// producer's clock is fast (a replica minutes ahead dates its OrderExpired
// minutes ahead), and nothing is at risk. Its claim lands in its partition,
// made INBOX_MAX_SKEW and two intervals ahead, or in the DEFAULT partition,
// whose rows the maintenance moves into theirs when it makes them, where a
// redelivery still finds them; its partition goes the retention after its
// id's time, later than it would have, never sooner. Only an event dated
// further ahead than the retention is refused: no clock's error explains
// it, and its claim would wait in the DEFAULT partition for its partition
// that long. pastRetention is an operator's override (replayPastRetention).
//
// The guard reckons by the consumer's retention, but the partitions that
// exist are what a claim needs: a replica whose maintenance runs on a
// shorter retention (a rolling change of INBOX_RETENTION) may have dropped
// the partition of an event this one admits. The claim's transaction
// refuses such an event itself (refusedClaim), and it goes the same way.
func (c *Consumer) inTime(ev event.Envelope, pastRetention bool) error {
	born, latest := ev.Time, ev.Minted()
	if latest.Before(born) {
		born, latest = latest, born
	}
	now := time.Now()
	if ahead := latest.Sub(now); ahead > c.cfg.Retention {
		return fmt.Errorf("event %s is dated %s in the future, beyond the inbox retention of %s: no clock is that far off",
			ev.ID, ahead.Round(time.Second), c.cfg.Retention)
	}
	if age := now.Sub(born); age > c.cfg.Retention && !pastRetention {
		return fmt.Errorf("event %s is %s old, beyond the inbox retention of %s: it may have been processed already",
			ev.ID, age.Round(time.Second), c.cfg.Retention)
	}
	return nil
}

// codeBelowOldestPartition is the SQLSTATE of a claim of an event minted
// before the oldest partition of processed_events: the DEFAULT partition's
// trigger raises it, in the claim's statement, when the floor that the
// partition maintenance keeps is above the event
// (db/migrations/platform/00014).
const codeBelowOldestPartition = "OF001"

// refusedClaim reports whether err is, or carries, the refusal of a claim
// below the oldest partition: permanent, as the retention guard's refusals
// are. A batch claimed ahead carries it in the statement that sent it.
func refusedClaim(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == codeBelowOldestPartition
}

// HeaderReplayPastRetention is "true" on a replay from the DLQ that an
// operator forced past the consumer's retention (onceflow dlq replay
// --past-retention): the retention guard lets it through.
const HeaderReplayPastRetention = "Onceflow-Replay-Past-Retention"

// replayPastRetention reports whether msg is an operator's replay to this
// consumer that overrides the retention guard: it carries the header and
// came on the consumer's own replay subject, which only the operator's
// identity may publish.
func (c *Consumer) replayPastRetention(msg jetstream.Msg) bool {
	if msg.Headers().Get(HeaderReplayPastRetention) != "true" {
		return false
	}
	_, durable, ok := streams.ReplayOf(msg.Subject())
	return ok && durable == c.cfg.Durable
}
