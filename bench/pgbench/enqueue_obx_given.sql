-- enqueue_obx.sql with the event id given, as an idempotent business action gives it.
\set k random(0, 9999)
\set n random(1, 999999999)
\set t random(100, 99999)
BEGIN;
SELECT obx.enqueue('bench.enqueue', 'cus_' || lpad(:k::text, 5, '0'), ('{"note": "xxxxxxxxxxxxxx", "lines": 3, "orderId": "ord_' || lpad(:n::text, 9, '0') || '", "currency": "USD", "eventType": "OrderPlaced", "customerId": "cus_' || lpad(:k::text, 5, '0') || '", "totalMinor": ' || :t || ', "schemaVersion": 1}')::jsonb, event_id => gen_random_uuid());
COMMIT;
