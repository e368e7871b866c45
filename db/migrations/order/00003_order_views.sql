-- +goose Up
-- An order as GET /orders shows it: its row with its items and its timeline
-- as JSON arrays, so that one statement reads an order whole, in one
-- snapshot and one round trip. The JSON keys are those of the API's Item
-- and TimelineEntry (services/order/http.go). A query that filters, sorts
-- and limits the view computes the arrays of the rows it returns only.
CREATE VIEW order_views AS
SELECT
    o.id, o.customer_id, o.customer_email, o.status, o.total_cents, o.created_at, o.updated_at,
    coalesce((
        SELECT json_agg(json_build_object('sku', l.sku, 'quantity', l.quantity, 'unit_price_cents', l.unit_price_cents)
                        ORDER BY l.line_no)
        FROM order_lines l
        WHERE l.order_id = o.id
    ), '[]'::json)::json AS items,
    coalesce((
        SELECT json_agg(json_build_object('type', t.event_type, 'event_id', t.event_id, 'at', t.at)
                        ORDER BY t.at, t.event_id)
        FROM order_timeline t
        WHERE t.order_id = o.id
    ), '[]'::json)::json AS timeline
FROM orders o;

-- +goose Down
DROP VIEW order_views;
