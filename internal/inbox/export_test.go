package inbox

import "github.com/onceflow/onceflow/internal/event"

// SetSkipAck makes c skip the ack of a committed message for which skip
// returns true, as a crash between commit and ack would. Call it before Run.
func (c *Consumer) SetSkipAck(skip func(event.Envelope) bool) { c.skipAck = skip }
