-- Bulk enqueue, baseline: the same 1,000 rows by one INSERT ... SELECT into
-- bench.plain_outbox (the outbox's columns, defaults and indexes; no obx).
-- The ids are time-ordered like obx's (48 bits of Unix milliseconds, then
-- random bits): random ids would spread the primary key's inserts over the
-- whole index and make the baseline slower than the rows need.
\set n random(1, 999000000)
BEGIN;
INSERT INTO bench.plain_outbox (id, aggregate_id, topic, event_key, payload)
SELECT encode(overlay(uuid_send(gen_random_uuid())
                      PLACING substr(int8send((extract(epoch FROM clock_timestamp()) * 1000)::bigint), 3)
                      FROM 1 FOR 6), 'hex')::uuid,
       'cus_' || lpad((i % 10000)::text, 5, '0'), 'bench.bulk',
       'cus_' || lpad((i % 10000)::text, 5, '0'), bench.make_payload(:n + i, (i % 10000)::int)
  FROM generate_series(1, 1000) i;
COMMIT;
