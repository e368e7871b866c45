-- name: ListNotifications :many
SELECT order_id, kind, recipient, status, event_id
FROM notifications
WHERE order_id = @order_id
ORDER BY id;
