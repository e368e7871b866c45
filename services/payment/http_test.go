package payment_test

import (
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/internal/httpapi"
	"github.com/onceflow/onceflow/services/payment"
)

func TestCreditIdempotencyKey(t *testing.T) {
	t.Parallel()
	svc := start(t)
	key := http.Header{"Idempotency-Key": {"credit-1"}}

	var first, replay payment.Wallet
	resp := svc.Do(t, http.MethodPost, "/wallets/erin/credits", svc.AsAdmin(t, key), map[string]int64{"amount_cents": 500}, &first)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Empty(t, resp.Header.Get(httpapi.HeaderReplayed))
	require.Equal(t, int64(500), first.BalanceCents)

	resp = svc.Do(t, http.MethodPost, "/wallets/erin/credits", svc.AsAdmin(t, key), map[string]int64{"amount_cents": 500}, &replay)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Equal(t, "true", resp.Header.Get(httpapi.HeaderReplayed))
	require.Equal(t, first, replay)

	resp = svc.Do(t, http.MethodPost, "/wallets/erin/credits", svc.AsAdmin(t, key), map[string]int64{"amount_cents": 501}, nil)
	require.Equal(t, http.StatusUnprocessableEntity, resp.StatusCode)
	require.Equal(t, httpapi.ContentTypeProblem, resp.Header.Get("Content-Type"))

	resp = svc.Do(t, http.MethodPost, "/wallets/frank/credits", svc.AsAdmin(t, key), map[string]int64{"amount_cents": 500}, nil)
	require.Equal(t, http.StatusUnprocessableEntity, resp.StatusCode, "same key, other wallet: a different request")

	require.Equal(t, int64(500), balance(t, svc, "erin"))
	require.Equal(t, int64(0), balance(t, svc, "frank"))
}

func TestConcurrentCreditsWithOneKeyCreditOnce(t *testing.T) {
	t.Parallel()
	svc := start(t)
	key := http.Header{"Idempotency-Key": {"same"}}
	var wg sync.WaitGroup
	statuses := make([]int, 30)
	for i := range statuses {
		wg.Go(func() {
			statuses[i] = svc.Do(t, http.MethodPost, "/wallets/gina/credits", svc.AsAdmin(t, key), map[string]int64{"amount_cents": 70}, nil).StatusCode
		})
	}
	wg.Wait()
	for _, s := range statuses {
		require.Contains(t, []int{http.StatusOK, http.StatusConflict}, s)
	}
	require.Equal(t, int64(70), balance(t, svc, "gina"))
}

