-- What the backends of the service databases wait for under load: samples
-- pg_stat_activity about every millisecond, 6,000 times, then counts the
-- samples of each backend that ran the relay's claim by state, wait event
-- and the statement it was on. Run it with psql on the cluster of a running
-- `onceflow dev` while loadgen drives it, e.g.
--
--   psql -h 127.0.0.1 -p 15432 -U postgres -d postgres -f bench/waits.sql
--
-- The loop takes most of a core: it tells where a backend's time goes, not
-- how fast a build is.
create temp table s(t timestamptz, pid int, datname text, state text, wet text, we text, q text);
do $$ begin for i in 1..6000 loop perform pg_stat_clear_snapshot(); insert into s select clock_timestamp(), pid, datname, state, wait_event_type, wait_event, left(regexp_replace(query, '\s+', ' ', 'g'),30) from pg_stat_activity where datname like 'onceflow_%' and backend_type='client backend'; perform pg_sleep(0.001); end loop; end $$;
with relay as (select pid, datname from s where q ~ 'name: Claim(Unsent)? :many' group by 1,2)
select s.datname, s.state, coalesce(s.wet,'-')||':'||coalesce(s.we,'-') w, left(s.q,30) q, count(*) from s join relay using (pid, datname) group by 1,2,3,4 order by 1, 5 desc;
