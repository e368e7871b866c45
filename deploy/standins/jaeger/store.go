package main

import (
	"cmp"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Jaeger's JSON model of a trace, as its query API answers it.
type (
	keyValue struct {
		Key   string `json:"key"`
		Type  string `json:"type"`
		Value any    `json:"value"`
	}
	reference struct {
		RefType string `json:"refType"`
		TraceID string `json:"traceID"`
		SpanID  string `json:"spanID"`
	}
	spanLog struct {
		Timestamp int64      `json:"timestamp"`
		Fields    []keyValue `json:"fields"`
	}
	process struct {
		ServiceName string     `json:"serviceName"`
		Tags        []keyValue `json:"tags"`
	}
	span struct {
		TraceID       string      `json:"traceID"`
		SpanID        string      `json:"spanID"`
		OperationName string      `json:"operationName"`
		References    []reference `json:"references"`
		StartTime     int64       `json:"startTime"` // µs since the epoch
		Duration      int64       `json:"duration"`  // µs
		Tags          []keyValue  `json:"tags"`
		Logs          []spanLog   `json:"logs"`
		ProcessID     string      `json:"processID"`
		Warnings      []string    `json:"warnings"`
		process       process
	}
	trace struct {
		TraceID   string             `json:"traceID"`
		Spans     []span             `json:"spans"`
		Processes map[string]process `json:"processes"`
		Warnings  []string           `json:"warnings"`
	}
)

// store keeps the newest max traces in memory.
type store struct {
	mu     sync.Mutex
	max    int
	traces map[string][]span
	order  []string // trace ids, oldest first
}

func newStore(maxTraces int) *store {
	return &store{max: maxTraces, traces: make(map[string][]span)}
}

func (s *store) add(spans []span) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, sp := range spans {
		if _, ok := s.traces[sp.TraceID]; !ok {
			s.order = append(s.order, sp.TraceID)
		}
		s.traces[sp.TraceID] = append(s.traces[sp.TraceID], sp)
	}
	for len(s.order) > s.max {
		delete(s.traces, s.order[0])
		s.order = s.order[1:]
	}
}

// query is a search of /api/traces.
type query struct {
	service, operation string
	tags               map[string]string
	start, end         int64 // µs; a span must start within
	limit              int
}

// find returns the traces, newest first, with a span of q.service (and
// q.operation) that started within [start, end] and has every tag of q
// (on the span or its process).
func (s *store) find(q query) []trace {
	s.mu.Lock()
	defer s.mu.Unlock()
	found := []trace{}
	for i := len(s.order) - 1; i >= 0 && len(found) < q.limit; i-- {
		spans := s.traces[s.order[i]]
		if slices.ContainsFunc(spans, q.matches) {
			found = append(found, assemble(s.order[i], spans))
		}
	}
	return found
}

func (q query) matches(sp span) bool {
	if sp.process.ServiceName != q.service || (q.operation != "" && sp.OperationName != q.operation) {
		return false
	}
	if sp.StartTime < q.start || sp.StartTime > q.end {
		return false
	}
	for k, v := range q.tags {
		has := func(kv keyValue) bool { return kv.Key == k && tagText(kv) == v }
		if !slices.ContainsFunc(sp.Tags, has) && !slices.ContainsFunc(sp.process.Tags, has) {
			return false
		}
	}
	return true
}

func (s *store) get(id string) (trace, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	spans, ok := s.traces[strings.ToLower(id)]
	if !ok {
		return trace{}, false
	}
	return assemble(strings.ToLower(id), spans), true
}

// assemble is a trace's spans, sorted by start, with their processes
// numbered p1, p2… as Jaeger does.
func assemble(id string, spans []span) trace {
	t := trace{TraceID: id, Spans: slices.Clone(spans), Processes: map[string]process{}}
	ids := map[string]string{}
	for i := range t.Spans {
		key, _ := json.Marshal(t.Spans[i].process)
		pid, ok := ids[string(key)]
		if !ok {
			pid = "p" + strconv.Itoa(len(ids)+1)
			ids[string(key)] = pid
			t.Processes[pid] = t.Spans[i].process
		}
		t.Spans[i].ProcessID = pid
	}
	slices.SortFunc(t.Spans, func(a, b span) int { return cmp.Compare(a.StartTime, b.StartTime) })
	return t
}

