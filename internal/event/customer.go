package event

import (
	"fmt"
	"strings"
)

// MaxCustomerIDLength is RFC 5321's limit on an e-mail address's local part.
const MaxCustomerIDLength = 64

// customerIDSymbols are the characters besides letters and digits an
// e-mail local part may have (RFC 5322's atext), less "/" and "%", which a
// URL path segment would have to escape.
const customerIDSymbols = "!#$&'*+-=?^_`{|}~"

// CheckCustomerID is the one rule for a customer id, shared by the HTTP edge
// (a token's subject, a path's customer) and notify, which writes to
// "<customer_id>@example.invalid" when an order has no e-mail address: an
// id is 1 to 64 letters, digits and !#$&'*+-=?^_`{|}~, with single dots
// between them (a dot-atom, RFC 5322), so that it is always a local part
// notify can address.
func CheckCustomerID(id string) error {
	if id == "" || len(id) > MaxCustomerIDLength {
		return fmt.Errorf("customer id must be 1 to %d characters", MaxCustomerIDLength)
	}
	for _, atom := range strings.Split(id, ".") {
		if atom == "" {
			return fmt.Errorf("customer id %q has a dot at its start or end, or two in a row", id)
		}
		for _, r := range atom {
			letter := r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9'
			if !letter && !strings.ContainsRune(customerIDSymbols, r) {
				return fmt.Errorf("customer id %q may have only letters, digits, dots and %s", id, customerIDSymbols)
			}
		}
	}
	return nil
}
