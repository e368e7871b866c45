// Package loadgen drives a running onceflow deployment over its HTTP APIs
// and measures it end to end: `onceflow loadgen`.
//
// Run seeds customers (wallet credits) and SKUs (stock) of its own, named
// after the run, so that runs never share state and outcomes are mixed: a
// few customers can afford only a few orders (REJECTED once their money is
// gone) and a few SKUs are scarce (CANCELLED, with a refund, once sold
// out). It then places orders at a target rate, or as fast as a number of
// concurrent clients can, each with an Idempotency-Key that every retry
// (after an error, a time-out or a 5xx, waiting as long as a Retry-After
// asks) reuses, so that a retry never places a second order. It follows
// every order to its terminal state by listing each customer's recent
// orders in one request, at most once per poll interval and not before its
// oldest unfinished order is an interval old; the customers' polls are
// spread over the interval, so the order service sees an even stream of
// reads rather than a burst that would stall the saga it measures. It
// measures latency from the order's timeline: the time of its OrderPlaced
// event to the time of its terminal event, both taken by the order
// service's clock when it wrote them. Client-side observation would add the
// poll interval to every figure.
//
// Everything it sends goes to the base URLs it is given; it touches no
// database and no broker.
package loadgen
