-- One event per transaction for the latency and soak benchmarks.  The
-- payload carries the transaction's id so the harness can look up its
-- commit time (track_commit_timestamp) afterwards.  TOPIC is replaced by
-- bench/run.
\set k random(0, 9999)
\set n random(1, 999999999)
BEGIN;
SELECT obx.enqueue('TOPIC', 'cus_' || lpad(:k::text, 5, '0'), ('{"xid": "' || pg_current_xact_id() || '", "note": "xx", "lines": 3, "orderId": "ord_' || lpad(:n::text, 9, '0') || '", "currency": "USD", "eventType": "OrderPlaced", "customerId": "cus_' || lpad(:k::text, 5, '0') || '", "totalMinor": 4200, "schemaVersion": 1}')::jsonb);
COMMIT;
