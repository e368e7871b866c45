package audit

import (
	"bufio"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"time"
)

// Names of the checks, in the order of a report.
const (
	CheckDebits        = "debits"
	CheckRefunds       = "refunds"
	CheckMoney         = "money"
	CheckStock         = "stock"
	CheckReservations  = "reservations"
	CheckOrders        = "orders"
	CheckDeadlines     = "deadlines"
	CheckEvents        = "events"
	CheckOutbox        = "outbox"
	CheckConsumers     = "consumers"
	CheckNotifications = "notifications"
)

// maxPrintedViolations is how many violations Print lists per check.
const maxPrintedViolations = 20

// Report is the outcome of an audit.
type Report struct {
	// Waited is how long Run waited for the system to go quiet.
	Waited time.Duration
	// Unquiet says what the system was still doing when the wait ended; it
	// is empty when the system was quiet.
	Unquiet string
	// Checks are the invariants checked, in a fixed order.
	Checks []Check
}

// Check is one invariant: what it is, the figures it was checked on, and
// every violation found.
type Check struct {
	// Name is one of the Check* constants.
	Name string
	// Description states the invariant in one line.
	Description string
	Figures     []Figure
	// Violations name each fact that breaks the invariant; none means it
	// holds.
	Violations []string
}

// Figure is one number (or set of numbers) a check looked at.
type Figure struct {
	Name string
	// Value is an int64, a string, or a map[string]int64 (printed with its
	// keys sorted).
	Value any
}

// OK reports whether every check holds.
func (r Report) OK() bool {
	return r.Violations() == 0
}

// Violations is the number of violations over all checks.
func (r Report) Violations() int {
	n := 0
	for _, c := range r.Checks {
		n += len(c.Violations)
	}
	return n
}

// Failed returns the names of the checks that found violations.
func (r Report) Failed() []string {
	var names []string
	for _, c := range r.Checks {
		if !c.OK() {
			names = append(names, c.Name)
		}
	}
	return names
}

// Find returns the check named name.
func (r Report) Find(name string) (Check, bool) {
	for _, c := range r.Checks {
		if c.Name == name {
			return c, true
		}
	}
	return Check{}, false
}

// OK reports whether the check found no violation.
func (c Check) OK() bool { return len(c.Violations) == 0 }

// Figure returns the value of the figure named name, or nil.
func (c Check) Figure(name string) any {
	for _, f := range c.Figures {
		if f.Name == name {
			return f.Value
		}
	}
	return nil
}

// Print writes the report for a human: each check with its figures and
// violations (at most 20 per check), then a verdict.
func (r Report) Print(w io.Writer) error {
	bw := bufio.NewWriter(w)
	if r.Unquiet == "" {
		fmt.Fprintf(bw, "System quiet after %s.\n\n", r.Waited.Round(time.Millisecond))
	} else {
		fmt.Fprintf(bw, "System NOT quiet after %s: %s.\n\n", r.Waited.Round(time.Millisecond), r.Unquiet)
	}
	for _, c := range r.Checks {
		verdict := "ok  "
		if !c.OK() {
			verdict = "FAIL"
		}
		fmt.Fprintf(bw, "%s  %-13s  %s\n", verdict, c.Name, c.Description)
		for _, f := range c.Figures {
			fmt.Fprintf(bw, "        %s: %s\n", f.Name, formatValue(f.Value))
		}
		for i, v := range c.Violations {
			if i == maxPrintedViolations {
				fmt.Fprintf(bw, "      ✗ … and %d more\n", len(c.Violations)-i)
				break
			}
			fmt.Fprintf(bw, "      ✗ %s\n", v)
		}
	}
	fmt.Fprintf(bw, "\n%s.\n", r.Summary())
	return bw.Flush()
}

// Summary is the verdict in one line: "All 11 checks hold" or, e.g., "3
// violations in 2 of 11 checks (money, orders)".
func (r Report) Summary() string {
	failed := r.Failed()
	if len(failed) == 0 {
		return fmt.Sprintf("All %d checks hold", len(r.Checks))
	}
	return fmt.Sprintf("%s in %d of %d checks (%s)", plural(r.Violations(), "violation"), len(failed), len(r.Checks), strings.Join(failed, ", "))
}

func formatValue(v any) string {
	switch v := v.(type) {
	case map[string]int64:
		if len(v) == 0 {
			return "none"
		}
		parts := make([]string, 0, len(v))
		for _, k := range slices.Sorted(maps.Keys(v)) {
			parts = append(parts, fmt.Sprintf("%s=%d", k, v[k]))
		}
		return strings.Join(parts, " ")
	default:
		return fmt.Sprint(v)
	}
}

// plural is n followed by word, with an s unless n is 1: "1 violation",
// "2 violations".
func plural(n int, word string) string {
	if n == 1 {
		return "1 " + word
	}
	return fmt.Sprintf("%d %ss", n, word)
}
