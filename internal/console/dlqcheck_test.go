package console_test

import (
	"fmt"
	"testing"

	"github.com/chromedp/chromedp"
	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/internal/dlq/dlqtest"
	"github.com/onceflow/onceflow/internal/event"
	"github.com/onceflow/onceflow/internal/natsauth"
	"github.com/onceflow/onceflow/internal/streams"
)

// The DLQ pages say which entries cannot be trusted: one notify wrote
// naming payment's durable is unreplayable, with no Replay button; one
// whose original the stream never held is unverified, and replays only
// with the force box ticked.
func TestConsoleShowsWhichDeadLettersAreVerified(t *testing.T) {
	// Not parallel: start's databases are named after the process, so two
	// systems at once would share them.
	needsBrowser(t)
	s := start(t)
	ctx := browser(t)

	bob, err := event.New("order", event.OrderPlaced, uuid.NewString(), event.OrderPlacedV1{
		Order:      event.Order{OrderID: uuid.New(), CustomerID: "bob"},
		Lines:      event.Lines{{SKU: "apple", Quantity: 1, UnitPriceCents: 4000}},
		TotalCents: 4000,
	})
	require.NoError(t, err)
	msg, err := bob.Msg()
	require.NoError(t, err)
	nc, err := nats.Connect(s.env.NATSURL, natsauth.Client{Creds: s.env.NATSCreds["notify"]}.Options("notify")...)
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	notify, err := jetstream.New(nc)
	require.NoError(t, err)
	forged := dlqtest.Write(t, notify, streams.NotifyOrders, dlqtest.Headers(msg, streams.Orders, 1, streams.PaymentOrders, "forged"), msg.Data)
	unverified := dlqtest.Write(t, notify, streams.NotifyOrders, dlqtest.Headers(msg, streams.Orders, 1_000_000, streams.NotifyOrders, "gone"), msg.Data)

	admin, err := s.env.Token("ops", true)
	require.NoError(t, err)
	require.NoError(t, chromedp.Do(ctx,
		chromedp.Navigate(s.console+"/login?next=/dlq"),
		chromedp.SendKeys(chromedp.CSS("#token"), admin),
		chromedp.Click(chromedp.CSS("#signin")),
		chromedp.WaitVisible(chromedp.CSS("#dlq"))))
	require.Contains(t, textOf(t, ctx, "#dlq"), "unreplayable")
	require.Contains(t, textOf(t, ctx, "#dlq"), "unverified")

	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(fmt.Sprintf("%s/dlq/%d", s.console, forged))))
	awaitText(t, ctx, "#check", `Not verifiable, and unreplayable: it was written on dlq.notify-orders, but its Onceflow-Dlq-Consumer header names "payment-orders"`)
	buttons, err := chromedp.Run(ctx, chromedp.Evaluate[int](`document.querySelectorAll("#replay").length`))
	require.NoError(t, err)
	require.Zero(t, buttons, "no Replay for an unreplayable entry")

	entryURL := fmt.Sprintf("%s/dlq/%d", s.console, unverified)
	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(entryURL), chromedp.WaitVisible(chromedp.CSS("#check"))))
	require.Contains(t, textOf(t, ctx, "#check"), "Not verifiable: ORDERS sequence 1000000 was never stored")
	require.NoError(t, chromedp.Do(ctx, chromedp.Click(chromedp.CSS("#replay"))))
	awaitText(t, ctx, "#flash", "Refused: not verifiable")
	require.Equal(t, "open", textOf(t, ctx, "#entry-status"))
	require.NoError(t, chromedp.Do(ctx, chromedp.Click(chromedp.CSS("#force")), chromedp.Click(chromedp.CSS("#replay"))))
	awaitText(t, ctx, "#flash", "replayed")
	require.Equal(t, "replayed", textOf(t, ctx, "#entry-status"))
}
