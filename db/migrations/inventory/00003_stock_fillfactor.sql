-- Stock rows are few and hot: every reservation locks its SKUs' rows, then
-- decrements them. Packed full (about 140 rows to a page), every page holds
-- many SKUs, and two transactions that reserve at once (CONSUMER_WORKERS=2,
-- or the compensation subscription beside the reservation one) keep working
-- on the same few pages. Filled to 30 %, the rows spread over three times
-- the pages, and each page keeps room for its rows' new versions. In
-- BenchmarkInventory with two workers this was faster in ten alternating
-- pairs of ten (18,800 → 25,230 events/s in one), with a fifth less CPU
-- per event; with one worker it made no clear difference (docs/performance.md).
--
-- It applies to the pages written from now on: a table stocked before
-- keeps its packed pages until it is rewritten (VACUUM FULL).
-- +goose Up
ALTER TABLE stock SET (fillfactor = 30);

-- +goose Down
ALTER TABLE stock RESET (fillfactor);
