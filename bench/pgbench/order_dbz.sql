-- The same transaction as order_obx.sql, Debezium side: the order row, and
-- its event as a row of Debezium's outbox (bench.dbz_outbox).  ROUTE (the
-- aggregatetype, which EventRouter turns into the topic) is replaced by
-- bench/debezium.sh.
\set k random(0, 9999)
\set n random(1, 999999999)
\set t random(100, 99999)
BEGIN;
INSERT INTO bench.orders (order_id, customer_id, total_minor, currency) VALUES ('ord_' || lpad(:n::text, 9, '0'), 'cus_' || lpad(:k::text, 5, '0'), :t, 'USD');
INSERT INTO bench.dbz_outbox (id, aggregatetype, aggregateid, type, payload) VALUES (gen_random_uuid(), 'ROUTE', 'cus_' || lpad(:k::text, 5, '0'), 'OrderPlaced', ('{"xid": "' || pg_current_xact_id() || '", "note": "xx", "lines": 3, "orderId": "ord_' || lpad(:n::text, 9, '0') || '", "currency": "USD", "eventType": "OrderPlaced", "customerId": "cus_' || lpad(:k::text, 5, '0') || '", "totalMinor": ' || :t || ', "schemaVersion": 1}')::jsonb);
COMMIT;
