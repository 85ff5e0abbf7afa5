-- The application's transaction beside Debezium (bench/debezium.sh), obx
-- side: an order row, and its event by obx.enqueue.  The payload carries
-- the transaction's id so the harness can look up its commit time
-- (track_commit_timestamp).  TOPIC is replaced by bench/debezium.sh.
\set k random(0, 9999)
\set n random(1, 999999999)
\set t random(100, 99999)
BEGIN;
INSERT INTO bench.orders (order_id, customer_id, total_minor, currency) VALUES ('ord_' || lpad(:n::text, 9, '0'), 'cus_' || lpad(:k::text, 5, '0'), :t, 'USD');
SELECT obx.enqueue('TOPIC', 'cus_' || lpad(:k::text, 5, '0'), ('{"xid": "' || pg_current_xact_id() || '", "note": "xx", "lines": 3, "orderId": "ord_' || lpad(:n::text, 9, '0') || '", "currency": "USD", "eventType": "OrderPlaced", "customerId": "cus_' || lpad(:k::text, 5, '0') || '", "totalMinor": ' || :t || ', "schemaVersion": 1}')::jsonb);
COMMIT;
