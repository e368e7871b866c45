-- +goose Up
-- A statement sent ahead of its transaction's COMMIT, in the same round
-- trip, must fail on the server to stop the COMMIT: a row count the client
-- checks once the answers are in comes after the commit. A set-based write
-- whose rows must all be found selects expect_rows over the rows its
-- data-modifying CTE returned; a shortfall aborts the transaction.
-- +goose StatementBegin
CREATE FUNCTION expect_rows(got bigint, want bigint, what text) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    IF got <> want THEN
        RAISE EXCEPTION '%: % rows affected, % expected', what, got, want
            USING ERRCODE = 'serialization_failure';
    END IF;
END
$$;
-- +goose StatementEnd

-- +goose Down
DROP FUNCTION expect_rows(bigint, bigint, text);
