-- Bulk enqueue, obx side (calls): one transaction of 1,000 obx.enqueue
-- calls, one per row of a batch import.  The rows are the same on every
-- side of bench/bulk.sh: key cus_NNNNN, bench.make_payload (~180 bytes).
\set n random(1, 999000000)
BEGIN;
SELECT count(obx.enqueue('bench.bulk', 'cus_' || lpad((i % 10000)::text, 5, '0'),
                         bench.make_payload(:n + i, (i % 10000)::int)))
  FROM generate_series(1, 1000) i;
COMMIT;
