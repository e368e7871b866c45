package outbox

// ListenApplicationName is the application_name of a relay's LISTEN session.
const ListenApplicationName = listenApplicationName

// SetAfterPublish makes r call f after the acks of a batch came back and
// before it marks the rows sent; an error from f rolls the batch back, as if
// the relay had died there. Call it before r is used.
func SetAfterPublish(r *Relay, f func() error) { r.afterPublish = f }

// SetBatchDone makes r call f after every batch with the number of rows it
// marked sent and its error. Call it before r is used.
func SetBatchDone(r *Relay, f func(published int, err error)) { r.batchDone = f }

// NotifyChannel is the relay's side of the outbox trigger's protocol (the
// sleep lock's key is the database's: outbox_sleep_lock_key()).
const NotifyChannel = notifyChannel
