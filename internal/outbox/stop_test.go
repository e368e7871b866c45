package outbox_test

import (
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/internal/event"
	"github.com/onceflow/onceflow/internal/outbox"
	"github.com/onceflow/onceflow/internal/streams"
)

// paddedPayload is a test event's payload made as large as the test needs.
type paddedPayload struct {
	Seq int    `json:"seq"`
	Pad string `json:"pad"`
}

// A row the client refuses to send (an event larger than the server's
// max_payload) stops the relay there: it is neither published nor marked
// sent, and neither is any row behind it, though the batch behind its batch
// was already claimed; Flush returns the error. Once the row is fixed, the
// rows go out, each once and in the aggregate's order.
func TestRelayStopsAtARowItCannotPublish(t *testing.T) {
	t.Parallel()
	for _, atomicMin := range []int{0, 2} {
		t.Run(fmt.Sprint("atomic batch min ", atomicMin), func(t *testing.T) {
			t.Parallel()
			ctx := t.Context()
			f := setup(t)
			f.provision(t, 0)

			// One aggregate, in batches of two: the failing row is the
			// second of the second batch, and the third batch is claimed
			// while the second is published.
			const failing = 3
			evs := orderEvents(t, 8)
			tooLarge := f.nats.Conn(t).MaxPayload()
			var err error
			evs[failing], err = event.New("test", event.OrderPlaced, "order-1",
				paddedPayload{Seq: failing + 1, Pad: strings.Repeat("x", int(tooLarge))})
			require.NoError(t, err)
			enqueue(t, f.db.Pool, evs...)

			r := f.relay(outbox.RelayConfig{BatchSize: 2, AtomicBatchMin: atomicMin, Pipelined: true})
			var (
				mu     sync.Mutex
				failed []error
			)
			outbox.SetBatchDone(r, func(_ int, err error) {
				if err != nil {
					mu.Lock()
					defer mu.Unlock()
					failed = append(failed, err)
				}
			})
			n, err := r.Flush(ctx)
			require.ErrorIs(t, err, nats.ErrMaxPayload)

			// The rows ahead of the failing one may have gone out (a message
			// at a time) or not (the failing row's atomic batch is
			// abandoned); nothing behind it has, and what went out is
			// exactly what is marked sent.
			sent := sentEventIDs(t, f.db)
			require.Len(t, sent, n)
			require.GreaterOrEqual(t, n, 2, "the first batch")
			require.LessOrEqual(t, n, failing, "only rows ahead of the failing one")
			var stored []string
			for _, m := range streamMsgs(t, f.js, streams.Orders) {
				stored = append(stored, m.Header.Get(event.HeaderID))
			}
			require.Equal(t, sent, stored, "published is marked sent")
			requireLag(t, r, int64(len(evs)-n))

			mu.Lock()
			require.Len(t, failed, 2, "the failing batch and the one in flight behind it")
			for _, err := range failed {
				require.ErrorIs(t, err, nats.ErrMaxPayload)
			}
			mu.Unlock()

			// Fixed: an operator shrinks the event.
			tag, err := f.db.Pool.Exec(ctx, `UPDATE outbox SET data = '{"seq":4}' WHERE event_id = $1`, evs[failing].ID)
			require.NoError(t, err)
			require.EqualValues(t, 1, tag.RowsAffected())
			rest, err := r.Flush(ctx)
			require.NoError(t, err)
			require.Equal(t, len(evs), n+rest)
			requireLag(t, r, 0)
			requireStreamHolds(t, f.js, streams.Orders, evs)
		})
	}
}
