// Package event is the contract between onceflow services: the CloudEvents
// envelope every event travels in, the versioned event types with their
// payload structs, and how an envelope maps onto a NATS message.
//
// A change to a payload is a new type version (…v2), never an edit in place:
// events already in streams and outboxes keep their meaning.
//
// Payloads carry what their consumers need (event-carried state transfer), so
// that a consumer never has to ask another service to complete an event.
package event
