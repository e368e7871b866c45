package notify

import (
	"context"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/onceflow/onceflow/services/notify/internal/dbsqlc"
)

// RetryFilter selects the FAILED e-mails that RetryFailed retries.
type RetryFilter struct {
	// OrderID selects one order's e-mails; uuid.Nil selects every order's.
	OrderID uuid.UUID
	// Since selects the e-mails created at or after it; zero selects all.
	Since time.Time
}

// RetryFailed gives the FAILED e-mails that filter selects a new round of
// attempts: they are PENDING again with no attempts, and the mailer sends
// them as new, under their Message-IDs. It returns how many. An e-mail is
// FAILED after MailerConfig.MaxAttempts failed attempts; changing its status
// alone would fail it again at the next attempt.
func RetryFailed(ctx context.Context, pool *pgxpool.Pool, filter RetryFilter) (int64, error) {
	arg := dbsqlc.RetryFailedNotificationsParams{Since: filter.Since}
	if filter.OrderID != uuid.Nil {
		arg.OrderID = pgtype.UUID{Bytes: filter.OrderID, Valid: true}
	}
	n, err := dbsqlc.New().RetryFailedNotifications(ctx, pool, arg)
	if err != nil {
		return 0, fmt.Errorf("retry failed e-mails: %w", err)
	}
	return n, nil
}
