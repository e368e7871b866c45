-- name: ListNotifications :many
SELECT id, order_id, kind, status, last_error
FROM notifications
ORDER BY order_id, kind, id;

-- name: CountPendingNotifications :one
-- E-mails the mailer has still to send; the auditor waits for none.
SELECT count(*)
FROM notifications
WHERE status = 'PENDING';
