package audit

import (
	"slices"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/internal/event"
	ordersvc "github.com/onceflow/onceflow/services/order"
)

// TestRulesAgreeWithOrderService holds the auditor's copy of the saga's
// rules, kept so that it checks the order service rather than trusts it, to
// the rules the order service applies.
func TestRulesAgreeWithOrderService(t *testing.T) {
	t.Parallel()
	known := []string{orderPending, orderPaid, orderConfirmed, orderRejected, orderCancelled, orderExpired}

	// What the order service writes: PENDING when placed, what the replies
	// move it to, and EXPIRED, which the expirer writes.
	written := []string{ordersvc.StatusPending, ordersvc.StatusExpired}
	for i := 0; i < len(written); i++ {
		for _, typ := range event.Types() {
			if to, ok := ordersvc.NextStatus(written[i], typ); ok && !slices.Contains(written, to) {
				written = append(written, to)
			}
		}
	}
	for _, s := range written {
		require.Contains(t, known, s, "the order service writes a status the auditor does not know")
	}

	var auditTerminal, orderTerminal []string
	for _, s := range known {
		if terminalMail(s) != "" {
			auditTerminal = append(auditTerminal, s)
		}
		if ordersvc.Terminal(s) {
			orderTerminal = append(orderTerminal, s)
		}
	}
	require.Equal(t, orderTerminal, auditTerminal, "terminal statuses")

	for _, s := range orderTerminal {
		for _, typ := range event.Types() {
			require.Equal(t, ordersvc.LateFate(s, typ), lateFate(s, typ), "the fate of a late %s to a %s order", typ, s)
		}
	}
}