func (s *store) services() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	names := []string{}
	for _, spans := range s.traces {
		for _, sp := range spans {
			if !slices.Contains(names, sp.process.ServiceName) {
				names = append(names, sp.process.ServiceName)
			}
		}
	}
	slices.Sort(names)
	return names
}

func (s *store) operations(service string) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	names := []string{}
	for _, spans := range s.traces {
		for _, sp := range spans {
			if sp.process.ServiceName == service && !slices.Contains(names, sp.OperationName) {
				names = append(names, sp.OperationName)
			}
		}
	}
	slices.Sort(names)
	return names
}

// queryHandler answers Jaeger's query API (the one its UI uses).
func queryHandler(st *store) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		fmt.Fprintln(w, "onceflow's stand-in for Jaeger: OTLP in, the query API (/api/services, /api/traces) out, no UI (see docs/compose.md).")
	})
	mux.HandleFunc("GET /api/services", func(w http.ResponseWriter, _ *http.Request) {
		writeData(w, http.StatusOK, st.services())
	})
	mux.HandleFunc("GET /api/services/{service}/operations", func(w http.ResponseWriter, r *http.Request) {
		writeData(w, http.StatusOK, st.operations(r.PathValue("service")))
	})
	mux.HandleFunc("GET /api/traces/{id}", func(w http.ResponseWriter, r *http.Request) {
		t, ok := st.get(r.PathValue("id"))
		if !ok {
			writeError(w, http.StatusNotFound, "trace not found")
			return
		}
		writeData(w, http.StatusOK, []trace{t})
	})
	mux.HandleFunc("GET /api/traces", func(w http.ResponseWriter, r *http.Request) {
		q, err := parseQuery(r, time.Now())
		if err != nil {
			writeError(w, http.StatusBadRequest, err.Error())
			return
		}
		writeData(w, http.StatusOK, st.find(q))
	})
	return mux
}

// parseQuery reads /api/traces's parameters: service (required),
// operation, tags (a JSON object) and tag=key:value, start and end (µs;
// from the first trace kept to now by default), limit (100).
func parseQuery(r *http.Request, now time.Time) (query, error) {
	v := r.URL.Query()
	q := query{service: v.Get("service"), operation: v.Get("operation"), tags: map[string]string{}, end: now.UnixMicro(), limit: 100}
	if q.service == "" {
		return query{}, fmt.Errorf("parameter 'service' is required")
	}
	if s := v.Get("tags"); s != "" {
		if err := json.Unmarshal([]byte(s), &q.tags); err != nil {
			return query{}, fmt.Errorf("malformed 'tags' parameter: %w", err)
		}
	}
	for _, kv := range v["tag"] {
		k, val, ok := strings.Cut(kv, ":")
		if !ok {
			return query{}, fmt.Errorf("malformed 'tag' parameter %q: want key:value", kv)
		}
		q.tags[k] = val
	}
	var err error
	for _, p := range []struct {
		name string
		into *int64
	}{{"start", &q.start}, {"end", &q.end}} {
		if s := v.Get(p.name); s != "" {
			if *p.into, err = strconv.ParseInt(s, 10, 64); err != nil {
				return query{}, fmt.Errorf("parameter %q: %w", p.name, err)
			}
		}
	}
	if s := v.Get("limit"); s != "" {
		if q.limit, err = strconv.Atoi(s); err != nil || q.limit <= 0 {
			return query{}, fmt.Errorf("parameter 'limit' %q: want a positive number", s)
		}
	}
	return q, nil
}

func writeData(w http.ResponseWriter, status int, data any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]any{"data": data, "total": 0, "limit": 0, "offset": 0, "errors": nil})
}

func writeError(w http.ResponseWriter, status int, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]any{"data": nil, "total": 0, "limit": 0, "offset": 0,
		"errors": []map[string]any{{"code": status, "msg": msg}}})
}
