-- The same transaction with a plain INSERT of the same row into
-- bench.plain_outbox (the outbox's columns, defaults and indexes; no obx).
\set k random(0, 9999)
\set n random(1, 999999999)
\set t random(100, 99999)
BEGIN;
INSERT INTO bench.plain_outbox (id, aggregate_id, topic, event_key, payload) VALUES (gen_random_uuid(), 'cus_' || lpad(:k::text, 5, '0'), 'bench.enqueue', 'cus_' || lpad(:k::text, 5, '0'), ('{"note": "xxxxxxxxxxxxxx", "lines": 3, "orderId": "ord_' || lpad(:n::text, 9, '0') || '", "currency": "USD", "eventType": "OrderPlaced", "customerId": "cus_' || lpad(:k::text, 5, '0') || '", "totalMinor": ' || :t || ', "schemaVersion": 1}')::jsonb);
COMMIT;
