-- name: Partitions :many
-- The partitions of @parent with their bounds, the DEFAULT partition
-- included, in the order of their bounds. The epoch stands for an open
-- bound: the lower bound of a partition FROM (MINVALUE), both bounds of
-- the DEFAULT partition.
SELECT p.name::text AS name,
       coalesce(p.lo, 'epoch')::timestamptz AS lo,
       coalesce(p.hi, 'epoch')::timestamptz AS hi,
       p.is_default::boolean AS is_default
FROM partitions_of(@parent::text) AS p
ORDER BY 3 NULLS LAST;

-- name: CreatePartition :one
-- Adds the partition [@lo, @hi) of @parent, partitioned by @key, moving
-- into it the DEFAULT partition's rows in that range (partition_create in
-- db/migrations/platform/00011). @exclusive locks the table out for
-- writers for the attach: a range where writes may be under way. False: it
-- existed.
SELECT partition_create(@parent::text, @key::text, @lo::timestamptz, @hi::timestamptz, @lock_timeout::text, @exclusive::boolean) AS created;

-- name: DropPartition :one
-- Detaches @part, a partition of @parent, and raises the floor below which
-- a claim is refused when @part was the lowest (partition_drop in 00014);
-- DropDetached drops it. In a READ COMMITTED transaction.
SELECT partition_drop(@parent::text, @part::text, @lock_timeout::text, NULL) AS dropped;

-- name: DropSentPartition :one
-- Detaches @part, a partition of the outbox, unless it holds a row unsent or
-- sent less than @retention ago (outbox_all_sent in 00013), on the database
-- clock, the clock that stamps the relay's positions, so that a skewed
-- application clock cannot shorten the re-drive window. False: it was
-- kept. In a READ COMMITTED transaction.
SELECT partition_drop(@parent::text, @part::text, @lock_timeout::text, now() - @retention::interval) AS dropped;

-- name: DropDetached :one
-- Drops the tables DropPartition and DropSentPartition detached from
-- @parent, each in this statement's transaction, which holds no lock that
-- the table's writers take, waiting for each at most @lock_timeout: one
-- still in use is kept, counted in locked, for a later round
-- (partition_drop_detached in 00015).
SELECT d.dropped::integer AS dropped, d.locked::integer AS locked
FROM partition_drop_detached(@parent::text, @lock_timeout::text) AS d;

-- name: PruneOutboxPositions :execrows
-- Deletes the relay's positions recorded before the one a redrive to
-- @retention ago goes back to (outbox_position_before), but the relay's
-- own (the latest since the latest redrive).
DELETE FROM outbox_batch b
WHERE b.id < (
        SELECT coalesce(max(a.id), 0) FROM outbox_batch a
        WHERE a.id < coalesce((SELECT min(n.id) FROM outbox_batch n WHERE n.recorded_at >= now() - @retention::interval),
                              9223372036854775807))
  AND b.id <> coalesce((SELECT max(c.id) FROM outbox_batch c
                        WHERE c.epoch = (SELECT coalesce(max(r.id), 0) FROM outbox_redrive r)), 0);

-- name: DefaultLarger :one
-- Whether the DEFAULT partition of @parent takes more than @bytes on disk
-- (rows, or the dead tuples of rows moved out): then a partition is made in
-- steps (MoveBegin, MoveBatch, MoveValidate, CreatePartition), so that no
-- ATTACH scans DEFAULT or moves rows under its lock (00017).
SELECT partition_default_larger(@parent::text, @bytes::bigint) AS larger;

-- name: MoveBegin :one
-- Creates the table of the partition [@lo, @hi) of @parent unattached and
-- makes the DEFAULT partition refuse rows of the range (a CHECK NOT VALID,
-- named as the table): partition_move_begin in 00017. False: the partition
-- exists.
SELECT partition_move_begin(@parent::text, @key::text, @lo::timestamptz, @hi::timestamptz, @lock_timeout::text) AS begun;

-- name: MoveBatch :one
-- Moves at most @n rows of [@lo, @hi) from the DEFAULT partition of
-- @parent into the table MoveBegin made, in the outbox (@sent_only) only
-- rows the relay's position covers, in this statement's transaction; and
-- counts the rows of the range left in DEFAULT, up to @n + 1.
SELECT m.moved::integer AS moved, m.left_behind::integer AS left_behind
FROM partition_move_batch(@parent::text, @key::text, @lo::timestamptz, @hi::timestamptz, @n::integer, @sent_only::boolean) AS m;

-- name: MoveValidate :exec
-- Validates the DEFAULT partition's CHECK that MoveBegin added, under a
-- lock no writer waits for, so that the ATTACH of the partition starting
-- at @lo does not scan DEFAULT.
SELECT partition_move_validate(@parent::text, @lo::timestamptz, @lock_timeout::text);

-- name: PartitionFloor :one
-- The floor of @parent (partition_floor, 00014): no partition is made
-- below it, where the claim refuses events. The epoch stands for none.
SELECT greatest(coalesce((SELECT f.lo FROM partition_floor f WHERE f.parent = @parent::text), 'epoch'), 'epoch')::timestamptz AS floor;

-- name: CleanDefault :one
-- Deletes at most @n rows of the DEFAULT partition of @parent below its
-- floor, which no partition will take (partition_clean_default, 00017).
SELECT partition_clean_default(@parent::text, @key::text, @n::integer, NULL)::integer AS deleted;

-- name: CleanSentDefault :one
-- CleanDefault of the outbox, once every row below the floor was sent more
-- than @retention ago (outbox_all_sent), on the database clock.
SELECT partition_clean_default(@parent::text, @key::text, @n::integer, now() - @retention::interval)::integer AS deleted;
