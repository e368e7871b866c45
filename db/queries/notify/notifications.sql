-- name: InsertNotification :execrows
-- No row is written when the milestone of the order already has its e-mail
-- (UNIQUE (order_id, kind): the same milestone re-emitted under a new event
-- id) or the event already caused one (UNIQUE event_id).
INSERT INTO notifications (order_id, customer_id, kind, recipient, event_id, message_id, subject, body, status, last_error)
VALUES (@order_id, @customer_id, @kind, @recipient, @event_id, @message_id, @subject, @body, @status, @last_error)
ON CONFLICT DO NOTHING;

-- name: InsertNotifications :execrows
-- InsertNotification for a batch, in one statement; the arrays run in
-- parallel. The rows are inserted in array order (WITH ORDINALITY … ORDER
-- BY), so ids are assigned as one InsertNotification per row in that order
-- would, and a row that conflicts with an earlier row of the same statement
-- is skipped like one that conflicts with a committed row: the first wins.
INSERT INTO notifications (order_id, customer_id, kind, recipient, event_id, message_id, subject, body, status, last_error)
SELECT r.order_id, r.customer_id, r.kind, r.recipient, r.event_id, r.message_id, r.subject, r.body, r.status, r.last_error
FROM ROWS FROM (
        unnest(@order_ids::uuid[]), unnest(@customer_ids::text[]), unnest(@kinds::text[]), unnest(@recipients::text[]),
        unnest(@event_ids::uuid[]), unnest(@message_ids::text[]), unnest(@subjects::text[]),
        unnest(@bodies::text[]), unnest(@statuses::text[]), unnest(@last_errors::text[])
    ) WITH ORDINALITY AS r (order_id, customer_id, kind, recipient, event_id, message_id, subject, body, status, last_error, ord)
ORDER BY r.ord
ON CONFLICT DO NOTHING;

-- name: ListNotifications :many
SELECT order_id, customer_id, kind, recipient, status, event_id
FROM notifications
WHERE order_id = @order_id
ORDER BY id;

-- name: ClaimDueNotifications :many
-- The oldest PENDING e-mails whose backoff has passed, at most @max_rows,
-- locked until the claiming transaction ends; rows another mailer holds are
-- skipped, so concurrent mailers claim disjoint batches.
SELECT id, recipient, message_id, subject, body, attempts, created_at
FROM notifications
WHERE status = 'PENDING' AND next_attempt_at <= now()
ORDER BY id
LIMIT @max_rows::integer
FOR UPDATE SKIP LOCKED;

-- name: MarkNotificationsSent :exec
-- clock_timestamp(), not now(): now() is when the claiming transaction began,
-- before the e-mails were handed over.
UPDATE notifications
SET status = 'SENT', sent_at = clock_timestamp(), attempts = attempts + 1, last_error = ''
WHERE id = ANY (@ids::bigint[]);

-- name: MarkNotificationAttemptsFailed :many
-- Records a failed attempt of each of @ids, with its error and backoff: a
-- row stays PENDING until its retry_after has passed, or becomes FAILED when
-- it has had @max_attempts attempts. The arrays run in parallel.
UPDATE notifications AS n
SET attempts        = n.attempts + 1,
    last_error      = f.last_error,
    status          = CASE WHEN n.attempts + 1 >= @max_attempts::integer THEN 'FAILED' ELSE 'PENDING' END,
    next_attempt_at = clock_timestamp() + f.retry_after
FROM ROWS FROM (unnest(@ids::bigint[]), unnest(@last_errors::text[]), unnest(@retry_afters::interval[])) AS f (id, last_error, retry_after)
WHERE n.id = f.id
RETURNING n.id, n.status, n.attempts;

-- name: MailerLag :one
SELECT
    count(*)                                      AS pending,
    coalesce(min(created_at), now())::timestamptz AS oldest_created_at,
    now()::timestamptz                            AS now
FROM notifications
WHERE status = 'PENDING';

-- name: RetryFailedNotifications :execrows
-- Gives FAILED e-mails a new round of attempts, those of @order_id if it is
-- given and those created at or after @since: back to PENDING with no
-- attempts, due now. The Message-ID stays, so that an e-mail that did reach
-- its server before is recognisably the same one.
UPDATE notifications
SET status = 'PENDING', attempts = 0, next_attempt_at = now()
WHERE status = 'FAILED'
  AND (sqlc.narg(order_id)::uuid IS NULL OR order_id = sqlc.narg(order_id)::uuid)
  AND created_at >= @since;
