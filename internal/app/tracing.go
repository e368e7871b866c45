package app

import (
	"cmp"
	"context"
	"fmt"
	"strings"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
)

// TracingConfig is the part of the standard OpenTelemetry environment that
// decides whether and how a service exports spans. Tracing is off unless
// OTEL_TRACES_EXPORTER or an OTLP endpoint is set. The exporter reads the
// rest of the OTEL_EXPORTER_OTLP_* variables (headers, timeout, TLS), the
// SDK OTEL_TRACES_SAMPLER and the resource OTEL_SERVICE_NAME and
// OTEL_RESOURCE_ATTRIBUTES itself, as the OpenTelemetry specification says.
type TracingConfig struct {
	// Exporter is "otlp" or "none"; empty means otlp when an endpoint is
	// set and none otherwise.
	Exporter       string `env:"OTEL_TRACES_EXPORTER"`
	Endpoint       string `env:"OTEL_EXPORTER_OTLP_ENDPOINT"`
	TracesEndpoint string `env:"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"`
	// Protocol is "http/protobuf" (the default) or "grpc".
	Protocol       string `env:"OTEL_EXPORTER_OTLP_PROTOCOL"`
	TracesProtocol string `env:"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"`
}

// newTracerProvider returns the tracer provider cfg asks for, named after
// service unless OTEL_SERVICE_NAME says otherwise, and its shutdown, which
// flushes the spans not yet exported. With tracing off it is a no-op
// provider that records nothing (trace context is still propagated).
func newTracerProvider(ctx context.Context, cfg TracingConfig, service string) (trace.TracerProvider, func(context.Context) error, error) {
	exporter := strings.ToLower(cfg.Exporter)
	if exporter == "" && (cfg.Endpoint != "" || cfg.TracesEndpoint != "") {
		exporter = "otlp"
	}
	noShutdown := func(context.Context) error { return nil }
	switch exporter {
	case "", "none":
		return noop.NewTracerProvider(), noShutdown, nil
	case "otlp":
	default:
		return nil, nil, fmt.Errorf("OTEL_TRACES_EXPORTER %q: want otlp or none", cfg.Exporter)
	}

	var (
		exp sdktrace.SpanExporter
		err error
	)
	// Both exporters read their endpoint, headers and the like from the
	// OTEL_EXPORTER_OTLP_* variables.
	switch protocol := cmp.Or(cfg.TracesProtocol, cfg.Protocol, "http/protobuf"); protocol {
	case "http/protobuf":
		exp, err = otlptracehttp.New(ctx)
	case "grpc":
		exp, err = otlptracegrpc.New(ctx)
	default:
		return nil, nil, fmt.Errorf("OTEL_EXPORTER_OTLP_PROTOCOL %q: want http/protobuf or grpc", protocol)
	}
	if err != nil {
		return nil, nil, fmt.Errorf("otlp trace exporter: %w", err)
	}
	// Later options win: OTEL_SERVICE_NAME overrides the service's name.
	res, err := resource.New(ctx,
		resource.WithTelemetrySDK(),
		resource.WithAttributes(attribute.String("service.name", "onceflow-"+service)),
		resource.WithFromEnv(),
	)
	if err != nil {
		return nil, nil, fmt.Errorf("trace resource: %w", err)
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))
	return tp, tp.Shutdown, nil
}
