package dev

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"time"
)

// newClient returns the HTTP client of readiness probes and seeding. It keeps
// no idle connections, which would outlive Start as goroutines.
func newClient() *http.Client {
	return &http.Client{
		Timeout:   10 * time.Second,
		Transport: &http.Transport{DisableKeepAlives: true},
	}
}

// waitReady polls each service's /readyz until it answers 200, a service
// stops, or timeout passes.
func (e *Env) waitReady(ctx context.Context, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	client := newClient()
	ticker := time.NewTicker(50 * time.Millisecond)
	defer ticker.Stop()
	for _, s := range e.Services {
		url := s.URL + "/readyz"
		for {
			err := probe(ctx, client, url)
			if err == nil {
				break
			}
			select {
			case <-e.done:
				return fmt.Errorf("%s stopped before it was ready: %w", s.Name, e.runErr)
			case <-ctx.Done():
				return fmt.Errorf("%s not ready after %s: %w (last answer: %v)", s.Name, timeout, ctx.Err(), err)
			case <-ticker.C:
			}
		}
	}
	return nil
}

// probe GETs url and reports whether it answered 200.
func probe(ctx context.Context, client *http.Client, url string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: %s", resp.Status, body)
	}
	return nil
}
