package inbox

import (
	"fmt"
	"slices"

	"github.com/onceflow/onceflow/internal/event"
	"github.com/onceflow/onceflow/internal/streams"
)

// fromOwner checks d's event against its owner in the topology, the second
// layer behind the NATS permissions (which let a service publish only its
// own streams' subjects): a service can still publish, on its own subjects,
// an event that claims another owner or another type. Such an event is
// dead-lettered with the error as its reason. Without Config.Topology every
// event passes.
func (c *Consumer) fromOwner(d *delivery) error {
	if c.cfg.Topology == nil {
		return nil
	}
	return CheckOwner(*c.cfg.Topology, c.cfg.Durable, d.msg.Subject(), d.ev)
}

// CheckOwner returns why ev, delivered on subject to durable, does not
// belong there, or nil: the subject must be one the durable filters in t
// (its events' subjects and their replay subjects), the subject (or the
// replayed subject) of ev's type, and ev's ce-source the owner of the
// stream that holds it. A replay from the DLQ (package dlq) makes the same
// check before it publishes.
func CheckOwner(t streams.Topology, durable, subject string, ev event.Envelope) error {
	cons, ok := t.Consumer(durable)
	if !ok {
		return fmt.Errorf("owner check: durable %s is not in the topology", durable)
	}
	if !slices.ContainsFunc(cons.Filters(), func(f string) bool { return streams.SubjectMatches(f, subject) }) {
		return fmt.Errorf("owner check: subject %s is not one durable %s filters (%v)", subject, durable, cons.FilterSubjects)
	}
	// A dead letter replayed to this durable (onceflow dlq replay) comes on
	// its original subject's replay subject, which the durable filters too.
	if original, _, ok := streams.ReplayOf(subject); ok {
		subject = original
	}
	want, err := ev.Type.NATSSubject()
	if err != nil {
		return fmt.Errorf("owner check: %w", err)
	}
	if want != subject {
		return fmt.Errorf("owner check: type %s arrived on %s, but is published on %s", ev.Type, subject, want)
	}
	if owner := t.Owner(subject); ev.Source != owner {
		return fmt.Errorf("owner check: ce-source %q is not %q, the owner of %s", ev.Source, owner, ev.Type)
	}
	return nil
}
