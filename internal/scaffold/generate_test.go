package scaffold_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/internal/scaffold"
)

// TestGenerateRefusesAndChangesNothing tries names and events the generator
// must refuse, each before writing anything.
func TestGenerateRefusesAndChangesNothing(t *testing.T) {
	t.Parallel()
	repo := copyRepo(t)
	before := snapshot(t, repo)
	tests := []struct {
		name     string
		consumes []string
		want     string
	}{
		{"", nil, "a service name is required"},
		{"Loyalty", nil, "want a lowercase Go identifier"},
		{"loyalty_points", nil, "want a lowercase Go identifier"},
		{"2fa", nil, "want a lowercase Go identifier"},
		{"gift-cards", nil, "want a lowercase Go identifier"},
		{"averyveryveryverylongservicename", nil, "longer than 30 characters"},
		{"func", nil, "a Go keyword"},
		{"string", nil, "a predeclared Go identifier"},
		{"payment", nil, `service "payment" exists: services/payment is there`},
		{"notify", nil, `service "notify" exists`},
		{"dev", nil, "taken by a command or by the repository"},
		{"platform", nil, "db/migrations/platform is there"},
		{"postgres", nil, "taken by a command or by the repository"},
		{"event", []string{"OrderConfirmed"}, "taken by the package github.com/onceflow/onceflow/internal/event"},
		{"uuid", []string{"OrderConfirmed"}, "taken by the package github.com/google/uuid"},
		{"loyalty", []string{"OrderShipped"}, `unknown event "OrderShipped" (want one of OrderCancelled, OrderConfirmed,`},
		{"loyalty", []string{"OrderConfirmed", "onceflow.order.confirmed.v1"}, "event OrderConfirmed named twice"},
	}
	for _, tt := range tests {
		_, err := scaffold.Generate(t.Context(), scaffold.Config{Root: repo, Name: tt.name, Consumes: tt.consumes, Reserved: []string{"dev", "new"}})
		require.ErrorContains(t, err, tt.want, "name %q", tt.name)
	}
	_, err := scaffold.Generate(t.Context(), scaffold.Config{Root: t.TempDir(), Name: "loyalty"})
	require.ErrorContains(t, err, "is not the root of the onceflow repository")
	require.Equal(t, before, snapshot(t, repo), "a refused generation changed the repository")
}

// TestGenerateFailingHalfwayChangesNothing fails the generation after each
// of its final moves in turn — the service's three directories, then each
// changed file — and checks that every failure leaves the repository as it
// was; then lets it succeed.
func TestGenerateFailingHalfwayChangesNothing(t *testing.T) {
	t.Parallel()
	repo := copyRepo(t)
	before := snapshot(t, repo)
	cfg := scaffold.Config{Root: repo, Name: "loyalty", Consumes: []string{"OrderConfirmed"}}
	var moves int
	for n := 1; ; n++ {
		failing := cfg
		scaffold.FailAfter(&failing, n)
		_, err := scaffold.Generate(t.Context(), failing)
		if err == nil {
			moves = n - 1
			break
		}
		require.ErrorContains(t, err, "failing on purpose")
		require.Equal(t, before, snapshot(t, repo), "failing after %d moves changed the repository", n)
		require.Less(t, n, 20)
	}
	require.GreaterOrEqual(t, moves, 3+3, "three directories and at least three changed files")

	// The run that was let through is complete.
	after := snapshot(t, repo)
	for _, f := range []string{"services/loyalty/run.go", "services/loyalty/internal/dbsqlc/loyalty.sql.go", "db/migrations/loyalty/00001_loyalty.sql"} {
		require.Contains(t, after, f)
	}
	for _, f := range []string{"sqlc.yaml", "docker-compose.yml", "internal/registry/registry.go"} {
		require.NotEqual(t, before[f], after[f], f)
	}
	_, err := scaffold.Generate(t.Context(), cfg)
	require.ErrorContains(t, err, `service "loyalty" exists`)
}
