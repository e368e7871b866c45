package event_test

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/internal/event"
)

func TestCheckCustomerID(t *testing.T) {
	t.Parallel()
	for _, ok := range []string{"alice", "lg-abc-c001", "a.b", "auth0|5f7c", "x+tag", strings.Repeat("c", 64), "0f8fad5b-d9cb-469f-a165-70867728950e"} {
		require.NoError(t, event.CheckCustomerID(ok), ok)
	}
	for _, bad := range []string{"", strings.Repeat("c", 65), "a b", ".a", "a.", "a..b", "a/b", "a%2F", "a@b", "é", "a\x00", "a,b", `a"b`} {
		require.Error(t, event.CheckCustomerID(bad), bad)
	}
}
