package streams

import "slices"

// Identities besides the services that connect to NATS.
const (
	// Provisioner creates and updates the streams and durables (onceflow
	// provision); it publishes no event.
	Provisioner = "provisioner"
	// Operator reads the streams and consumers (onceflow audit, onceflow
	// dlq), may pause them, replays dead letters on their replay subjects
	// and records what it did with them; it publishes no event of its own
	// and creates, deletes and pulls from no consumer.
	Operator = "operator"
)

// Permissions are the subjects an identity may publish and subscribe to,
// in NATS's subject syntax. Everything else is denied, and so is what
// DenyPublish names even where Publish would allow it.
type Permissions struct {
	Publish   []string
	Subscribe []string
	// DenyPublish carves out of Publish what a wildcard there would cover
	// but the identity may not do: an owner's replay subjects.
	DenyPublish []string
}

// Services returns the services of t, sorted: the owners of its streams and
// the consumers of its durables.
func (t Topology) Services() []string {
	var names []string
	for _, s := range t.Streams {
		names = append(names, s.Owner)
	}
	for _, c := range t.Consumers {
		names = append(names, c.Service)
	}
	slices.Sort(names)
	return slices.DeleteFunc(slices.Compact(names), func(n string) bool { return n == "" })
}

// Identities returns every identity that connects to NATS: the services of
// t, the Provisioner and the Operator.
func (t Topology) Identities() []string {
	return append(t.Services(), Provisioner, Operator)
}

// InboxPrefix is the prefix of identity's reply subjects, where the
// server's answers to its requests come back: of its own, so that no
// identity can read another's answers.
func InboxPrefix(identity string) string { return "_INBOX_" + identity }

// Permissions returns what identity may do on NATS, derived from t: a
// service publishes its own streams' subjects but not their replay
// subjects, and the dead letters of its own durables, and uses the
// JetStream API only to look up, pull from and ack its own durables, and
// subscribes to nothing but its own replies (no advisory: the inbox
// dead-letters a message on a delivery of its own, package inbox); the
// Provisioner creates and updates t's streams and durables and publishes
// nothing else; the Operator reads streams message by message (the
// stream's message get, internal/streamscan) and consumers' info, pauses
// consumers and publishes the replay subjects, but creates no consumer: a
// push consumer's deliveries would reach any subject its creator names,
// past every permission (nats-server checks none). Every
// identity receives replies on its own InboxPrefix. An identity t does
// not know, such as a service that neither publishes nor consumes, may
// only connect.
func (t Topology) Permissions(identity string) Permissions {
	p := Permissions{Subscribe: []string{InboxPrefix(identity) + ".>"}}
	switch identity {
	case Provisioner:
		p.Publish = t.provisionerSubjects()
	case Operator:
		p.Publish = t.operatorSubjects()
	default:
		p.Publish = t.serviceSubjects(identity)
		p.DenyPublish = t.replaySubjectsIn(p.Publish)
	}
	return p
}

// ReplaySubjects are the replay subjects of t's durables (see
// Consumer.Filters): the operator's alone to publish.
func (t Topology) ReplaySubjects() []string {
	var out []string
	for _, c := range t.Consumers {
		for _, f := range c.Filters() {
			if _, _, ok := ReplayOf(f); ok {
				out = append(out, f)
			}
		}
	}
	return out
}

// replaySubjectsIn returns the replay subjects of t that a subject of
// allowed matches: an owner's "orders.>" covers orders.placed.v1's.
func (t Topology) replaySubjectsIn(allowed []string) []string {
	var deny []string
	for _, r := range t.ReplaySubjects() {
		if slices.ContainsFunc(allowed, func(a string) bool { return SubjectMatches(a, r) }) {
			deny = append(deny, r)
		}
	}
	return deny
}

func (t Topology) serviceSubjects(service string) []string {
	// The account info request: jetstream clients ask it to learn that
	// JetStream is there.
	pub := []string{"$JS.API.INFO"}
	for _, s := range t.Streams {
		if s.Owner == service {
			pub = append(pub, s.Subjects...)
		}
	}
	for _, c := range t.Consumers {
		if c.Service != service {
			continue
		}
		pub = append(pub,
			"$JS.API.CONSUMER.INFO."+c.Stream+"."+c.Durable,
			"$JS.API.CONSUMER.MSG.NEXT."+c.Stream+"."+c.Durable,
			// Acks go to the message's reply subject: the server's
			// $JS.ACK.<stream>.<durable>.<counters>, and its v2 form with
			// a domain and an account hash before the stream.
			"$JS.ACK."+c.Stream+"."+c.Durable+".>",
			"$JS.ACK.*.*."+c.Stream+"."+c.Durable+".>",
			DLQSubjectPrefix+c.Durable,
		)
	}
	return pub
}

func (t Topology) provisionerSubjects() []string {
	pub := []string{"$JS.API.INFO"}
	for _, s := range t.AllStreams() {
		pub = append(pub,
			"$JS.API.STREAM.INFO."+s.Name,
			"$JS.API.STREAM.CREATE."+s.Name,
			"$JS.API.STREAM.UPDATE."+s.Name,
		)
	}
	for _, c := range t.Consumers {
		pub = append(pub,
			"$JS.API.CONSUMER.INFO."+c.Stream+"."+c.Durable,
			// With one filter subject, the client names it in the subject.
			"$JS.API.CONSUMER.CREATE."+c.Stream+"."+c.Durable,
			"$JS.API.CONSUMER.CREATE."+c.Stream+"."+c.Durable+".>",
		)
	}
	return pub
}

func (t Topology) operatorSubjects() []string {
	pub := append([]string{"$JS.API.INFO", "$JS.API.STREAM.NAMES", "$JS.API.STREAM.LIST", DLQActionsSubjectPrefix + ">"}, t.ReplaySubjects()...)
	for _, s := range t.AllStreams() {
		pub = append(pub,
			"$JS.API.STREAM.INFO."+s.Name,
			"$JS.API.STREAM.MSG.GET."+s.Name,
			"$JS.API.DIRECT.GET."+s.Name,
			"$JS.API.DIRECT.GET."+s.Name+".>",
			"$JS.API.CONSUMER.INFO."+s.Name+".*",
			"$JS.API.CONSUMER.NAMES."+s.Name,
			"$JS.API.CONSUMER.LIST."+s.Name,
			// Pausing a consumer (and resuming it) stops its deliveries
			// during an incident without losing its position.
			"$JS.API.CONSUMER.PAUSE."+s.Name+".*",
		)
	}
	return pub
}
