// Package partition keeps the time-partitioned tables of a service's
// database, the inbox (processed_events, by the time in the event's id)
// and the outbox (by the time its rows were written): a Maintainer adds
// partitions ahead of the clock (Table.Reach: hours, for a maintenance kept
// from its locks that long) and drops whole partitions once they are
// past their retention, so that retention costs a catalog change, never a
// DELETE per row, its WAL and its dead tuples.
//
// Each step is one statement (partition_create, partition_drop in
// db/migrations/platform/00011) that waits for its locks at most
// Config.LockTimeout and is retried when it runs out, so a long
// transaction delays the maintenance, never the service's writers behind
// it. A partition is made with its indexes before the locks writers wait
// behind are taken; dropping one holds its table's ACCESS EXCLUSIVE lock
// only to detach it, and the detached table is dropped afterwards, so
// that the drop's WAL flush at commit keeps no writer waiting (waiting for
// its lock at most Config.LockTimeout too: one still in use is dropped at
// a later round). Both steps
// commit without waiting for their own flush: a step lost in a crash is
// done again. An outbox partition is dropped only when every row in it
// is sent and was sent longer than the re-drive window ago
// (outbox_all_sent: the relay's position, and its position as of the
// window's start, cover every row), checked before the lock and again
// under it, in a READ COMMITTED transaction; the relay's positions older
// than the window are pruned in the same round.
//
// Rows that arrive before their partition exists (a new database, a
// maintenance kept from its locks for hours, an event from a clock far
// ahead) wait in the table's DEFAULT partition and are moved into their
// partition when it is made: under the DEFAULT partition's lock when it
// is small (a few hundred kB, a few ms), else in batches that hold no lock
// a writer waits behind (db/migrations/platform/00017): the partition's
// table is made unattached, the DEFAULT partition made to refuse rows of
// its range, the range's rows moved a batch a transaction, and the table
// attached with checks that spare the ATTACH any scan. While they move:
//
//   - A row of processed_events is seen by every claim of its event or
//     the claim is refused: from the moment the first batch may take a
//     row out of sight, a claim of the range fails in its statement
//     (check_violation, 23514), which the inbox rolls back and retries
//     with a delay like any transient failure, so a duplicate is never
//     claimed a second time.
//   - A row of the outbox the relay has not sent stays in sight of its
//     claim: only rows its position covers are moved, the unsent ones wait
//     for the relay, and at most a batch of them is moved by the ATTACH's
//     transaction, which holds the DEFAULT partition's lock for that.
//     Producers' rows of the range are refused (23514) while it moves;
//     only a range written while the maintenance was hours behind moves.
//     A redrive would not see the sent rows out of sight, and so would
//     not publish them again: it is refused while a move of the outbox
//     is under way (55006, db/migrations/platform/00020), and a batch
//     waits for a redrive in flight, so that it moves only rows the
//     redrive leaves sent.
//   - Writers of other ranges wait at most the lock timeout and a catalog
//     change; no step scans a table under a lock a writer waits for, and
//     no step's length grows with the rows to move but a batch's.
//
// A round also makes again a partition missing between two others (one
// dropped by hand), unless it is past the retention or below the floor
// (below, where claims are refused, a partition would admit again events
// whose claims went with a dropped one), and deletes, a batch a
// transaction, the rows of a DEFAULT partition below the floor, which no
// partition will take: in the outbox only once every row below the floor
// was sent longer than the re-drive window ago.
//
// The inbox may drop a partition because its consumers refuse an event
// older than the retention (inbox.Config.Retention; Table.Retention of
// processed_events adds a margin to it, see InboxTable), and because the
// claim refuses an event older than the oldest partition: partition_create
// and partition_drop keep that floor (partition_floor, in 00014) in the
// transaction that attaches or detaches, so replicas whose retentions
// differ agree on it. The floor rises to the upper bound of the partition
// dropped (00017), not past a gap above it, which may be within the
// retention.
//
// Replicas' rounds may run at once: each step that creates a partition,
// begins a move or drops one takes the table's SHARE UPDATE EXCLUSIVE
// lock first, which no writer takes and which conflicts with itself, so
// one maintainer's step goes at a time and the other's finds the work
// done (00019).
package partition
