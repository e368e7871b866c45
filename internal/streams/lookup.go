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

// SubjectMatches reports whether subject matches filter the way nats-server
// matches them (its SubjectMatchesFilter): "*" matches one token, ">" one or
// more, and a subject with wildcards matches when every subject it matches
// does. A filter nats-server would refuse (an empty token, ">" before the
// last token, white space) matches nothing rather than something.
func SubjectMatches(filter, subject string) bool {
	if !validFilter(filter) {
		return false
	}
	fs, ss := strings.Split(filter, "."), strings.Split(subject, ".")
	for i, f := range fs {
		if f == ">" {
			return len(ss) > i
		}
		// A "*" in subject is matched only by a "*" in filter.
		if i >= len(ss) || ss[i] == "" || ss[i] == ">" || f != "*" && f != ss[i] {
			return false
		}
	}
	return len(fs) == len(ss)
}

// validFilter reports whether nats-server accepts filter as a subject to
// subscribe or filter on.
func validFilter(filter string) bool {
	fs := strings.Split(filter, ".")
	for i, f := range fs {
		if f == "" || f == ">" && i != len(fs)-1 || strings.ContainsAny(f, "\t\n\f\r ") {
			return false
		}
	}
	return true
}
