-- Bulk enqueue, obx side (set-based): the same 1,000 rows as
-- bulk_calls.sql in one obx.enqueue_many call, one transaction.
\set n random(1, 999000000)
BEGIN;
SELECT cardinality(obx.enqueue_many('bench.bulk',
           array_agg('cus_' || lpad((i % 10000)::text, 5, '0') ORDER BY i),
           array_agg(bench.make_payload(:n + i, (i % 10000)::int) ORDER BY i)))
  FROM generate_series(1, 1000) i;
COMMIT;
