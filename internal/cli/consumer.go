package cli

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/caarlos0/env/v11"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/onceflow/onceflow/internal/natsauth"
	"github.com/onceflow/onceflow/internal/streams"
)

// consumerEnv is what `onceflow consumer` reads from the environment.
type consumerEnv struct {
	// NATS is reached with the operator's credentials, which may pause and
	// resume the saga's durables (docs/security.md) but not take them.
	NATS natsauth.Client
}

const consumerUsage = "pause DURABLE [--for D] | resume DURABLE"

// defaultPause is how long a pause lasts unless --for says: the server
// resumes the durable then, so a forgotten pause does not stall the saga
// for ever.
const defaultPause = time.Hour

// maxPause bounds --for: a day is time to fix what the pause was for, and
// far past every order's deadline (ORDER_DEADLINE, 15m); a longer pause
// is one that would be forgotten.
const maxPause = 24 * time.Hour

// runConsumer pauses or resumes one of the saga's durables through
// JetStream ($JS.API.CONSUMER.PAUSE): its deliveries stop, its position and
// unacknowledged messages stay, and the orders waiting on it expire at
// their deadlines (docs/saga.md).
func runConsumer(ctx context.Context, inv invocation, args []string) error {
	if len(args) > 0 && slices.Contains([]string{"-h", "-help", "--help"}, args[0]) {
		fmt.Fprintf(inv.stdout, "Usage: onceflow consumer %s\n\n"+
			"Pause a durable of the saga (its deliveries stop until resumed, or\n"+
			"until --for has passed, default %s, at most %s), or resume it.\n"+
			"Run with the operator's credentials (NATS_URL, NATS_CREDS).\n", consumerUsage, defaultPause, maxPause)
		return nil
	}
	if len(args) == 0 || (args[0] != "pause" && args[0] != "resume") {
		return fmt.Errorf("consumer: want 'onceflow consumer %s' (see 'onceflow consumer -h')", consumerUsage)
	}
	verb := args[0]
	fs := flagSet("consumer "+verb, "DURABLE [flags]", "Pause or resume a durable of the saga.")
	pauseFor := fs.Duration("for", defaultPause, "how long the pause lasts at most (at most "+maxPause.String()+")")
	// Flags may come before or after the durable: 'pause -h' asks for help.
	positional, err := parseMixed(fs, args[1:], inv.stdout)
	if err != nil {
		return helped(err)
	}
	switch {
	case len(positional) == 0:
		return usageError(fs, "want the durable to "+verb)
	case len(positional) > 1:
		return usageError(fs, "unexpected arguments after the durable")
	case *pauseFor <= 0 || *pauseFor > maxPause:
		return usageError(fs, fmt.Sprintf("--for must be more than 0 and at most %s", maxPause))
	}
	durable := positional[0]
	consumers := streams.Saga(streams.Config{}).Consumers
	i := slices.IndexFunc(consumers, func(c streams.Consumer) bool { return c.Durable == durable })
	if i < 0 {
		return fmt.Errorf("consumer: %q is not a durable of the saga", durable)
	}
	stream := consumers[i].Stream
	cfg, err := env.ParseAs[consumerEnv]()
	if err != nil {
		return fmt.Errorf("consumer config: %w", err)
	}
	js, closeNATS, err := operatorJetStream(cfg.NATS, "consumer")
	if err != nil {
		return err
	}
	defer closeNATS()
	var resp *jetstream.ConsumerPauseResponse
	if verb == "pause" {
		resp, err = js.PauseConsumer(ctx, stream, durable, time.Now().Add(*pauseFor))
	} else {
		resp, err = js.ResumeConsumer(ctx, stream, durable)
	}
	if err != nil {
		return fmt.Errorf("consumer: %s %s: %w", verb, durable, err)
	}
	switch {
	case verb == "pause" && !resp.Paused:
		return errors.New("consumer: the server did not pause " + durable)
	case resp.Paused:
		fmt.Fprintf(inv.stdout, "%s on %s paused until %s\n", durable, stream, resp.PauseUntil.UTC().Format(time.RFC3339))
	default:
		fmt.Fprintf(inv.stdout, "%s on %s resumed\n", durable, stream)
	}
	return nil
}