func TestBadCreditRequestsWriteNothing(t *testing.T) {
	t.Parallel()
	svc := start(t)
	key := http.Header{"Idempotency-Key": {"k"}}
	tests := []struct {
		name   string
		path   string
		header http.Header
		body   []byte
		want   int
	}{
		{"missing key", "/wallets/hal/credits", nil, []byte(`{"amount_cents":1}`), http.StatusBadRequest},
		{"zero amount", "/wallets/hal/credits", key, []byte(`{"amount_cents":0}`), http.StatusBadRequest},
		{"negative amount", "/wallets/hal/credits", key, []byte(`{"amount_cents":-5}`), http.StatusBadRequest},
		{"huge amount", "/wallets/hal/credits", key, []byte(`{"amount_cents":99999999999999999}`), http.StatusBadRequest},
		{"overflowing number", "/wallets/hal/credits", key, []byte(`{"amount_cents":1e30}`), http.StatusBadRequest},
		{"string amount", "/wallets/hal/credits", key, []byte(`{"amount_cents":"5"}`), http.StatusBadRequest},
		{"unknown field", "/wallets/hal/credits", key, []byte(`{"amount_cents":5,"bonus":1}`), http.StatusBadRequest},
		{"malformed", "/wallets/hal/credits", key, []byte(`{"amount_cents":`), http.StatusBadRequest},
		{"trailing data", "/wallets/hal/credits", key, []byte(`{"amount_cents":5}{}`), http.StatusBadRequest},
		{"empty body", "/wallets/hal/credits", key, []byte(``), http.StatusBadRequest},
		{"oversized", "/wallets/hal/credits", key, []byte(`{"amount_cents":5,"x":"` + strings.Repeat("a", 70<<10) + `"}`), http.StatusRequestEntityTooLarge},
		{"customer id too long", "/wallets/" + strings.Repeat("h", 200) + "/credits", key, []byte(`{"amount_cents":5}`), http.StatusBadRequest},
		{"key too long", "/wallets/hal/credits", http.Header{"Idempotency-Key": {strings.Repeat("k", 300)}}, []byte(`{"amount_cents":5}`), http.StatusBadRequest},
		{"key not ASCII", "/wallets/hal/credits", http.Header{"Idempotency-Key": {"k\xff"}}, []byte(`{"amount_cents":5}`), http.StatusBadRequest},
		// encoding/json took the last duplicate and matched names in any
		// case: these credited 5 and 7.
		{"duplicate key", "/wallets/hal/credits", key, []byte(`{"amount_cents":1,"amount_cents":5}`), http.StatusBadRequest},
		{"case-folded key", "/wallets/hal/credits", key, []byte(`{"AMOUNT_CENTS":7}`), http.StatusBadRequest},
		{"case-folded duplicate", "/wallets/hal/credits", key, []byte(`{"amount_cents":1,"Amount_Cents":5}`), http.StatusBadRequest},
		{"customer id notify cannot address", "/wallets/a%20b/credits", key, []byte(`{"amount_cents":5}`), http.StatusBadRequest},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			resp := svc.Do(t, http.MethodPost, tt.path, svc.AsAdmin(t, tt.header), tt.body, nil)
			require.Equal(t, tt.want, resp.StatusCode)
			require.Equal(t, httpapi.ContentTypeProblem, resp.Header.Get("Content-Type"))
		})
	}
	var wallets, credits, keys int
	require.NoError(t, svc.DB.Pool.QueryRow(t.Context(),
		`SELECT (SELECT count(*) FROM wallets), (SELECT count(*) FROM wallet_credits), (SELECT count(*) FROM idempotency_keys)`).
		Scan(&wallets, &credits, &keys))
	require.Zero(t, wallets+credits+keys, "a refused request writes nothing")
}

func TestOnlyOperatorsCreditAndOwnersRead(t *testing.T) {
	t.Parallel()
	svc := start(t)
	credit(t, svc, "ivy", 300)

	var w payment.Wallet
	resp := svc.Do(t, http.MethodGet, "/wallets/ivy", svc.As(t, "ivy"), nil, &w)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Equal(t, int64(300), w.BalanceCents)

	var p httpapi.Problem
	resp = svc.Do(t, http.MethodGet, "/wallets/ivy", svc.As(t, "mallory"), nil, &p)
	require.Equal(t, http.StatusNotFound, resp.StatusCode, "another customer's wallet does not exist for them")
	for _, who := range []string{"ivy", "mallory"} {
		resp = svc.Do(t, http.MethodPost, "/wallets/"+who+"/credits", svc.As(t, who, http.Header{"Idempotency-Key": {"k-" + who}}),
			map[string]int64{"amount_cents": 100_000_000_00}, &p)
		require.Equal(t, http.StatusForbidden, resp.StatusCode, "%s credits %s", who, who)
		require.Equal(t, httpapi.ContentTypeProblem, resp.Header.Get("Content-Type"))
	}
	require.Equal(t, int64(300), balance(t, svc, "ivy"))
	var keys int
	require.NoError(t, svc.DB.Pool.QueryRow(t.Context(), `SELECT count(*) FROM idempotency_keys`).Scan(&keys))
	require.Equal(t, 1, keys, "only the operator's credit")
}

func TestUnknownWalletHasZeroBalance(t *testing.T) {
	t.Parallel()
	svc := start(t)
	require.Equal(t, int64(0), balance(t, svc, "nobody"))
}

func TestOpenAPIDescribesTheRoutes(t *testing.T) {
	t.Parallel()
	start(t).RequireOpenAPI(t, payment.New(nil).Routes)
}
