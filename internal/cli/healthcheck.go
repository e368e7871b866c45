package cli

import (
	"context"
	"fmt"
	"net/http"
	"time"
)

func runHealthcheck(ctx context.Context, inv invocation, args []string) error {
	fs := flagSet("healthcheck", commandUsage("healthcheck"), `
GETs URL and succeeds only if it answers 2xx within the timeout: the
container healthcheck of an image that has no curl or wget, e.g.

  onceflow healthcheck http://127.0.0.1:8080/readyz`)
	timeout := fs.Duration("timeout", 5*time.Second, "give up after this long")
	if err := parse(fs, args, inv.stdout); err != nil {
		return helped(err)
	}
	if fs.NArg() != 1 {
		return usageError(fs, "want exactly one URL")
	}
	url := fs.Arg(0)

	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return usageError(fs, err.Error())
	}
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := client.Do(req)
	if err != nil {
		return fmt.Errorf("healthcheck: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("healthcheck %s: %s", url, resp.Status)
	}
	return nil
}
