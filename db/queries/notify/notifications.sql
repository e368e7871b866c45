-- name: InsertNotification :execrows
-- No row is written when the milestone of the order already has its e-mail
-- (UNIQUE (order_id, kind): the same milestone re-emitted under a new event
-- id) or the event already caused one (UNIQUE event_id).
INSERT INTO notifications (order_id, kind, recipient, event_id, message_id, subject, body, status, last_error)
VALUES (@order_id, @kind, @recipient, @event_id, @message_id, @subject, @body, @status, @last_error)
ON CONFLICT DO NOTHING;

-- name: ListNotifications :many
SELECT order_id, kind, recipient, status, event_id
FROM notifications
WHERE order_id = @order_id
ORDER BY id;

-- name: ClaimNextDueNotification :one
-- The oldest PENDING e-mail whose backoff has passed, locked until the
-- claiming transaction ends; rows another mailer holds are skipped.
SELECT id, recipient, message_id, subject, body, attempts, created_at
FROM notifications
WHERE status = 'PENDING' AND next_attempt_at <= now()
ORDER BY id
LIMIT 1
FOR UPDATE SKIP LOCKED;

-- name: MarkNotificationSent :exec
-- clock_timestamp(), not now(): now() is when the claiming transaction began,
-- before the e-mail was handed over.
UPDATE notifications
SET status = 'SENT', sent_at = clock_timestamp(), attempts = attempts + 1, last_error = ''
WHERE id = @id;

-- name: MarkNotificationAttemptFailed :one
-- Records a failed attempt: the row stays PENDING until @retry_after has
-- passed, or becomes FAILED when it has had @max_attempts attempts.
UPDATE notifications
SET attempts        = attempts + 1,
    last_error      = @last_error,
    status          = CASE WHEN attempts + 1 >= @max_attempts::integer THEN 'FAILED' ELSE 'PENDING' END,
    next_attempt_at = clock_timestamp() + @retry_after::interval
WHERE id = @id
RETURNING status, attempts;

-- name: MailerLag :one
SELECT
    count(*)                                      AS pending,
    coalesce(min(created_at), now())::timestamptz AS oldest_created_at,
    now()::timestamptz                            AS now
FROM notifications
WHERE status = 'PENDING';
