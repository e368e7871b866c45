package streams

import "strings"

// Consumer returns the durable named durable of t.
func (t Topology) Consumer(durable string) (Consumer, bool) {
	for _, c := range t.Consumers {
		if c.Durable == durable {
			return c, true
		}
	}
	return Consumer{}, false
}

// Owner returns the service that owns subject: the Owner of the stream of t
// whose subjects match it, or "" when none does.
func (t Topology) Owner(subject string) string {
	for _, s := range t.Streams {
		for _, filter := range s.Subjects {
			if SubjectMatches(filter, subject) {
				return s.Owner
			}
		}
	}
	return ""
}

// SubjectMatches reports whether the literal subject matches filter, in
// NATS's syntax: "*" matches one token, a final ">" one or more.
func SubjectMatches(filter, subject string) bool {
	fs, ss := strings.Split(filter, "."), strings.Split(subject, ".")
	for i, f := range fs {
		switch {
		case f == ">" && i == len(fs)-1:
			return len(ss) > i
		case i >= len(ss):
			return false
		case f != "*" && f != ss[i]:
			return false
		}
	}
	return len(fs) == len(ss)
}
