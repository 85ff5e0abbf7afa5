-- One application transaction that writes one event into Debezium's
-- outbox (bench.dbz_outbox), with the payload of latency.sql: its
-- transaction id lets the harness look up its commit time.  ROUTE (the
-- aggregatetype, which EventRouter turns into the topic) is replaced by
-- bench/debezium.sh.
\set k random(0, 9999)
\set n random(1, 999999999)
BEGIN;
INSERT INTO bench.dbz_outbox (id, aggregatetype, aggregateid, type, payload) VALUES (gen_random_uuid(), 'ROUTE', 'cus_' || lpad(:k::text, 5, '0'), 'OrderPlaced', ('{"xid": "' || pg_current_xact_id() || '", "note": "xx", "lines": 3, "orderId": "ord_' || lpad(:n::text, 9, '0') || '", "currency": "USD", "eventType": "OrderPlaced", "customerId": "cus_' || lpad(:k::text, 5, '0') || '", "totalMinor": 4200, "schemaVersion": 1}')::jsonb);
COMMIT;
