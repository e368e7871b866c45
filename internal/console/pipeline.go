package console

import (
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/labstack/echo/v4"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/onceflow/onceflow/internal/console/internal/platformdb"
)

// outboxLag is one service's unpublished outbox rows.
type outboxLag struct {
	Service string
	Unsent  int64
	Oldest  time.Duration
}

// consumerLag is one durable's state at the broker and its open DLQ entries.
type consumerLag struct {
	Durable, Stream string
	Missing         bool
	Pending         uint64
	AckPending      int
	Redelivered     int
	DLQ             int
}

func (s *Server) pipelinePage(c echo.Context) error {
	data, err := s.pipeline(c)
	if err != nil {
		return err
	}
	return s.render(c, http.StatusOK, "pipeline", data)
}

func (s *Server) pipelineRows(c echo.Context) error {
	data, err := s.pipeline(c)
	if err != nil {
		return err
	}
	return s.renderFragment(c, "pipeline", "rows", data)
}

// pipeline reads one row per service and per durable: bounded whatever
// the load.
func (s *Server) pipeline(c echo.Context) (map[string]any, error) {
	ctx := c.Request().Context()
	var outboxes []outboxLag
	for _, name := range services {
		lag, err := platformdb.New().OutboxLag(ctx, s.pools[name])
		if err != nil {
			return nil, fmt.Errorf("%s outbox: %w", name, err)
		}
		outboxes = append(outboxes, outboxLag{Service: name, Unsent: lag.Unsent, Oldest: time.Duration(lag.OldestAgeSeconds * float64(time.Second)).Round(time.Millisecond)})
	}
	open, err := s.dlq.Counts(ctx)
	if err != nil {
		return nil, err
	}
	var consumers []consumerLag
	for _, spec := range s.topology.Consumers {
		cl := consumerLag{Durable: spec.Durable, Stream: spec.Stream, DLQ: open[spec.Durable]}
		cons, err := s.js.Consumer(ctx, spec.Stream, spec.Durable)
		switch {
		case errors.Is(err, jetstream.ErrConsumerNotFound) || errors.Is(err, jetstream.ErrStreamNotFound):
			cl.Missing = true
		case err != nil:
			return nil, fmt.Errorf("consumer %s: %w", spec.Durable, err)
		default:
			info := cons.CachedInfo()
			cl.Pending, cl.AckPending, cl.Redelivered = info.NumPending, info.NumAckPending, info.NumRedelivered
		}
		consumers = append(consumers, cl)
	}
	return map[string]any{"Outboxes": outboxes, "Consumers": consumers, "At": time.Now().UTC()}, nil
}
