-- The least database work any relay does per turn: mark every pending row
-- of bench.plain_outbox published, in one statement and transaction (run
-- with synchronous_commit = off, as the relay records its batches).  No
-- lease, no claim step, no Kafka: bench/enqueue.sh runs it once per relay
-- turn on average beside the plain INSERTs, for the floor of the
-- relay-running row.
UPDATE bench.plain_outbox
   SET published_at = clock_timestamp(), kafka_partition = 0, kafka_offset = 0,
       attempts = attempts + 1
 WHERE id IN (SELECT id FROM bench.plain_outbox
               WHERE published_at IS NULL ORDER BY seq LIMIT 2000);
