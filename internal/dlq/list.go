package dlq

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/onceflow/onceflow/internal/streams"
	"github.com/onceflow/onceflow/internal/streamscan"
)

const (
	defaultLimit = 100
	// maxActions bounds the actions read at once.
	maxActions = 1_000_000
)

// Filter selects entries. Its zero value selects every entry.
type Filter struct {
	Consumer string // the durable that gave up
	Type     string // the event type
	Reason   string // a part of the reason, in any case
	OrderID  string // the event's subject (ce-subject): the order
	// Since and Until bound when the entry was dead-lettered.
	Since, Until time.Time
	Status       Status // "" for any
	// After is the cursor: only entries with a greater id.
	After uint64
	// Limit is the most entries returned (default 100).
	Limit int
}

func (f Filter) match(e Entry) bool {
	switch {
	case f.Type != "" && e.EventType != f.Type,
		f.OrderID != "" && e.OrderID != f.OrderID,
		f.Reason != "" && !strings.Contains(strings.ToLower(e.Reason), strings.ToLower(f.Reason)),
		!f.Until.IsZero() && e.DeadLettered.After(f.Until),
		f.Status != "" && e.Status() != f.Status:
		return false
	}
	return true
}

// Page is a page of entries, in id order. Next is the cursor of the next
// page (Filter.After), zero when there is none.
type Page struct {
	Entries []Entry `json:"entries"`
	Next    uint64  `json:"next,omitempty"`
}

// List returns the entries f selects, headers only, with their actions,
// each checked as Get checks it.
func (s *Store) List(ctx context.Context, f Filter) (Page, error) {
	f.Limit = cmp.Or(f.Limit, defaultLimit)
	st, err := s.js.Stream(ctx, streams.DLQ)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return Page{}, nil
	}
	if err != nil {
		return Page{}, fmt.Errorf("dlq stream: %w", err)
	}
	actions, err := s.actions(ctx, "")
	if err != nil {
		return Page{}, err
	}
	r := streamscan.Range{From: f.After + 1}
	if f.Consumer != "" {
		r.Subject = streams.DLQSubjectPrefix + f.Consumer
	}
	var page Page
	v := s.verifier()
	var checkErr error
	err = streamscan.Scan(ctx, st, r, func(m streamscan.Message) bool {
		e := entryOf(m.Seq, m.At, m.Subject, m.Header)
		e.Actions = actions[m.Seq]
		if !f.Since.IsZero() && e.DeadLettered.Before(f.Since) || !f.match(e) {
			return true
		}
		if len(page.Entries) == f.Limit {
			page.Next = page.Entries[len(page.Entries)-1].ID
			return false
		}
		if _, checkErr = v.check(ctx, &e); checkErr != nil {
			return false
		}
		page.Entries = append(page.Entries, e)
		return true
	})
	if err = errors.Join(err, checkErr); err != nil {
		return Page{}, fmt.Errorf("list the DLQ: %w", err)
	}
	return page, nil
}

// actions reads the recorded actions on subject ("" for all), per entry,
// oldest first.
func (s *Store) actions(ctx context.Context, subject string) (map[uint64][]Action, error) {
	out := make(map[uint64][]Action)
	st, err := s.js.Stream(ctx, streams.DLQActions)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return out, nil
	}
	if err != nil {
		return nil, fmt.Errorf("dlq actions stream: %w", err)
	}
	var n int
	var bad error
	err = streamscan.Scan(ctx, st, streamscan.Range{Subject: subject}, func(m streamscan.Message) bool {
		var a Action
		if err := json.Unmarshal(m.Data, &a); err != nil {
			bad = fmt.Errorf("dlq action %d: %w", m.Seq, err)
			return false
		}
		out[a.Entry] = append(out[a.Entry], a)
		n++
		return n < maxActions
	})
	if err = errors.Join(err, bad); err != nil {
		return nil, fmt.Errorf("read the dlq actions: %w", err)
	}
	return out, nil
}

// Counts returns the open entries per consumer: the entries on its DLQ
// subject, from the stream's state, less those acted on. It reads no entry.
func (s *Store) Counts(ctx context.Context) (map[string]int, error) {
	open := make(map[string]int)
	st, err := s.js.Stream(ctx, streams.DLQ)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return open, nil
	}
	if err != nil {
		return nil, fmt.Errorf("dlq stream: %w", err)
	}
	info, err := st.Info(ctx, jetstream.WithSubjectFilter(streams.DLQSubjectPrefix+">"))
	if err != nil {
		return nil, fmt.Errorf("dlq stream: %w", err)
	}
	for subject, n := range info.State.Subjects {
		open[strings.TrimPrefix(subject, streams.DLQSubjectPrefix)] = int(n)
	}
	actions, err := s.actions(ctx, "")
	if err != nil {
		return nil, err
	}
	for id, as := range actions {
		// An entry the DLQ no longer holds (expired) is not counted.
		if last := as[len(as)-1]; id >= info.State.FirstSeq && last.Kind != Open && open[last.Consumer] > 0 {
			open[last.Consumer]--
		}
	}
	return open, nil
}

// actionsSubject names an entry on the actions stream.
func actionsSubject(id uint64) string {
	return streams.DLQActionsSubjectPrefix + strconv.FormatUint(id, 10)
}
