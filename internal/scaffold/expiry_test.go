package scaffold_test

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/internal/cli"
)

// TestAnExpiryConsumerCompensatesOnADurableOfItsOwn generates a participant
// that consumes OrderPlaced and OrderExpired and emits an event of its
// own: OrderExpired gets a durable of its own (refunds-expiries, so that a
// stalled refunds-orders does not hold the compensation up), its handler
// emits nothing (an expiry is undone, not carried forward, docs/saga.md),
// and the generated tests pass, the conformance kit's included. A service
// that would consume only OrderExpired has no forward event to emit for.
func TestAnExpiryConsumerCompensatesOnADurableOfItsOwn(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("-short: vets and tests a copy of the repository (minutes of builds, as the end-to-end's)")
	}
	repo := copyRepo(t)
	out := newService(t, repo, "refunds", "--consumes", "OrderPlaced,OrderExpired", "--emits", "RefundOffered")
	require.Regexp(t, `refunds-orders on ORDERS: +OrderPlaced → HandleOrderPlaced\n`, out)
	require.Regexp(t, `refunds-expiries on ORDERS: +OrderExpired → HandleOrderExpired\n`, out)
	require.Contains(t, out, "one per event consumed but OrderExpired")

	src, err := os.ReadFile(filepath.Join(repo, "services/refunds/refunds.go"))
	require.NoError(t, err)
	_, expired, ok := strings.Cut(string(src), "func (s *Service) HandleOrderExpired(")
	require.True(t, ok, "no HandleOrderExpired in:\n%s", src)
	require.Contains(t, expired, `"expired"`, "the handler says how to compensate")
	require.NotContains(t, expired, "outbox.Enqueue", "an expiry emits no forward event")
	_, placed, _ := strings.Cut(string(src), "func (s *Service) HandleOrderPlaced(")
	require.Contains(t, placed, "outbox.Enqueue", "OrderPlaced still emits RefundOffered")

	goCmd(t, repo, "vet", "-race", "./services/refunds/", "./internal/streams/")
	test := goCmd(t, repo, "test", "-race", "-count=1", "-run", "^(TestOrderExpiredHasOneEffect|TestOrderPlacedHasOneEffect|TestConformance)$", "-v", "./services/refunds/")
	for _, want := range []string{"--- PASS: TestOrderExpiredHasOneEffect", "--- PASS: TestOrderPlacedHasOneEffect", "--- PASS: TestConformance"} {
		require.Contains(t, test, want)
	}

	var stderr bytes.Buffer
	err = cli.Run(t.Context(), []string{"new", "service", "lonely", "--dir", repo, "--consumes", "OrderExpired", "--emits", "Nothing"}, &bytes.Buffer{}, &stderr)
	require.ErrorContains(t, err, "but OrderExpired, which it compensates")
}
