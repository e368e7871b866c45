// Package idempotency makes a write request safe to retry: the first
// request's response is stored under its Idempotency-Key in the same
// transaction as the write it made, with a fingerprint of the request.
//
// A retry gets the stored response back; the same key with another request is
// refused; a retry that arrives while the first request is still in flight
// waits for it on the key's row lock (up to a bound, then it is told to try
// again). If the first request fails, nothing was stored and a retry runs
// afresh. Keys are deleted after a retention period.
//
// Store.Do claims the key first, then runs the write, which may read (one
// round trip for BEGIN and the claim, one for the queued writes, the stored
// response and COMMIT, and one per read). Store.DoWrites sends the claim
// with the writes, the response and the commit instead, on the bet that the
// key is new: a round trip fewer, and one in all for a write that reads
// nothing. It goes the Do way when the claim finds the key used before.
package idempotency
