package loyalty_test

import (
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/internal/httpapi"
	"github.com/onceflow/onceflow/services/loyalty"
)

func TestUnknownCustomerHasNoEvents(t *testing.T) {
	t.Parallel()
	svc := start(t)
	require.Equal(t, int64(0), customerEvents(t, svc, "nobody"))
}

// A customer's tally is the customer's and an operator's: anyone else gets
// the 404 of a customer that does not exist, and nobody reads it without a
// token.
func TestACustomersEventsAreTheirsToRead(t *testing.T) {
	t.Parallel()
	svc := start(t)
	for _, tc := range []struct {
		name   string
		header http.Header
		want   int
	}{
		{"the customer", svc.As(t, "alice"), http.StatusOK},
		{"an operator", svc.AsAdmin(t), http.StatusOK},
		{"another customer", svc.As(t, "bob"), http.StatusNotFound},
		{"no token", nil, http.StatusUnauthorized},
	} {
		resp := svc.Do(t, http.MethodGet, "/customers/alice", tc.header, nil, nil)
		require.Equal(t, tc.want, resp.StatusCode, tc.name)
	}
}

func TestBadCustomerIDIsAProblem(t *testing.T) {
	t.Parallel()
	svc := start(t)
	for _, path := range []string{"/customers/" + strings.Repeat("c", 129), "/customers/%C3%A9"} {
		resp := svc.Do(t, http.MethodGet, path, svc.AsAdmin(t), nil, nil)
		require.Equal(t, http.StatusBadRequest, resp.StatusCode, path)
		require.Equal(t, httpapi.ContentTypeProblem, resp.Header.Get("Content-Type"), path)
	}
}

func TestOpenAPIDescribesTheRoutes(t *testing.T) {
	t.Parallel()
	start(t).RequireOpenAPI(t, loyalty.New(nil).Routes)
}
