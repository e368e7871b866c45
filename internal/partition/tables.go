package partition

import "time"

// InboxTable is processed_events, partitioned by the time in the event's
// id, for consumers that refuse events older than retention
// (inbox.Config.Retention), whose producers' clocks may be up to skew
// ahead of theirs.
//
// A partition goes a margin after the retention: a tenth of it, at least
// an interval, at most an hour. The margin is the time a consumer may take
// between its retention guard letting an event through and its claim; past
// it, the claim of an event whose partition is gone is refused in the
// claim's transaction (below the floor partition_drop keeps), and the
// event dead-lettered. Partitions are made
// beyond skew ahead, so that the events of a producer whose clock is up
// to skew fast have their partition; a claim further ahead waits in the
// DEFAULT partition, moved into its partition when that is made.
func InboxTable(interval, retention, skew time.Duration) Table {
	return Table{
		Name:      "processed_events",
		Key:       "minted_at",
		Interval:  interval,
		Accepts:   skew,
		Retention: retention + InboxMargin(retention, interval),
	}
}

// InboxMargin is how long after the retention an inbox partition is kept;
// see InboxTable.
func InboxMargin(retention, interval time.Duration) time.Duration {
	return min(time.Hour, max(retention/10, interval))
}

// OutboxTable is the outbox, partitioned by the time its rows were
// written; a partition goes once every row in it was sent more than
// retention (the re-drive window) ago.
func OutboxTable(interval, retention time.Duration) Table {
	return Table{
		Name:      "outbox",
		Key:       "created_at",
		Interval:  interval,
		Retention: retention,
		SentOnly:  true,
		Ahead:     outboxAhead,
	}
}

// outboxAhead is how far ahead outbox partitions are made: hours, as for
// the inbox, but no further, because the relay's claim reads every outbox
// partition (each costs it a few index probes a call, docs/performance.md).
// With the default hourly partitions that is two.
const outboxAhead = 2 * time.Hour
