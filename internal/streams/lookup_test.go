package streams_test

import (
	"testing"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/internal/streams"
)

// TestSubjectMatchesAgreesWithNATS holds SubjectMatches to nats-server's own
// matcher, given a filter the server accepts (it refuses the others, which
// SubjectMatches then matches nothing with).
func TestSubjectMatchesAgreesWithNATS(t *testing.T) {
	t.Parallel()
	filters := []string{
		">", "*", "*.*", "*.>", "a", "a.b", "a.*", "a.>", "*.b", "*.b.*", "a.*.c", "a.*.>",
		"a.>.c", ">.a", "a.>.>", "a..b", "", ".a", "a.", "a b", "a.b.c.d", "a.b.c.>",
	}
	subjects := []string{
		"a", "b", "a.b", "a.c", "b.b", "a.b.c", "a.x.c", "a.b.d", "a.b.c.d", "a.b.c.d.e",
		"a.*", "a.>", "*.b", "a.*.c", "a..b", "",
	}
	for _, f := range filters {
		for _, s := range subjects {
			want := server.IsValidSubject(f) && server.SubjectMatchesFilter(s, f)
			require.Equal(t, want, streams.SubjectMatches(f, s), "filter %q, subject %q", f, s)
		}
	}
}

// TestSubjectMatchesRefusesMisplacedWildcard pins what the server's helper
// alone gets wrong: it takes a ">" anywhere as the end of the filter, which
// the server refuses as a subscription or stream filter.
func TestSubjectMatchesRefusesMisplacedWildcard(t *testing.T) {
	t.Parallel()
	require.True(t, server.SubjectMatchesFilter("a.x.c", "a.>.c"))
	require.False(t, server.IsValidSubject("a.>.c"))
	for _, s := range []string{"a.x.c", "a.x", "a.>.c"} {
		require.False(t, streams.SubjectMatches("a.>.c", s), s)
	}
	require.True(t, streams.SubjectMatches("a.>", "a.x.c"))
	require.False(t, streams.SubjectMatches("a.>", "a"), "a > matches one token or more")
}
