package main

import (
	"compress/gzip"
	"context"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"mime"
	"net/http"
	"strconv"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
)

// otlpHandler receives OTLP/HTTP: POST /v1/traces, protobuf or JSON,
// gzipped or not, as the OTLP specification has it.
func otlpHandler(st *store, logger *slog.Logger) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/traces", func(w http.ResponseWriter, r *http.Request) {
		body := io.Reader(http.MaxBytesReader(w, r.Body, 16<<20))
		if r.Header.Get("Content-Encoding") == "gzip" {
			zr, err := gzip.NewReader(body)
			if err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			body = zr
		}
		b, err := io.ReadAll(body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		var req coltracepb.ExportTraceServiceRequest
		asJSON := false
		switch ct, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type")); ct {
		case "application/x-protobuf":
			err = proto.Unmarshal(b, &req)
		case "application/json":
			asJSON = true
			err = protojson.Unmarshal(b, &req)
		default:
			http.Error(w, "Content-Type: want application/x-protobuf or application/json", http.StatusUnsupportedMediaType)
			return
		}
		if err != nil {
			logger.Warn("otlp http: undecodable request", "err", err)
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		st.add(spansOf(&req))
		var out []byte
		if asJSON {
			w.Header().Set("Content-Type", "application/json")
			out, _ = protojson.Marshal(&coltracepb.ExportTraceServiceResponse{})
		} else {
			w.Header().Set("Content-Type", "application/x-protobuf")
			out, _ = proto.Marshal(&coltracepb.ExportTraceServiceResponse{})
		}
		_, _ = w.Write(out) // the exporter has gone: nothing to do
	})
	return mux
}

// grpcReceiver receives OTLP over gRPC.
type grpcReceiver struct {
	coltracepb.UnimplementedTraceServiceServer
	st *store
}

func (g grpcReceiver) Export(_ context.Context, req *coltracepb.ExportTraceServiceRequest) (*coltracepb.ExportTraceServiceResponse, error) {
	g.st.add(spansOf(req))
	return &coltracepb.ExportTraceServiceResponse{}, nil
}

// spansOf turns an export's spans into Jaeger's model, each with its
// process (the resource's service.name and attributes).
func spansOf(req *coltracepb.ExportTraceServiceRequest) []span {
	var spans []span
	for _, rs := range req.GetResourceSpans() {
		proc := process{ServiceName: "unknown_service", Tags: []keyValue{}}
		for _, kv := range rs.GetResource().GetAttributes() {
			if kv.GetKey() == "service.name" {
				proc.ServiceName = kv.GetValue().GetStringValue()
				continue
			}
			proc.Tags = append(proc.Tags, tagOf(kv))
		}
		for _, ss := range rs.GetScopeSpans() {
			for _, s := range ss.GetSpans() {
				spans = append(spans, spanOf(s, proc))
			}
		}
	}
	return spans
}

var spanKinds = map[tracepb.Span_SpanKind]string{
	tracepb.Span_SPAN_KIND_INTERNAL: "internal", tracepb.Span_SPAN_KIND_SERVER: "server",
	tracepb.Span_SPAN_KIND_CLIENT: "client", tracepb.Span_SPAN_KIND_PRODUCER: "producer",
	tracepb.Span_SPAN_KIND_CONSUMER: "consumer",
}

func spanOf(s *tracepb.Span, proc process) span {
	sp := span{
		TraceID:       hex.EncodeToString(s.GetTraceId()),
		SpanID:        hex.EncodeToString(s.GetSpanId()),
		OperationName: s.GetName(),
		References:    []reference{},
		StartTime:     int64(s.GetStartTimeUnixNano() / 1000),
		Duration:      int64((s.GetEndTimeUnixNano() - s.GetStartTimeUnixNano()) / 1000),
		Tags:          []keyValue{},
		Logs:          []spanLog{},
		process:       proc,
	}
	if p := s.GetParentSpanId(); len(p) > 0 {
		sp.References = append(sp.References, reference{RefType: "CHILD_OF", TraceID: sp.TraceID, SpanID: hex.EncodeToString(p)})
	}
	for _, l := range s.GetLinks() {
		sp.References = append(sp.References, reference{RefType: "FOLLOWS_FROM", TraceID: hex.EncodeToString(l.GetTraceId()), SpanID: hex.EncodeToString(l.GetSpanId())})
	}
	for _, kv := range s.GetAttributes() {
		sp.Tags = append(sp.Tags, tagOf(kv))
	}
	if k, ok := spanKinds[s.GetKind()]; ok {
		sp.Tags = append(sp.Tags, keyValue{Key: "span.kind", Type: "string", Value: k})
	}
	if s.GetStatus().GetCode() == tracepb.Status_STATUS_CODE_ERROR {
		sp.Tags = append(sp.Tags, keyValue{Key: "error", Type: "bool", Value: true},
			keyValue{Key: "otel.status_description", Type: "string", Value: s.GetStatus().GetMessage()})
	}
	for _, e := range s.GetEvents() {
		l := spanLog{Timestamp: int64(e.GetTimeUnixNano() / 1000), Fields: []keyValue{{Key: "event", Type: "string", Value: e.GetName()}}}
		for _, kv := range e.GetAttributes() {
			l.Fields = append(l.Fields, tagOf(kv))
		}
		sp.Logs = append(sp.Logs, l)
	}
	return sp
}

// tagOf is an attribute as a Jaeger tag; arrays and maps are their JSON.
func tagOf(kv *commonpb.KeyValue) keyValue {
	v := kv.GetValue()
	switch x := v.GetValue().(type) {
	case *commonpb.AnyValue_StringValue:
		return keyValue{Key: kv.GetKey(), Type: "string", Value: x.StringValue}
	case *commonpb.AnyValue_BoolValue:
		return keyValue{Key: kv.GetKey(), Type: "bool", Value: x.BoolValue}
	case *commonpb.AnyValue_IntValue:
		return keyValue{Key: kv.GetKey(), Type: "int64", Value: x.IntValue}
	case *commonpb.AnyValue_DoubleValue:
		return keyValue{Key: kv.GetKey(), Type: "float64", Value: x.DoubleValue}
	case *commonpb.AnyValue_BytesValue:
		return keyValue{Key: kv.GetKey(), Type: "binary", Value: hex.EncodeToString(x.BytesValue)}
	default:
		b, err := protojson.Marshal(v)
		if err != nil {
			return keyValue{Key: kv.GetKey(), Type: "string", Value: fmt.Sprint(v)}
		}
		return keyValue{Key: kv.GetKey(), Type: "string", Value: string(b)}
	}
}

// tagText is a tag's value as the query's tags parameter writes it.
func tagText(kv keyValue) string {
	switch v := kv.Value.(type) {
	case string:
		return v
	case bool:
		return strconv.FormatBool(v)
	case int64:
		return strconv.FormatInt(v, 10)
	case float64:
		return strconv.FormatFloat(v, 'g', -1, 64)
	default:
		return fmt.Sprint(v)
	}
}
